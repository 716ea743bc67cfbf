"""The run's configuration, parsed from the public contracts (``model.json``, ``strategy.json``,
``training.json``, ``plan.json``) plus runtime knobs.

``model.json`` is read by the planner's own parser (:class:`workers.planner.specs.ModelSpec`), so a model
the planner costs is the model the runtime trains: same fields, same defaults, same rules; the runtime
only adds what it needs on top (:func:`parse_model`). ``strategy.json``/``training.json`` keep runtime
classes here because their defaults differ on purpose (fp32 on CPU, one rank unless told). Every
validation error is a :class:`ConfigError` naming the offending field, so the CLI can print it and exit 2.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from workers.planner.specs import ModelSpec, MoESpec, SpecError

# The runtime's names for the planner's model classes (the runtime adds checks, not fields).
ModelConfig = ModelSpec
MoEConfig = MoESpec


class ConfigError(SpecError):
    """Invalid input; ``field`` names the (first) offending contract field (``strategy.tp``,
    ``model.moe.top_k``), ``errors`` all of them. ``ConfigError("strategy.tp", "must divide ...")``."""


def _int(d: dict, key: str, prefix: str, *, minimum: int = 1, default: Any = ...) -> int:
    if key not in d or d[key] is None:
        if default is ...:
            raise ConfigError(f"{prefix}.{key}", "is required")
        return default
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ConfigError(f"{prefix}.{key}", f"must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{prefix}.{key}", f"must be >= {minimum}, got {value}")
    return int(value)


def _float(d: dict, key: str, prefix: str, default: float) -> float:
    value = d.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{prefix}.{key}", f"must be a number, got {value!r}")
    return float(value)


def _choice(d: dict, key: str, prefix: str, choices: tuple[str, ...], default: str) -> str:
    value = d.get(key, default)
    if value is None:
        value = default
    if value not in choices:
        raise ConfigError(f"{prefix}.{key}", f"must be one of {'|'.join(choices)}, got {value!r}")
    return value


def parse_model(d: Any) -> ModelSpec:
    """``model.json`` as the planner reads it, plus what this runtime needs: an even head dimension
    (rotary embeddings), at least 256 tokens of vocabulary (byte-level data), 2+ tokens a sequence and
    separate input/output embeddings. MoE routing is dropless: ``capacity_factor`` and ``load_imbalance``
    are planner figures; the runtime measures the real imbalance (``expert_load``)."""
    if not isinstance(d, dict):
        raise ConfigError("model", f"must be a JSON object, got {type(d).__name__}")
    try:
        m = ModelSpec.from_dict(d)
    except SpecError as exc:
        raise ConfigError(exc.prefixed("model").errors) from None
    if m.head_dim % 2:
        raise ConfigError("model.hidden_size", "hidden_size / num_attention_heads must be even (rotary)")
    if m.vocab_size < 256:
        raise ConfigError("model.vocab_size", f"must be >= 256 for byte-level tokens, got {m.vocab_size}")
    if m.seq_length < 2:
        raise ConfigError("model.seq_length", f"must be >= 2 (next-token targets), got {m.seq_length}")
    if m.tied_embeddings:
        raise ConfigError(
            "model.tied_embeddings",
            "the training runtime keeps separate input and output embeddings (set false or leave it out)",
        )
    return m


@dataclass(frozen=True)
class ParallelConfig:
    """``strategy.json``: one point of the search space. ``tp*pp*dp*cp`` = world size."""

    tp: int = 1
    """Tensor-parallel degree: DTensor ``ColwiseParallel``/``RowwiseParallel`` on attention and MLP."""
    pp: int = 1
    """Pipeline stages: ``torch.distributed.pipelining`` (1F1B, or interleaved 1F1B when ``vpp > 1``)."""
    dp: int = 1
    """Data-parallel degree: DDP (``zero_stage`` 0) or FSDP2 ``fully_shard`` (``zero_stage`` 1-3)."""
    ep: int = 1
    """Expert-parallel degree: experts sharded over ``ep`` data-parallel ranks, all-to-all dispatch."""
    cp: int = 1
    """Context-parallel degree: each sequence split over ``cp`` ranks in ``2*cp`` load-balanced chunks,
    keys/values all-gathered for attention (Llama 3's all-gather context parallelism)."""
    vpp: int = 1
    """Virtual pipeline stages per rank (interleaved 1F1B)."""
    micro_batch_size: int = 1
    """Sequences per micro-batch; ``global_batch_size / (dp * micro_batch_size)`` micro-batches a step."""
    recompute: str = "none"
    """Activation checkpointing: ``none``, ``selective`` (attention core recomputed), ``full`` (per block)."""
    zero_stage: int = 0
    """0 = DDP; 1/2 = FSDP2 without resharding after forward; 3 = FSDP2 resharding after forward."""
    sequence_parallel: bool = False
    """With ``tp > 1``: norms and residual stream sharded on the sequence dimension (``SequenceParallel``)."""

    @classmethod
    def from_dict(cls, d: dict) -> ParallelConfig:
        if not isinstance(d, dict):
            raise ConfigError("strategy", "must be a JSON object")
        p = "strategy"
        sp = d.get("sequence_parallel", False)
        if not isinstance(sp, bool):
            raise ConfigError(f"{p}.sequence_parallel", f"must be true or false, got {sp!r}")
        zero = _int(d, "zero_stage", p, minimum=0, default=0)
        if zero > 3:
            raise ConfigError(f"{p}.zero_stage", f"must be 0-3, got {zero}")
        cfg = cls(
            tp=_int(d, "tp", p, default=1),
            pp=_int(d, "pp", p, default=1),
            dp=_int(d, "dp", p, default=1),
            ep=_int(d, "ep", p, default=1),
            cp=_int(d, "cp", p, default=1),
            vpp=_int(d, "vpp", p, default=1),
            micro_batch_size=_int(d, "micro_batch_size", p, default=1),
            recompute=_choice(d, "recompute", p, ("none", "selective", "full"), "none"),
            zero_stage=zero,
            sequence_parallel=sp,
        )
        if (cfg.dp * cfg.cp) % cfg.ep:
            raise ConfigError(f"{p}.ep", f"must divide dp*cp ({cfg.dp * cfg.cp}), got {cfg.ep}")
        if cfg.vpp > 1 and cfg.pp == 1:
            raise ConfigError(f"{p}.vpp", "virtual pipeline stages need pp > 1")
        return cfg

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def short(self) -> str:
        extra = []
        if self.zero_stage:
            extra.append(f"zero{self.zero_stage}")
        if self.sequence_parallel and self.tp > 1:
            extra.append("sp")
        if self.recompute != "none":
            extra.append(f"ac-{self.recompute}")
        degrees = (
            f"tp{self.tp}-pp{self.pp}-dp{self.dp}-ep{self.ep}"
            + (f"-cp{self.cp}" if self.cp > 1 else "")
            + (f"-vpp{self.vpp}" if self.vpp > 1 else "")
        )
        return "-".join([degrees, *extra])


@dataclass(frozen=True)
class TrainingSpec:
    """``training.json``."""

    global_batch_size: int = 8
    """Sequences per optimizer step, across all data-parallel ranks."""
    dtype: str = "fp32"
    """Compute dtype (``fp32``, ``bf16`` or ``fp16`` autocast; master weights stay fp32)."""
    optimizer: str = "adamw"
    """``adam``/``adamw`` (torch.optim.AdamW) or ``sgd``."""

    @classmethod
    def from_dict(cls, d: dict | None) -> TrainingSpec:
        d = d or {}
        if not isinstance(d, dict):
            raise ConfigError("training", "must be a JSON object")
        p = "training"
        return cls(
            global_batch_size=_int(d, "global_batch_size", p, default=8),
            dtype=_choice(d, "dtype", p, ("fp32", "bf16", "fp16"), "fp32"),
            optimizer=_choice(d, "optimizer", p, ("adam", "adamw", "sgd"), "adamw"),
        )


@dataclass
class JobConfig:
    """Everything one training run needs. Serialised to JSON for ``python -m workers.training.run``."""

    model: ModelConfig
    strategy: ParallelConfig = field(default_factory=ParallelConfig)
    training: TrainingSpec = field(default_factory=TrainingSpec)
    steps: int = 10
    """Optimizer steps to run (counted from ``start_step`` on resume)."""
    lr: float = 3e-3
    """Peak learning rate (linear warmup then cosine decay to 10%)."""
    warmup_steps: int = 2
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Clip the global gradient norm (0 disables clipping; the norm is reported either way)."""
    seed: int = 0
    """Seeds parameter init (identical on every rank) and the data order."""
    data: str | None = None
    """Token source: ``None`` = this interpreter's standard-library sources as bytes; else a file or a
    directory of files (raw bytes are byte tokens, ``.npy`` holds token ids)."""
    device: str = "auto"
    """``auto|cpu|cuda|npu`` (``CANN_TRAIN_DEVICE`` overrides ``auto``)."""
    job_id: str | None = None
    """Publishes events to Redis stream ``job/<job_id>`` (with ``redis_url``); none = no publishing."""
    redis_url: str | None = None
    comm_hook: str | None = None
    """DDP communication hook, ``name[:key=value,...]`` from ``workers.training.comm.HOOKS`` (zero_stage 0
    only), e.g. ``"topk_ef:density=0.01"``; registered on the data-parallel group."""
    bucket_cap_mb: float | None = None
    """DDP gradient bucket size in MB. ``None``: chosen from ``inter_node_GBps``/``inter_node_latency_us``
    by ``choose_bucket_cap_mb`` when those are given, else DDP's default (25 MB)."""
    inter_node_GBps: float | None = None
    """The job's inter-node bandwidth, GB/s per device per direction (cluster.json units); sizes buckets."""
    inter_node_latency_us: float = 0.0
    """The job's inter-node latency in microseconds; sizes buckets."""
    expert_bias_update_rate: float = 1e-3
    """Auxiliary-loss-free balancing step (DeepSeek-V3, Liu et al. 2024, sec. 2.1.2: gamma)."""
    profile_every: int = 0
    """Measure compute vs communication with the torch profiler every N steps (0: never)."""
    start_step: int = 0
    """Resume point: optimizer steps already taken (the data position follows from it)."""
    publish: bool = True
    """With a job id and redis url: publish events (the overhead bench turns it off to compare)."""
    peak_tflops: float | None = None
    """Per-device peak (for ``mfu``); unknown on cpu."""

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def local_batch_size(self) -> int:
        return self.training.global_batch_size // self.strategy.dp

    @property
    def num_microbatches(self) -> int:
        return self.local_batch_size // self.strategy.micro_batch_size

    def validate(self) -> JobConfig:
        s, m = self.strategy, self.model
        gbs = self.training.global_batch_size
        if gbs % (s.dp * s.micro_batch_size):
            raise ConfigError(
                "training.global_batch_size",
                f"must be divisible by dp*micro_batch_size ({s.dp}*{s.micro_batch_size}), got {gbs}",
            )
        if s.tp > 1:
            if m.num_attention_heads % s.tp or m.num_kv_heads % s.tp:
                raise ConfigError(
                    "strategy.tp", f"must divide num_attention_heads and num_kv_heads, got {s.tp}"
                )
            if m.ffn_hidden_size % s.tp:
                raise ConfigError("strategy.tp", f"must divide ffn_hidden_size ({m.ffn_hidden_size})")
            if s.sequence_parallel and m.seq_length % s.tp:
                raise ConfigError(
                    "strategy.sequence_parallel", f"seq_length must be divisible by tp ({s.tp})"
                )
        if s.cp > 1:
            if m.seq_length % (2 * s.cp):
                raise ConfigError(
                    "strategy.cp",
                    f"2*cp ({2 * s.cp}) must divide seq_length ({m.seq_length}): load-balanced chunks",
                )
            if s.sequence_parallel and s.tp > 1 and (m.seq_length // s.cp) % s.tp:
                raise ConfigError(
                    "strategy.sequence_parallel",
                    f"seq_length / cp ({m.seq_length // s.cp}) must be divisible by tp ({s.tp})",
                )
        if s.pp * s.vpp > m.num_layers:
            raise ConfigError("strategy.pp", f"pp*vpp ({s.pp * s.vpp}) exceeds num_layers ({m.num_layers})")
        if s.pp > 1 and self.num_microbatches < s.pp:
            raise ConfigError(
                "strategy.micro_batch_size",
                f"pipeline needs at least pp ({s.pp}) micro-batches per step, "
                f"got {self.num_microbatches} (global_batch_size/(dp*micro_batch_size))",
            )
        if s.ep > 1:
            if m.moe is None:
                raise ConfigError("strategy.ep", "expert parallelism needs an MoE model (model.moe)")
            if m.moe.num_experts % s.ep:
                raise ConfigError("strategy.ep", f"must divide model.moe.num_experts ({m.moe.num_experts})")
        if self.steps < 1:
            raise ConfigError("steps", "must be >= 1")
        if self.comm_hook and s.zero_stage != 0:
            raise ConfigError("comm_hook", "DDP communication hooks apply to zero_stage 0 only")
        if self.bucket_cap_mb is not None and self.bucket_cap_mb <= 0:
            raise ConfigError("bucket_cap_mb", f"must be > 0, got {self.bucket_cap_mb}")
        if self.inter_node_GBps is not None and self.inter_node_GBps <= 0:
            raise ConfigError("inter_node_GBps", f"must be > 0, got {self.inter_node_GBps}")
        if self.inter_node_latency_us < 0:
            raise ConfigError("inter_node_latency_us", f"must be >= 0, got {self.inter_node_latency_us}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobConfig:
        if not isinstance(d, dict):
            raise ConfigError("config", "must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(sorted(unknown)[0], f"unknown field (known: {', '.join(sorted(known))})")
        if "model" not in d:
            raise ConfigError("model", "is required")
        kwargs = dict(d)
        kwargs["model"] = parse_model(d["model"])
        kwargs["strategy"] = ParallelConfig.from_dict(d.get("strategy") or {})
        kwargs["training"] = TrainingSpec.from_dict(d.get("training"))
        for name in ("lr", "weight_decay", "grad_clip", "expert_bias_update_rate", "inter_node_latency_us"):
            if name in kwargs:
                kwargs[name] = _float(kwargs, name, "config", 0.0)
        for name in ("bucket_cap_mb", "inter_node_GBps"):
            if kwargs.get(name) is not None:
                kwargs[name] = _float(kwargs, name, "config", 0.0)
        if kwargs.get("comm_hook") is not None:
            _check_comm_hook(str(kwargs["comm_hook"]))
        for name in ("steps", "seed", "profile_every", "start_step", "warmup_steps"):
            if name in kwargs:
                kwargs[name] = _int(kwargs, name, "config", minimum=0)
        if kwargs.get("job_id") is not None:
            kwargs["job_id"] = str(kwargs["job_id"])
            if not kwargs["job_id"].isdigit():
                raise ConfigError("job_id", f"must be a number (stream job/<id>), got {kwargs['job_id']!r}")
        return cls(**kwargs).validate()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> JobConfig:
        return cls.from_dict(read_json(path, "config"))


COMM_HOOK_NAMES = ("allreduce", "bf16", "fp16", "hierarchical", "powerSGD", "sign_ef", "topk_ef")
"""The keys of ``workers.training.comm.HOOKS`` (kept here so that validating a config never imports torch;
a test pins the two together)."""


def _check_comm_hook(spec: str) -> None:
    """``name[:key=value,...]`` with a known name (the hook itself checks the option names when built)."""
    name, _, rest = spec.partition(":")
    if name.strip() not in COMM_HOOK_NAMES:
        raise ConfigError(
            "comm_hook", f"unknown hook {name.strip()!r}; choose from {', '.join(COMM_HOOK_NAMES)}"
        )
    for item in filter(None, (part.strip() for part in rest.split(","))):
        if "=" not in item:
            raise ConfigError("comm_hook", f"option {item!r} is not key=value")


def read_json(path: str | Path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(what, f"file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(what, f"{path} is not valid JSON ({exc})") from None


def strategy_from_plan(plan: dict) -> dict:
    """A ``plan.json`` holds a strategy plus ``predicted`` figures; the run needs the strategy."""
    if not isinstance(plan, dict) or not isinstance(plan.get("strategy"), dict):
        raise ConfigError("plan.strategy", "a plan must contain a 'strategy' object")
    if plan.get("feasible") is False:
        raise ConfigError(
            "plan.feasible", f"the plan is marked infeasible: {plan.get('reason') or 'no reason'}"
        )
    return plan["strategy"]
