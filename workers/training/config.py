"""The run's configuration, parsed from the public contracts (``model.json``, ``strategy.json``,
``training.json``, ``plan.json``) plus runtime knobs.

One parser per contract: ``model.json``, ``strategy.json`` and ``training.json`` are read by the planner's
own parsers (:class:`~workers.planner.specs.ModelSpec`, :class:`~workers.planner.specs.Strategy`,
:class:`~workers.planner.specs.TrainingConfig`), so what the planner costs is what the runtime trains: same
fields, types, ranges and errors. The runtime adds only what is its own: what it cannot do (yet), the
defaults that differ on purpose (one rank, fp32, a small batch: a run that says nothing is a small CPU run;
:class:`ParallelConfig`, :class:`TrainingSpec`) and the model-dependent layout rules
(:meth:`JobConfig.validate`: the planner's own where the runtime needs the same). Every validation error is a :class:`ConfigError` naming the offending
field (``strategy.tp``, ``training.global_batch_size``), so the CLI can print it and exit 2.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any

from workers.planner.search import ep_rule, tp_rule
from workers.planner.specs import ModelSpec, MoESpec, SpecError, Strategy, TrainingConfig, stage_split_problem
from workers.training.comm_methods import FSDP_HOOK_NAMES
from workers.training.options import (
    OPTIONS,
    Option,
    OptionError,
    by_name,
    dataclass_fields,
)

# The runtime's names for the planner's model classes (the runtime adds checks, not fields).
ModelConfig = ModelSpec
MoEConfig = MoESpec


class ConfigError(SpecError):
    """Invalid input; ``field`` names the (first) offending contract field (``strategy.tp``,
    ``model.moe.top_k``), ``errors`` all of them. ``ConfigError("strategy.tp", "must divide ...")``."""


def _planner_parse(parse, d: Any, doc: str):
    """``parse(d)`` with the planner's parser; its :class:`SpecError` as a :class:`ConfigError` whose fields
    are prefixed with ``doc.`` (``strategy.tp``)."""
    if not isinstance(d, dict):
        raise ConfigError(doc, f"must be a JSON object, got {type(d).__name__}")
    try:
        return parse(d)
    except SpecError as exc:
        raise ConfigError(exc.prefixed(doc).errors) from None


def parse_model(d: Any) -> ModelSpec:
    """``model.json`` as the planner reads it, plus what this runtime needs: an even head dimension
    (rotary embeddings), at least 256 tokens of vocabulary (byte-level data) and 2+ tokens a sequence
    (tied embeddings need one pipeline stage: :meth:`JobConfig.validate`). MoE routing is dropless: ``capacity_factor`` and ``load_imbalance``
    are planner figures; the runtime measures the real imbalance (``expert_load``)."""
    m = _planner_parse(ModelSpec.from_dict, d, "model")
    if m.head_dim % 2:
        raise ConfigError("model.hidden_size", f"the head width ({m.head_dim}) must be even (rotary)")
    if m.vocab_size < 256:
        raise ConfigError("model.vocab_size", f"must be >= 256 for byte-level tokens, got {m.vocab_size}")
    if m.seq_length < 2:
        raise ConfigError("model.seq_length", f"must be >= 2 (next-token targets), got {m.seq_length}")
    return m


@dataclass(frozen=True)
class ParallelConfig(Strategy):
    """``strategy.json`` as the runtime runs it: the planner's :class:`Strategy` (same fields, same parser),
    complete. ``tp*pp*dp*cp`` = world size. How the runtime realises each field:

    - ``tp``: DTensor ``ColwiseParallel``/``RowwiseParallel`` on attention and MLP (experts are not split).
    - ``pp``: ``torch.distributed.pipelining`` stages (1F1B, interleaved 1F1B when ``vpp > 1``), each of
      ``layers_per_stage`` consecutive layers (absent: the planner's balanced split, the even one when
      ``pp`` divides the layers); unlike the planner the runtime also splits layers unevenly over virtual
      stages when ``pp*vpp`` does not divide them.
    - ``dp``: DDP (``zero_stage`` 0) or FSDP2 ``fully_shard`` (1/2 without resharding after forward, 3 with).
    - ``ep``: experts sharded over ``ep`` of the ``dp*cp`` ranks of a stage, all-to-all dispatch.
    - ``cp``: each sequence split over ``cp`` ranks in ``2*cp`` load-balanced chunks, keys/values
      all-gathered for attention (Llama 3's all-gather context parallelism).
    - ``micro_batch_size``: ``global_batch_size / (dp * micro_batch_size)`` micro-batches a step.
    - ``recompute``: activation checkpointing, ``selective`` (attention core) or ``full`` (per block).
    - ``sequence_parallel``: with ``tp > 1``, norms and residual stream sharded on the sequence dimension.
    - ``order``: any placement the planner accepts (a permutation of ``tp-cp-ep-dp-pp``, innermost first):
      global ranks follow its dense dimensions as the planner's ``group_strides`` assumes, and every group,
      pipeline stage, data shard and expert set follows the rank's coordinates
      (:class:`~workers.training.parallel.dims.ParallelDims`).
    """

    @classmethod
    def from_dict(cls, d: Any) -> ParallelConfig:
        s = _planner_parse(Strategy.from_dict, d, "strategy")
        # Runtime default, on purpose: a field left out is one rank, nothing sharded or recomputed
        # (PLAIN_STRATEGY) — a CPU run by default — where the planner would search it.
        return cls(**{f.name: getattr(s, f.name) for f in fields(s)}).completed()

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


# Runtime defaults that differ from the planner's on purpose: a training.json that says nothing is a small
# CPU run, in fp32 (bf16/fp16 autocast on CPU is slow and lossy) with 8 sequences a step (the planner
# requires a batch size). Everything else (optimizer "adam", the flags) is the planner's default.
RUNTIME_TRAINING_DEFAULTS: dict[str, Any] = {"global_batch_size": 8, "dtype": "fp32"}
MAX_MICROBATCHES = 65_536
"""Micro-batches one rank runs in a step (gradient accumulation): 2^16, far beyond what a run accumulates;
a global batch of 10^9 on one rank passed the spec's bound and never finished a step."""
# compute dtypes the runtime can autocast to (fp32 = no autocast); the planner also costs fp8
RUNTIME_DTYPES = ("fp32", "bf16", "fp16")
# One step's gradients, zstd, were 3.04x smaller than a full snapshot of the same 99.5M-parameter AdamW
# state (bench/elastic.py, docs/elastic.md): a log of 4 or more steps is larger than a full snapshot.
LOG_MAX_SNAPSHOT_EVERY = 3


@dataclass(frozen=True)
class TrainingSpec(TrainingConfig):
    """``training.json`` as the runtime runs it: the planner's :class:`TrainingConfig` (same fields, same
    parser) with :data:`RUNTIME_TRAINING_DEFAULTS`. ``adam``/``adamw`` both run ``torch.optim.AdamW``
    (identical without weight decay); ``flash_attention``/``overlap_grad_reduce`` are planner figures: the
    runtime always uses ``scaled_dot_product_attention`` and DDP/FSDP's bucketed overlap."""

    @classmethod
    def from_dict(cls, d: Any) -> TrainingSpec:
        d = {} if d is None else d
        if isinstance(d, dict):
            given = {k: v for k, v in d.items() if v is not None}
            d = {**RUNTIME_TRAINING_DEFAULTS, **given}
        t = _planner_parse(TrainingConfig.from_dict, d, "training")
        if t.dtype not in RUNTIME_DTYPES:
            raise ConfigError(
                "training.dtype", f"the runtime trains in {', '.join(RUNTIME_DTYPES)}, got {t.dtype!r}"
            )
        if t.framework != "cann-train":
            raise ConfigError(
                "training.framework",
                f"this runtime is cann-train (DDP / FSDP2 / DTensor), got {t.framework!r}: a plan for another "
                "framework is a planning figure; drop the field (or set it to cann-train) to train it here",
            )
        return cls(**{f.name: getattr(t, f.name) for f in fields(t)})


class JobConfigMethods:
    """What a job config does; its fields are :func:`job_config_class`'s (the documents, then one field per
    run option of ``workers.training.options.OPTIONS``, each with its help and section in the field's
    metadata). Serialised to JSON, flat, for ``python -m workers.training.run``."""

    OPTIONS: tuple[Option, ...] = OPTIONS

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
        """The layout rules that need the model, every broken one at once (the first names ``field``).

        The planner's own rules where the runtime needs the same (:func:`~workers.planner.search.tp_rule`,
        :func:`~workers.planner.search.ep_rule`, the batch split); the runtime's where it needs more (``2*cp``
        chunks, sequence-parallel shards, at least ``pp`` micro-batches, ``vpp`` needs ``pp > 1``) or can do
        more (uneven virtual pipeline stages: ``pp*vpp <= num_layers``, where the planner interleaves even
        stages only). ``layers_per_stage``, when given, must be ``pp`` counts summing to ``num_layers``.
        """
        s, m = self.strategy, self.model
        errors: dict[str, list[str]] = {}

        def fail(name: str, message: str | None) -> None:
            if message:
                errors.setdefault(name, []).append(message)

        gbs = self.training.global_batch_size
        # the planner's batch split rule; keyed on the batch size, as the API has always reported it
        batch_splits = gbs % (s.dp * s.micro_batch_size) == 0
        if not batch_splits:
            fail(
                "training.global_batch_size",
                f"must be divisible by dp*micro_batch_size ({s.dp}*{s.micro_batch_size}), got {gbs}",
            )
        fail("strategy.tp", tp_rule(m, s.tp))
        if s.sequence_parallel and s.tp > 1 and (m.seq_length // s.cp) % s.tp:
            fail(
                "strategy.sequence_parallel",
                f"seq_length / cp ({m.seq_length // s.cp}) must be divisible by tp ({s.tp}): sequence shards",
            )
        if s.cp > 1 and m.seq_length % (2 * s.cp):
            fail(
                "strategy.cp",
                f"2*cp ({2 * s.cp}) must divide seq_length ({m.seq_length}): load-balanced chunks",
            )
        if s.vpp > 1 and s.pp == 1:
            fail("strategy.vpp", "virtual pipeline stages need pp > 1")
        if s.pp * s.vpp > m.num_layers:
            fail("strategy.pp", f"pp*vpp ({s.pp * s.vpp}) exceeds num_layers ({m.num_layers})")
        if m.tied_embeddings and s.pp > 1:
            fail(
                "strategy.pp",
                "a model with tied embeddings trains on one pipeline stage (pp=1): the first stage's embedding "
                "and the last stage's output projection would be one matrix on two ranks",
            )
        if s.layers_per_stage is not None:
            fail("strategy.layers_per_stage", stage_split_problem(s.layers_per_stage, s.pp, m.num_layers))
        if batch_splits and s.pp > 1 and self.num_microbatches < s.pp:
            fail(
                "strategy.micro_batch_size",
                f"pipeline needs at least pp ({s.pp}) micro-batches per step, "
                f"got {self.num_microbatches} (global_batch_size/(dp*micro_batch_size))",
            )
        fail("strategy.ep", ep_rule(m, s.ep, s.dp, s.cp))
        if batch_splits and self.num_microbatches > MAX_MICROBATCHES:
            fail(
                "training.global_batch_size",
                f"{gbs} is {self.num_microbatches} micro-batches a step per rank (global_batch_size/(dp*"
                f"micro_batch_size)); at most {MAX_MICROBATCHES:,}: the runtime runs them one after another, so a "
                "step would never end. Raise dp or micro_batch_size, or lower the batch",
            )
        if self.steps < 1:
            fail("steps", "must be >= 1")
        hook_name = (self.comm_hook or "").partition(":")[0].strip()
        if self.comm_hook and s.zero_stage != 0 and hook_name not in FSDP_HOOK_NAMES:
            fail(
                "comm_hook",
                f"{hook_name} has no FSDP2 reduce-scatter form (zero_stage {s.zero_stage}): it all-reduces "
                "low-rank factors of whole gradient matrices, FSDP2's reduce-scatter sees flat shards; use "
                f"zero_stage 0, or one of {', '.join(FSDP_HOOK_NAMES)}",
            )
        if self.comm_order != "reverse":
            for problem in comm_order_problems(self):
                fail("comm_order", problem)
        if (
            self.snapshot_every or self.resume or self.resume_from or self.snapshot_memory_every
        ) and not self.snapshot_dir:
            fail("snapshot_dir", "is required with snapshot_every, resume or resume_from")
        if self.snapshot_delta == "log" and self.snapshot_every > LOG_MAX_SNAPSHOT_EVERY:
            fail(
                "snapshot_every",
                f"must be at most {LOG_MAX_SNAPSHOT_EVERY} with snapshot_delta log, got {self.snapshot_every}: "
                "a log holds one gradient per step since the previous snapshot (and the host keeps a copy of "
                "each until it is written), more than a full snapshot beyond that; use snapshot_delta xor",
            )
        if errors:
            raise ConfigError(errors)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The runtime knobs plus ``model``/``strategy``/``training`` in their contract shapes."""
        d = asdict(self)
        d.update(
            model=self.model.to_dict(), strategy=self.strategy.to_dict(), training=self.training.to_dict()
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobConfig:
        if not isinstance(d, dict):
            raise ConfigError("config", "must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:  # every one of them, worded as the planner's parser words a document's
            message = f"is not a field of the job config (known: {', '.join(sorted(known))})"
            raise ConfigError({key: [message] for key in sorted(unknown)})
        if "model" not in d:
            raise ConfigError("model", "is required")
        options = by_name(cls.OPTIONS)
        # an option given as null is left out (its default applies), unless null is one of its values
        kwargs = {k: v for k, v in d.items() if v is not None or k not in options or options[k].nullable}
        kwargs["model"] = parse_model(d["model"])
        kwargs["strategy"] = ParallelConfig.from_dict(d.get("strategy") or {})
        kwargs["training"] = TrainingSpec.from_dict(d.get("training"))
        if isinstance(kwargs.get("job_id"), int) and not isinstance(kwargs["job_id"], bool):
            kwargs["job_id"] = str(kwargs["job_id"])  # a job id may come as a number
        errors: dict[str, list[str]] = {}
        for option in options.values():
            if option.name in kwargs:
                try:
                    kwargs[option.name] = option.parse(kwargs[option.name])
                except OptionError as exc:
                    errors[option.name] = [exc.message]
        if errors:
            raise ConfigError(errors)
        if kwargs.get("resume_from") is not None:
            kwargs["resume"] = True
        return cls(**kwargs).validate()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> JobConfig:
        return cls.from_dict(read_json(path, "config"))


def job_config_class(table: tuple[Option, ...] = OPTIONS, name: str = "JobConfig") -> type:
    """The job config's class for an options table: ``model``, ``strategy`` and ``training`` (the contract
    documents), then one field per option, its default, help and section from the table (``fields(cls)``,
    ``metadata["option"]``). ``JobConfig`` is the one of :data:`~workers.training.options.OPTIONS`; a test
    builds one of a table with an option added and sees it parsed, bounded and serialised."""
    return make_dataclass(
        name,
        [
            ("model", ModelConfig),
            ("strategy", ParallelConfig, field(default_factory=lambda: ParallelConfig.from_dict({}))),
            ("training", TrainingSpec, field(default_factory=lambda: TrainingSpec.from_dict({}))),
            *dataclass_fields(table),
        ],
        bases=(JobConfigMethods,),
        namespace={"OPTIONS": tuple(table), "__module__": __name__},
    )


JobConfig = job_config_class()
JobConfig.__doc__ = "Everything one training run needs (:class:`JobConfigMethods`, :func:`job_config_class`)."


def comm_order_problems(cfg: JobConfig) -> list[str]:
    """Why ``cfg.comm_order`` (priority or magnitude) cannot run with the rest of ``cfg`` (empty: it can).
    A step's update ends in the next step's forward, layer by layer, so nothing may need the whole
    averaged gradient at the end of the step (clipping by its norm, a snapshot, a hook of its own)."""
    s, order, out = cfg.strategy, cfg.comm_order, []
    if s.zero_stage != 0 or s.tp > 1 or s.pp > 1 or s.cp > 1 or s.ep > 1:
        out.append(
            f"{order} replaces DDP: data parallelism only (zero_stage 0, tp = pp = cp = ep = 1), got "
            f"{s.short_name()} zero_stage {s.zero_stage}"
        )
    if cfg.comm_hook:
        out.append(f"{order} sends dense averaged gradients itself: drop comm_hook {cfg.comm_hook!r}")
    if cfg.grad_clip > 0:
        out.append(
            f"{order} updates each layer as soon as its gradient arrives, before the global gradient norm "
            f"exists: set grad_clip 0 (got {cfg.grad_clip})"
        )
    if cfg.snapshot_every or cfg.snapshot_memory_every or cfg.resume:
        out.append(f"{order} does not take snapshots yet: a step's update completes in the next forward")
    return out


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
