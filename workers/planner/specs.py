"""Typed inputs of the planner: the JSON contracts (``model.json``, ``cluster.json``, ``training.json``,
``strategy.json``) as dataclasses that parse and validate themselves.

Every ``from_dict`` raises :class:`SpecError` naming each offending field and the rule it breaks, so the
CLI can print it and a DRF serializer can turn it into field-level 400s. ``to_dict`` gives back the
contract shape with the same field names.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

ACTIVATIONS = ("gelu", "swiglu", "relu", "geglu")
DTYPES = ("bf16", "fp16", "fp32", "fp8")
OPTIMIZERS = ("adam", "adamw", "sgd")
FRAMEWORKS = ("cann-train", "megatron-lm", "deepspeed", "fsdp")
"""Training frameworks whose collective behaviour the planner models (``hardware_profiles.json``
``frameworks``): ``cann-train`` is this product's runtime (DDP / FSDP2 + DTensor TP, the default),
``megatron-lm`` Megatron-LM / Megatron-Core (also NeMo), ``deepspeed`` DeepSpeed ZeRO (also
Megatron-DeepSpeed), ``fsdp`` PyTorch FSDP / FSDP2 outside this product (Composer, torchtitan, fairseq)."""
RECOMPUTE_MODES = ("none", "selective", "full")
# bytes per element of a tensor stored in each dtype
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


class SpecError(ValueError):
    """An input document breaks the contract.

    ``errors`` maps a dotted field path (``"moe.top_k"``, ``"strategy.tp"``) to the list of messages
    about it; ``field`` is the first such path. ``str(exc)`` names every field and rule.
    """

    def __init__(self, field: str | dict[str, list[str]], message: str | None = None):
        if isinstance(field, dict):
            errors = {k: list(v) for k, v in field.items() if v}
        else:
            errors = {field: [message or "is invalid"]}
        self.errors: dict[str, list[str]] = errors
        self.field: str = next(iter(errors), "")
        super().__init__("; ".join(f"{k}: {m}" for k, msgs in errors.items() for m in msgs))

    def prefixed(self, prefix: str) -> SpecError:
        """The same errors with ``prefix.`` in front of each field path."""
        return SpecError({f"{prefix}.{k}": v for k, v in self.errors.items()})


# what each parser's document is called in an unknown-field message
DOCUMENT_NAMES = {
    "model": "model.json",
    "moe": "model.json's moe",
    "cluster": "cluster.json",
    "device": "cluster.json's device",
    "link": "a cluster.json link (intra_node, inter_node)",
    "tier": "a cluster.json tier",
    "training": "training.json",
    "strategy": "strategy.json",
}


# Upper bounds of every numeric field: what the physical world has, with room to grow (each one 8-100x the
# largest published value), so that a typo or a hostile 1e300 is an error naming the field instead of a
# stored document that makes a page 150 MB or a search run for hours.
MAXIMA: dict[str, float] = {
    # model.json; largest published: 128 layers and hidden 25,600 (Megatron-LM 1T, Narayanan et al. 2021
    # Table 1), 128 heads, FFN 4x hidden, vocabulary 256k (Gemma, Gemma Team 2024), context 10M tokens
    # (Llama 4 Scout, Meta 2025), 256 routed experts of top-8 (DeepSeek-V3, 2024), 2,048 experts (Switch)
    "num_layers": 4096,
    "hidden_size": 262_144,
    "num_attention_heads": 4096,
    "num_kv_heads": 4096,
    "ffn_hidden_size": 1_048_576,
    "expert_ffn_hidden_size": 1_048_576,
    "vocab_size": 16_777_216,
    "seq_length": 134_217_728,
    "num_experts": 65_536,
    "top_k": 1024,
    "num_shared_experts": 1024,
    "first_dense_layers": 4096,
    "layer_frequency": 4096,
    "capacity_factor": 1024.0,
    "load_imbalance": 1024.0,
    # cluster.json; largest published: ~25k nodes (xAI Colossus, 200k GPUs), 16 accelerators per node
    # (HGX-2), 288 GB HBM (B300), 1,800 GB/s NVLink 5, 20 PFLOP/s FP4 (B200), 1,200 W TDP (B300)
    "num_nodes": 1_048_576,
    "devices_per_node": 1024,
    "nodes": 1_048_576,
    "memory_GiB": 65_536.0,
    "memory_bandwidth_GBps": 1_000_000.0,
    "peak_tflops": 10_000_000.0,
    "tdp_watts": 100_000.0,
    "bandwidth_GBps": 1_000_000.0,
    "latency_us": 10_000_000.0,
    "oversubscription": 1024.0,
    # training.json / strategy.json: 1.2 B sequences in one step is 1000x any published global batch
    "global_batch_size": 1 << 30,
    "micro_batch_size": 1 << 20,
    "tp": 1 << 20,
    "pp": 1 << 20,
    "dp": 1 << 20,
    "ep": 1 << 20,
    "cp": 1 << 20,
    "vpp": 1 << 20,
}
MAX_NAME_CHARS = 200
# characters a name may not hold: control characters (NUL, newlines, ...) and bidirectional overrides that
# make a name display as something else (U+202A-U+202E, U+2066-U+2069, "Trojan Source", CVE-2021-42574)
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def name_problem(value: str) -> str:
    """Why ``value`` cannot be a name ("" when it can)."""
    import unicodedata

    if len(value) > MAX_NAME_CHARS:
        return f"must be at most {MAX_NAME_CHARS} characters, got {len(value)}"
    bad = sorted({c for c in value if unicodedata.category(c) == "Cc" or c in _BIDI_CONTROLS})
    if bad:
        return (
            "must not contain control or bidirectional-override characters ("
            + ", ".join(f"U+{ord(c):04X}" for c in bad)
            + ")"
        )
    return ""


class _Checker:
    """Collects every problem in one document so that one error names all of them.

    It remembers the fields a parser reads (every accessor, plus :meth:`get` for a value read as is);
    :meth:`done` rejects the keys no one read, so a typo (``tpp``, ``num_layer``) is an error naming the
    key instead of a field silently left at its default."""

    def __init__(self, data: Any, doc: str):
        if not isinstance(data, dict):
            raise SpecError(doc, f"must be a JSON object, got {type(data).__name__}")
        self.data = data
        self.doc = doc
        self.read: dict[str, None] = {}  # in reading order: the "known" list of the error message
        self.errors: dict[str, list[str]] = {}

    def fail(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)

    def get(self, name: str, default: Any = None) -> Any:
        """``data.get(name, default)``, for a value the parser checks itself."""
        self.read[name] = None
        return self.data.get(name, default)

    def raw(self, name: str, default: Any = dataclasses.MISSING) -> Any:
        self.read[name] = None
        if name not in self.data or self.data[name] is None:
            if default is dataclasses.MISSING:
                self.fail(name, "is required")
            return None if default is dataclasses.MISSING else default
        return self.data[name]

    def integer(self, name: str, minimum: int = 1, default: Any = dataclasses.MISSING) -> int | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            self.fail(name, f"must be an integer, got {value!r}")
            return None
        if value < minimum:
            self.fail(name, f"must be >= {minimum}, got {value}")
            return None
        if value > (top := MAXIMA.get(name, 1 << 62)):
            self.fail(name, f"must be <= {top:,.0f} (more than any real system has), got {value:.4g}")
            return None
        return int(value)

    def number(
        self, name: str, minimum: float = 0.0, default: Any = dataclasses.MISSING, strict: bool = True
    ) -> float | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(name, f"must be a number, got {value!r}")
            return None
        if not math.isfinite(value):
            self.fail(name, f"must be a finite number, got {value!r}")
            return None
        if (value <= minimum) if strict else (value < minimum):
            self.fail(name, f"must be {'>' if strict else '>='} {minimum}, got {value}")
            return None
        if value > (top := MAXIMA.get(name, 1e15)):
            self.fail(name, f"must be <= {top:,.0f} (more than any real system has), got {value:.4g}")
            return None
        return float(value)

    def choice(self, name: str, choices: tuple[str, ...], default: Any = dataclasses.MISSING) -> str | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if value not in choices:
            self.fail(name, f"must be one of {', '.join(choices)}, got {value!r}")
            return None
        return value

    def text(self, name: str, default: Any = dataclasses.MISSING) -> str | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(
                name, f"must be a non-empty string, got {value[:80] if isinstance(value, str) else value!r}"
            )
            return None
        if problem := name_problem(value):
            self.fail(name, problem)
            return None
        return value

    def nested(self, name: str, parse, default: Any = dataclasses.MISSING):
        value = self.raw(name, default)
        if value is None:
            return None
        try:
            return parse(value)
        except SpecError as exc:
            for k, msgs in exc.prefixed(name).errors.items():
                for m in msgs:
                    self.fail(k, m)
            return None

    def done(self) -> None:
        known = ", ".join(self.read)
        for key in self.data:
            if key not in self.read:
                self.fail(
                    str(key), f"is not a field of {DOCUMENT_NAMES.get(self.doc, self.doc)} (known: {known})"
                )
        if self.errors:
            raise SpecError(self.errors)


def _as_dict(obj) -> dict[str, Any]:
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _plain(value):
    if dataclasses.is_dataclass(value):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts part of a model (``model.json`` ``moe``); absent/null for dense models."""

    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts each token is routed to."""
    expert_ffn_hidden_size: int
    """Hidden size of one expert's MLP."""
    num_shared_experts: int = 0
    """Experts every token goes through (DeepSeek-style), each of ``expert_ffn_hidden_size``."""
    first_dense_layers: int = 0
    """Leading layers that use a dense MLP of ``ffn_hidden_size`` instead of experts."""
    layer_frequency: int = 1
    """After the dense prefix, every ``layer_frequency``-th layer is an MoE layer (1 = all)."""
    capacity_factor: float | None = None
    """Expert capacity as a multiple of the balanced share; tokens above it are dropped. null = dropless."""
    load_imbalance: float | None = None
    """Tokens of the busiest expert-parallel rank divided by the mean (>= 1); scales all-to-all and
    expert compute of the critical rank. null = derived per layout from ep, top_k and the tokens of a
    micro-batch (``workers/planner/moe.py``: uniform routing, or the expert load measured by past runs);
    a number given here overrides the derived figure."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoESpec:
        c = _Checker(d, "moe")
        num_experts = c.integer("num_experts")
        top_k = c.integer("top_k")
        spec = dict(
            num_experts=num_experts,
            top_k=top_k,
            expert_ffn_hidden_size=c.integer("expert_ffn_hidden_size"),
            num_shared_experts=c.integer("num_shared_experts", minimum=0, default=0),
            first_dense_layers=c.integer("first_dense_layers", minimum=0, default=0),
            layer_frequency=c.integer("layer_frequency", default=1),
            capacity_factor=c.number("capacity_factor", default=None),
            load_imbalance=c.number("load_imbalance", default=None),
        )
        if num_experts and top_k and top_k > num_experts:
            c.fail("top_k", f"must be <= num_experts ({num_experts}), got {top_k}")
        if spec["load_imbalance"] is not None and spec["load_imbalance"] < 1.0:
            c.fail("load_imbalance", f"must be >= 1 (busiest rank / mean), got {spec['load_imbalance']}")
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (``model.json``)."""

    name: str
    """Free-form model name."""
    num_layers: int
    """Transformer layers."""
    hidden_size: int
    """Model width h."""
    num_attention_heads: int
    """Query heads a; head dim = h / a."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention when < num_attention_heads)."""
    ffn_hidden_size: int
    """Hidden size of the dense MLP."""
    vocab_size: int
    """Vocabulary size V (embedding and logits)."""
    seq_length: int
    """Tokens per sequence s."""
    activation: str = "gelu"
    """MLP activation: gelu / relu (two matrices) or swiglu / geglu (gated, three matrices)."""
    moe: MoESpec | None = None
    """Mixture-of-experts settings; None for a dense model."""
    tied_embeddings: bool = False
    """Input embedding and output projection share weights."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        c = _Checker(d, "model")
        spec = dict(
            name=c.text("name", default="model"),
            num_layers=c.integer("num_layers"),
            hidden_size=c.integer("hidden_size"),
            num_attention_heads=c.integer("num_attention_heads"),
            num_kv_heads=c.integer("num_kv_heads", default=c.get("num_attention_heads")),
            ffn_hidden_size=c.integer("ffn_hidden_size"),
            vocab_size=c.integer("vocab_size"),
            seq_length=c.integer("seq_length"),
            activation=c.choice("activation", ACTIVATIONS, default="gelu"),
            moe=c.nested("moe", MoESpec.from_dict, default=None),
            tied_embeddings=bool(c.get("tied_embeddings", False)),
        )
        h, a, kv = spec["hidden_size"], spec["num_attention_heads"], spec["num_kv_heads"]
        if h and a and h % a:
            c.fail("hidden_size", f"must be divisible by num_attention_heads ({a}), got {h}")
        if a and kv and a % kv:
            c.fail("num_kv_heads", f"must divide num_attention_heads ({a}), got {kv}")
        moe = spec["moe"]
        if moe and spec["num_layers"] and moe.first_dense_layers >= spec["num_layers"]:
            c.fail("moe.first_dense_layers", f"must be < num_layers ({spec['num_layers']})")
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        d = _as_dict(self)
        if not self.tied_embeddings:
            d.pop("tied_embeddings")
        return d

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def gated(self) -> bool:
        """A gated MLP (swiglu / geglu): three weight matrices instead of two."""
        return self.activation in ("swiglu", "geglu")

    def is_moe_layer(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` (0-based) has a mixture-of-experts MLP."""
        if self.moe is None or layer_id < self.moe.first_dense_layers:
            return False
        return (layer_id - self.moe.first_dense_layers) % self.moe.layer_frequency == 0

    @property
    def moe_layer_ids(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (``len(moe_layer_ids)`` without the list)."""
        if self.moe is None:
            return 0
        rest = self.num_layers - self.moe.first_dense_layers
        return (rest + self.moe.layer_frequency - 1) // self.moe.layer_frequency

    def parameter_count(self) -> dict[str, float]:
        """Parameters by kind: ``attention``, ``dense_mlp``, ``experts``, ``shared`` (router, shared
        experts), ``embedding``, ``norms`` and ``total`` (Megatron-LM layer layout)."""
        h, f, hd = self.hidden_size, self.ffn_hidden_size, self.head_dim
        mats = 3 if self.gated else 2
        # QKV with GQA + output projection (Megatron-LM ParallelAttention layout)
        attention = h * (h + 2 * self.num_kv_heads * hd) + h * h
        dense_mlp = mats * h * f
        n_moe = self.num_moe_layers
        n_dense = self.num_layers - n_moe
        experts = shared = 0.0
        if self.moe:
            fe = self.moe.expert_ffn_hidden_size
            experts = n_moe * self.moe.num_experts * mats * h * fe
            shared = n_moe * (self.moe.num_shared_experts * mats * h * fe + h * self.moe.num_experts)
        embedding = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        norms = self.num_layers * 4 * h + 2 * h
        total = self.num_layers * attention + n_dense * dense_mlp + experts + shared + embedding + norms
        return {
            "attention": float(self.num_layers * attention),
            "dense_mlp": float(n_dense * dense_mlp),
            "experts": float(experts),
            "shared": float(shared),
            "embedding": float(embedding),
            "norms": float(norms),
            "total": float(total),
        }


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (``cluster.json`` ``device``)."""

    name: str
    """Device model; matched against the shipped hardware profiles for calibrated efficiencies."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s per dtype."""
    memory_GiB: float
    """Device memory in GiB."""
    memory_bandwidth_GBps: float
    """Device memory bandwidth, GB/s."""
    tdp_watts: float | None = None
    """Board power, W (used by the green accounting, not the planner)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceSpec:
        c = _Checker(d, "device")
        peak = c.raw("peak_tflops")
        if peak is not None:
            if not isinstance(peak, dict) or not peak:
                c.fail("peak_tflops", "must be an object {dtype: TFLOP/s}")
                peak = None
            else:
                top = MAXIMA["peak_tflops"]
                for k, v in peak.items():
                    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= top:
                        c.fail(f"peak_tflops.{k}", f"must be a number > 0 and <= {top:,.0f}, got {v!r}")
                peak = {k: float(v) for k, v in peak.items() if isinstance(v, int | float)}
        spec = dict(
            name=c.text("name"),
            peak_tflops=peak,
            memory_GiB=c.number("memory_GiB"),
            memory_bandwidth_GBps=c.number("memory_bandwidth_GBps"),
            tdp_watts=c.number("tdp_watts", default=None),
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


@dataclass(frozen=True)
class LinkSpec:
    """A link class (``intra_node`` or ``inter_node``)."""

    kind: str
    """Technology label (nvswitch, hccs, infiniband-hdr, roce-200ge, ...)."""
    bandwidth_GBps: float
    """GB/s per device per direction."""
    latency_us: float
    """One-hop latency in microseconds (the alpha of the alpha-beta model)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinkSpec:
        c = _Checker(d, "link")
        spec = dict(
            kind=c.text("kind", default="link"),
            bandwidth_GBps=c.number("bandwidth_GBps"),
            latency_us=c.number("latency_us", strict=False),
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


@dataclass(frozen=True)
class TierSpec:
    """A switch level above the nodes (``cluster.json`` ``tiers``, innermost first)."""

    name: str
    """Label (leaf, spine, core)."""
    nodes: int
    """Nodes under one switch of this tier."""
    oversubscription: float = 1.0
    """Downlink / uplink bandwidth ratio of this tier's switches (1 = non-blocking)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TierSpec:
        c = _Checker(d, "tier")
        spec = dict(
            name=c.text("name", default="tier"),
            nodes=c.integer("nodes"),
            oversubscription=c.number("oversubscription", default=1.0),
        )
        if spec["oversubscription"] is not None and spec["oversubscription"] < 1.0:
            c.fail("oversubscription", f"must be >= 1, got {spec['oversubscription']}")
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous cluster (``cluster.json``)."""

    name: str
    """Free-form cluster name."""
    num_nodes: int
    """Nodes (servers)."""
    devices_per_node: int
    """Accelerators per node."""
    device: DeviceSpec
    """The accelerator."""
    intra_node: LinkSpec
    """Scale-up link inside a node."""
    inter_node: LinkSpec
    """Scale-out link between nodes (per device)."""
    tiers: tuple[TierSpec, ...] = ()
    """Switch levels above a node, innermost first."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterSpec:
        c = _Checker(d, "cluster")
        tiers_raw = c.raw("tiers", default=[])
        tiers: list[TierSpec] = []
        if not isinstance(tiers_raw, list):
            c.fail("tiers", "must be a list")
        else:
            for i, t in enumerate(tiers_raw):
                try:
                    tiers.append(TierSpec.from_dict(t))
                except SpecError as exc:
                    for k, msgs in exc.prefixed(f"tiers[{i}]").errors.items():
                        for m in msgs:
                            c.fail(k, m)
        for i in range(1, len(tiers)):
            if tiers[i].nodes < tiers[i - 1].nodes:
                c.fail(f"tiers[{i}].nodes", "tiers must be listed innermost first with non-decreasing nodes")
        spec = dict(
            name=c.text("name", default="cluster"),
            num_nodes=c.integer("num_nodes"),
            devices_per_node=c.integer("devices_per_node"),
            device=c.nested("device", DeviceSpec.from_dict),
            intra_node=c.nested("intra_node", LinkSpec.from_dict),
            inter_node=c.nested("inter_node", LinkSpec.from_dict),
            tiers=tuple(tiers),
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        """The same cluster cut down (or grown) to ``num_nodes`` nodes."""
        return dataclasses.replace(self, num_nodes=num_nodes, name=f"{self.name}[{num_nodes} nodes]")

    def devices_problem(self, devices: int) -> str | None:
        """Why a layout of ``devices`` ranks cannot run on this cluster; None when it can: on every device,
        on part of one node (at most ``devices_per_node``) or on whole nodes (a multiple of it), the other
        devices staying idle."""
        n, per_node = self.num_devices, self.devices_per_node
        if devices == n or (0 < devices < n and (devices <= per_node or devices % per_node == 0)):
            return None
        if devices > n:
            return f"needs {devices} devices; the cluster has {n} ({self.num_nodes} x {per_node})"
        return (
            f"{devices} devices are neither part of one node (at most {per_node}) nor whole nodes (a multiple "
            f"of {per_node}) of the cluster's {n}"
        )

    def with_devices(self, devices: int) -> ClusterSpec:
        """The part of this cluster a layout of ``devices`` ranks runs on: this cluster when it takes every
        device, else part of one node or whole nodes (:meth:`devices_problem`; a ``SpecError`` on
        ``devices`` when it is neither)."""
        if problem := self.devices_problem(devices):
            raise SpecError("devices", problem)
        if devices == self.num_devices:
            return self
        if devices % self.devices_per_node == 0:
            return self.with_nodes(devices // self.devices_per_node)
        return dataclasses.replace(
            self, num_nodes=1, devices_per_node=devices, name=f"{self.name}[{devices} devices]"
        )


@dataclass(frozen=True)
class TrainingConfig:
    """What one optimizer step trains (``training.json``)."""

    global_batch_size: int
    """Sequences per optimizer step."""
    dtype: str = "bf16"
    """Compute and weight dtype (mixed precision keeps fp32 master weights for adam)."""
    optimizer: str = "adam"
    """adam / adamw (two fp32 moments) or sgd (one momentum)."""
    flash_attention: bool = False
    """Fused attention that never materialises the s x s scores (FlashAttention). False follows the
    layout measured in Korthikanti et al. 2022 (scores, softmax and dropout mask stored)."""

    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduction with the backward of the last micro-batch (PyTorch
    DDP/FSDP buckets, Megatron ``--overlap-grad-reduce``). False is the Megatron-LM default: reduce
    after the last backward, then all-gather the parameters after the step."""

    framework: str = "cann-train"
    """Which framework runs the step (:data:`FRAMEWORKS`): it decides how the ZeRO collectives move (see
    ``hardware.FrameworkCollectives``)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainingConfig:
        c = _Checker(d, "training")
        flags = {}
        for name in ("flash_attention", "overlap_grad_reduce"):
            value = c.get(name, False)
            if not isinstance(value, bool):
                c.fail(name, f"must be true or false, got {value!r}")
            flags[name] = bool(value)
        spec = dict(
            global_batch_size=c.integer("global_batch_size"),
            dtype=c.choice("dtype", DTYPES, default="bf16"),
            optimizer=c.choice("optimizer", OPTIMIZERS, default="adam"),
            framework=c.choice("framework", FRAMEWORKS, default="cann-train"),
            **flags,
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        d = _as_dict(self)
        for name in ("flash_attention", "overlap_grad_reduce"):
            if not d[name]:
                d.pop(name)
        if d["framework"] == "cann-train":
            d.pop("framework")
        return d


STRATEGY_FIELDS = (
    "tp",
    "pp",
    "dp",
    "ep",
    "cp",
    "vpp",
    "micro_batch_size",
    "recompute",
    "zero_stage",
    "sequence_parallel",
)

PLAIN_STRATEGY: dict[str, Any] = {
    "tp": 1,
    "pp": 1,
    "dp": 1,
    "ep": 1,
    "cp": 1,
    "vpp": 1,
    "micro_batch_size": 1,
    "recompute": "none",
    "zero_stage": 0,
    "sequence_parallel": False,
}
"""Each strategy field at the value that adds nothing: one rank, nothing sharded, split or recomputed.
:meth:`Strategy.completed` fills the fields a strategy leaves open with it; :meth:`Strategy.short_name`
leaves out the fields at it."""

# the recompute mode in a short name: ``-rsel`` / ``-rfull`` (``none`` is left out)
RECOMPUTE_SHORT = {"selective": "sel", "full": "full"}


def balanced_stage_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers on each of ``pp`` pipeline stages when a strategy does not list them (``layers_per_stage``
    absent): the even split when ``pp`` divides ``num_layers``; otherwise every stage gets
    ``num_layers // pp`` and the remainder goes one layer each to the middle stages, first to last, then
    (only when the remainder is ``pp - 1``) to the first stage.

    Why the middle: at equal layer counts the end stages are the heavy ones -- the first holds the
    embedding and, under 1F1B, ``pp`` micro-batches of activations; the last the LM head, fp32 logits and
    the loss -- so the split that is as even as possible and keeps the ends one layer lighter is the
    balanced one. It is Llama 3 405B's published layout (126 layers on pp = 16: 7, 8 x 14, 7; Dubey et al.
    2024 §3.3.2: one layer fewer on the first and on the last stage, to balance the embedding and the
    output layer and loss) and what Megatron-LM's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers`` express.
    When one layer is left after the middle stages, the first stage takes it: its embedding is a lookup,
    the last stage's LM head a GEMM the size of a fraction of a layer. O(pp), no search."""
    if not 1 <= pp <= num_layers:
        raise ValueError(f"pp={pp} must be between 1 and num_layers ({num_layers})")
    base, extra = divmod(num_layers, pp)
    split = [base] * pp
    for stage in [*range(1, pp - 1), 0][:extra]:
        split[stage] += 1
    return tuple(split)


def stage_split_summary(split) -> tuple[int, int, int]:
    """``(first, middle, last)`` of a stage split: layers on the first stage, the most layers on a stage
    between the first and the last (0 when ``pp <= 2``), and layers on the last stage (the same stage as
    the first when ``pp == 1``). What the cost model needs of a split (see ``CostModel.stage_layers``)."""
    split = tuple(split)
    return split[0], max(split[1:-1], default=0), split[-1]


@dataclass(frozen=True)
class Strategy:
    """One point of the search space (``strategy.json``). Any field may be None: "search it".

    The degrees multiply to the device count: ``tp * pp * dp * cp``; ``ep`` shards the experts over the
    ``dp * cp`` ranks of a pipeline stage. Ranks are placed with ``order`` (innermost first).
    """

    tp: int | None = None
    """Tensor-parallel degree (Megatron-LM column/row split of every layer)."""
    pp: int | None = None
    """Pipeline-parallel stages."""
    dp: int | None = None
    """Data-parallel replicas."""
    ep: int | None = None
    """Expert-parallel degree (divides dp * cp); 1 for dense models."""
    cp: int | None = None
    """Context-parallel degree (sequence split with ring attention)."""
    vpp: int | None = None
    """Virtual pipeline chunks per stage (interleaved 1F1B); 1 = plain 1F1B."""
    micro_batch_size: int | None = None
    """Sequences per micro-batch."""
    recompute: str | None = None
    """Activation recomputation: none, selective (attention core) or full (whole layer)."""
    zero_stage: int | None = None
    """ZeRO stage: 0 none, 1 optimizer states sharded (Megatron distributed optimizer), 2 + gradients,
    3 + parameters (FSDP)."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism for the non-tensor-parallel regions (needs tp > 1 to matter)."""
    layers_per_stage: tuple[int, ...] | None = None
    """Transformer layers on each pipeline stage, first to last: ``pp`` integers >= 1 summing to
    ``num_layers`` (the first stage also holds the embedding, the last the LM head and loss). Optional:
    absent (null) is :func:`balanced_stage_split` -- the even split when ``pp`` divides ``num_layers``, else
    the most even one with the end stages a layer lighter (Llama 3 405B: 7, 8 x 14, 7). Uneven stages need
    ``vpp = 1``. Plans write it out whenever their split is uneven."""
    order: str = "tp-cp-ep-dp-pp"
    """Rank placement, innermost (fastest-varying, closest on the topology) first."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, *, partial: bool = True) -> Strategy:
        d = d or {}
        c = _Checker(d, "strategy")
        opt = None if partial else dataclasses.MISSING
        spec: dict[str, Any] = {}
        for name in ("tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch_size"):
            spec[name] = c.integer(name, default=opt)
        spec["zero_stage"] = c.integer("zero_stage", minimum=0, default=opt)
        if spec["zero_stage"] is not None and spec["zero_stage"] > 3:
            c.fail("zero_stage", f"must be 0, 1, 2 or 3, got {spec['zero_stage']}")
            spec["zero_stage"] = None
        spec["recompute"] = c.choice("recompute", RECOMPUTE_MODES, default=opt)
        sp = c.get("sequence_parallel")
        if sp is not None and not isinstance(sp, bool):
            c.fail("sequence_parallel", f"must be true, false or null, got {sp!r}")
            sp = None
        elif sp is None and not partial:
            c.fail("sequence_parallel", "is required")
        spec["sequence_parallel"] = sp
        spec["layers_per_stage"] = _layers_per_stage(c, spec["pp"], spec["vpp"])
        order = c.get("order") or "tp-cp-ep-dp-pp"
        parts = order.split("-") if isinstance(order, str) else []
        if sorted(parts) != sorted(["tp", "cp", "ep", "dp", "pp"]):
            c.fail("order", f"must be a permutation of tp-cp-ep-dp-pp, got {order!r}")
            order = "tp-cp-ep-dp-pp"
        spec["order"] = order
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in STRATEGY_FIELDS}
        if self.layers_per_stage is not None:
            d["layers_per_stage"] = list(self.layers_per_stage)
        if self.order != "tp-cp-ep-dp-pp":
            d["order"] = self.order
        return d

    def fixed_fields(self) -> dict[str, Any]:
        """The fields this (partial) strategy pins, without the ones left to the search."""
        return {k: v for k, v in self.to_dict().items() if v is not None}

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers on each pipeline stage: :attr:`layers_per_stage`, or :func:`balanced_stage_split` when it is
        absent (``pp`` left open counts as 1). Raises :class:`SpecError` (``layers_per_stage``) when the listed
        split does not fit ``pp`` stages of ``num_layers`` layers, and (``pp``) when ``pp`` exceeds the layers."""
        pp = self.pp or 1
        if self.layers_per_stage is None:
            if pp > num_layers:
                raise SpecError("pp", f"pp={pp} exceeds num_layers ({num_layers}): a stage needs a layer")
            return balanced_stage_split(num_layers, pp)
        if problem := stage_split_problem(self.layers_per_stage, pp, num_layers):
            raise SpecError("layers_per_stage", problem)
        return tuple(self.layers_per_stage)

    @property
    def is_complete(self) -> bool:
        return all(getattr(self, name) is not None for name in STRATEGY_FIELDS)

    def completed(self) -> Strategy:
        """This strategy with every field it leaves open (None) at its :data:`PLAIN_STRATEGY` value."""
        return dataclasses.replace(
            self, **{k: v for k, v in PLAIN_STRATEGY.items() if getattr(self, k) is None}
        )

    def short_name(self) -> str:
        """The one short name of a strategy, wherever one is shown (plans, jobs, the runtime's events)::

            tp{tp}-pp{pp}-dp{dp}-ep{ep}[-cp{cp}][-vpp{vpp}][-z{zero_stage}][-r{sel|full}][-sp]

        The four degrees always; ``cp``/``vpp`` above 1, the ZeRO stage above 0, the recompute mode other than
        ``none`` and ``sp`` (sequence parallelism, only with ``tp > 1``: it is a no-op without) when set, in
        that order: ``tp1-pp1-dp2-ep1``, ``tp2-pp4-dp8-ep2-cp2-z1-rsel``, ``tp8-pp8-dp16-ep1-z1-rfull-sp``.
        ``micro_batch_size`` is left out (a batching choice, not a layout: a job keeps its name across batch
        sizes), and so is ``order`` (a placement, not a layout: the runtime places ranks in it).
        Open fields are named at their :data:`PLAIN_STRATEGY` value."""
        s = self.completed()
        parts = [f"tp{s.tp}", f"pp{s.pp}", f"dp{s.dp}", f"ep{s.ep}"]
        if s.cp > 1:
            parts.append(f"cp{s.cp}")
        if s.vpp > 1:
            parts.append(f"vpp{s.vpp}")
        if s.zero_stage:
            parts.append(f"z{s.zero_stage}")
        if s.recompute != "none":
            parts.append(f"r{RECOMPUTE_SHORT[s.recompute]}")
        if s.sequence_parallel and s.tp > 1:
            parts.append("sp")
        return "-".join(parts)


def stage_split_problem(split, pp: int, num_layers: int | None = None) -> str:
    """Why ``split`` cannot be ``layers_per_stage`` of ``pp`` stages (of ``num_layers`` layers, when given);
    "" when it can."""
    if len(split) != pp:
        return f"must list one layer count per pipeline stage (pp={pp}), got {len(split)}"
    if num_layers is not None and sum(split) != num_layers:
        return f"must sum to num_layers ({num_layers}), got {sum(split)} ({', '.join(map(str, split))})"
    return ""


def _layers_per_stage(c: _Checker, pp: int | None, vpp: int | None) -> tuple[int, ...] | None:
    """``strategy.layers_per_stage``: null, or a list of integers >= 1, one per stage (``pp`` of them when
    ``pp`` is given); uneven only with ``vpp = 1``. The sum is checked against the model where the model is
    known (``workers.planner.search.layout_errors``)."""
    name = "layers_per_stage"
    value = c.get(name)
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not value:
        c.fail(name, f"must be a non-empty list of layer counts, one per pipeline stage, got {value!r}")
        return None
    if len(value) > MAXIMA["pp"]:
        c.fail(name, f"must have at most {MAXIMA['pp']:,.0f} stages, got {len(value):,}")
        return None
    bad = [
        f"stage {i}: {v!r}"
        for i, v in enumerate(value)
        if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v or v < 1
    ]
    if bad:
        shown = ", ".join(bad[:4]) + (", …" if len(bad) > 4 else "")
        c.fail(name, f"entries must be integers >= 1 (every stage holds a layer), got {shown}")
        return None
    split = tuple(int(v) for v in value)
    if any(v > MAXIMA["num_layers"] for v in split):
        c.fail(name, f"entries must be <= {MAXIMA['num_layers']:,.0f} (more than any model has)")
        return None
    if pp is not None and (problem := stage_split_problem(split, pp)):
        c.fail(name, problem)
        return None
    if vpp is not None and vpp > 1 and len(set(split)) > 1:
        c.fail(
            name,
            f"uneven stages ({', '.join(map(str, split))}) need vpp = 1, got vpp={vpp}: interleaved 1F1B "
            "with uneven stages is not supported",
        )
        return None
    return split


def strategy_short_name(doc: dict[str, Any] | None) -> str:
    """:meth:`Strategy.short_name` of a (partial) ``strategy.json`` document; omitted fields count as their
    :data:`PLAIN_STRATEGY` value. Raises :class:`SpecError` when the document breaks the contract."""
    return Strategy.from_dict(doc).short_name()


def load_inputs(model: dict, cluster: dict, training: dict) -> tuple[ModelSpec, ClusterSpec, TrainingConfig]:
    """Parse the three documents, reporting the errors of all of them at once (fields prefixed with
    ``model.``, ``cluster.``, ``training.``)."""
    errors: dict[str, list[str]] = {}
    out = []
    for prefix, cls, data in (
        ("model", ModelSpec, model),
        ("cluster", ClusterSpec, cluster),
        ("training", TrainingConfig, training),
    ):
        try:
            out.append(cls.from_dict(data))
        except SpecError as exc:
            errors.update(exc.prefixed(prefix).errors)
            out.append(None)
    if errors:
        raise SpecError(errors)
    return out[0], out[1], out[2]


# fields whose value is one of a fixed set, wherever they appear
FIELD_CHOICES = {
    "activation": ACTIVATIONS,
    "dtype": DTYPES,
    "optimizer": OPTIMIZERS,
    "recompute": RECOMPUTE_MODES,
}
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def document_schema(cls: type) -> dict[str, Any]:
    """The JSON schema (OpenAPI 3.0 dialect) of the document a dataclass is read from: a property per field,
    typed from its annotation and described by the docstring under it. With a ``from_dict`` parser, the
    required fields are the ones it reports as missing from an empty document and no other key is allowed
    (the parser rejects it); without one (``plan.json``), the fields without a default are required.

    ``document_schema(ModelSpec)`` describes ``model.json``; the API's OpenAPI schema is built from it."""
    import typing

    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        prop = _type_schema(hints[f.name])
        if f.name in FIELD_CHOICES:
            prop["enum"] = [*FIELD_CHOICES[f.name], *([None] if prop.get("nullable") else [])]
        if f.name in docs:
            prop["description"] = docs[f.name]
        properties[f.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if (cls.__doc__ or "").strip():
        schema["description"] = " ".join(cls.__doc__.split("\n\n")[0].split())
    if hasattr(cls, "from_dict"):
        try:
            cls.from_dict({})
            required = []
        except SpecError as exc:
            required = [k for k, msgs in exc.errors.items() if "is required" in msgs]
        schema["additionalProperties"] = False
    else:
        missing = (dataclasses.MISSING,)
        required = [
            f.name for f in dataclasses.fields(cls) if f.default in missing and f.default_factory in missing
        ]
    if required:
        schema["required"] = required
    return schema


def _type_schema(annotation) -> dict[str, Any]:
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return {**(_type_schema(inner[0]) if len(inner) == 1 else {}), "nullable": True}
    if dataclasses.is_dataclass(annotation):
        return document_schema(annotation)
    if origin in (list, tuple):
        return {"type": "array", "items": _type_schema(args[0]) if args else {}}
    if origin is dict or annotation is dict:
        values = _type_schema(args[1]) if len(args) == 2 and args[1] is not Any else {}
        return {"type": "object", "additionalProperties": values or True}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    return {}


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass and of its dataclass bases, read from the source (Python
    keeps no attribute docstrings at run time); none when the source is not there."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError, IndexError, AttributeError):
            continue
        for stmt, following in zip(body, body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(following.value.value.split())
    return docs


__all__ = [
    "ACTIVATIONS",
    "DTYPES",
    "DTYPE_BYTES",
    "OPTIMIZERS",
    "PLAIN_STRATEGY",
    "RECOMPUTE_MODES",
    "RECOMPUTE_SHORT",
    "STRATEGY_FIELDS",
    "FIELD_CHOICES",
    "ClusterSpec",
    "DeviceSpec",
    "LinkSpec",
    "MoESpec",
    "ModelSpec",
    "SpecError",
    "Strategy",
    "TierSpec",
    "TrainingConfig",
    "balanced_stage_split",
    "document_schema",
    "load_inputs",
    "stage_split_problem",
    "stage_split_summary",
    "strategy_short_name",
]
