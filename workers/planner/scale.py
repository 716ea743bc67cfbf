"""Scale a big plan down to one this machine can run, keeping its layout family.

A plan for hundreds of devices cannot run here, but the same *kinds* of parallelism can: ``scale_down``
keeps every degree the plan uses above 1 (tp, pp, cp, ep, dp; and interleaving) at 2 as far as
``max_devices`` allows, dropping the lowest-priority kinds first (tp, pp, cp, ep, then dp, which only
replicates), and shrinks the model (fewer layers, a small hidden size, short sequences, a byte vocabulary)
and the batch so that one step takes well under a second on a CPU rank. Every field that changed is listed
with the reason (:class:`Change`), so a page can show exactly what was scaled.

Pure: no Django, no torch; the control plane stores and launches what it returns.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from .costmodel import DEFAULT_ORDER
from .plan import Plan
from .search import evaluate
from .specs import ClusterSpec, ModelSpec, MoESpec, Strategy, TrainingConfig

# the parallel kinds a layout family is made of, in the order they are kept when devices run short:
# tensor, pipeline and context parallelism shape every rank's work, experts shard the MoE layers (and need
# dp*cp ranks to live on), data parallelism only replicates
KEEP_ORDER = ("tp", "pp", "cp", "ep", "dp")
DEVICE_KINDS = ("tp", "pp", "cp", "dp")  # the degrees that multiply to the device count

SCALED_HIDDEN = 64
SCALED_HEADS = 4
SCALED_SEQ = 64
SCALED_VOCAB = 256  # the runtime trains on bytes
SCALED_EXPERTS = 4


@dataclass(frozen=True)
class Change:
    """One field the scaled plan changed: ``field`` is dotted (``strategy.tp``, ``model.num_layers``)."""

    field: str
    original: Any
    scaled: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ScaledDown:
    """What :func:`scale_down` derived: the documents of the small run, what it kept of the original layout
    family, and every change with its reason. ``plan`` is the planner's prediction on ``cluster`` when a
    target cluster was given."""

    model: ModelSpec
    strategy: Strategy
    training: TrainingConfig
    kept: list[str]
    dropped: list[str]
    changes: list[Change] = field(default_factory=list)
    cluster: ClusterSpec | None = None
    plan: Plan | None = None

    @property
    def devices(self) -> int:
        s = self.strategy
        return s.tp * s.pp * s.dp * s.cp

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(),
            "strategy": self.strategy.to_dict(),
            "training": self.training.to_dict(),
            "cluster": self.cluster.to_dict() if self.cluster else None,
            "plan": self.plan.to_dict() if self.plan else None,
            "devices": self.devices,
            "kept": self.kept,
            "dropped": self.dropped,
            "changes": [c.to_dict() for c in self.changes],
        }


def _round_to(x: float, multiple: int) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def _choose_degrees(s: Strategy, max_devices: int) -> dict[str, int]:
    """Degrees of 1 or 2 per kind: as many of the kinds the original uses as fit in ``max_devices``
    (expert parallelism needs ep | dp*cp), earlier kinds of ``KEEP_ORDER`` first, then fewer devices."""
    used = {k: getattr(s, k) > 1 for k in KEEP_ORDER}
    best, best_key = None, None
    for values in itertools.product(*[(1, 2) if used[k] else (1,) for k in KEEP_ORDER]):
        d = dict(zip(KEEP_ORDER, values, strict=True))
        devices = d["tp"] * d["pp"] * d["cp"] * d["dp"]
        if devices > max_devices or (d["dp"] * d["cp"]) % d["ep"]:
            continue
        kept = [d[k] > 1 for k in KEEP_ORDER]
        key = (sum(kept), *kept, -devices)
        if best_key is None or key > best_key:
            best, best_key = d, key
    return best or dict.fromkeys(KEEP_ORDER, 1)


def _scaled_model(model: ModelSpec, tp: int, pp: int, vpp: int) -> ModelSpec:
    heads = SCALED_HEADS
    if model.num_kv_heads == model.num_attention_heads:
        kv = heads
    else:  # grouped-query attention stays grouped (multi-query stays 1 unless tp needs more)
        kv = max(tp, 1 if model.num_kv_heads == 1 else 2)
    hidden = SCALED_HIDDEN
    ffn = _round_to(hidden * model.ffn_hidden_size / model.hidden_size, 8 * tp)
    layers = pp * vpp * (2 if pp * vpp == 1 else 1)  # one layer per virtual stage, at least two
    moe = None
    if model.moe is not None:
        m = model.moe
        first_dense = min(m.first_dense_layers, 1)
        if layers - first_dense < 1:
            layers += pp * vpp
        moe = MoESpec(
            num_experts=min(m.num_experts, SCALED_EXPERTS),
            top_k=min(m.top_k, 2),
            expert_ffn_hidden_size=_round_to(hidden * m.expert_ffn_hidden_size / model.hidden_size, 8 * tp),
            num_shared_experts=min(m.num_shared_experts, 1),
            first_dense_layers=first_dense,
            layer_frequency=min(m.layer_frequency, 2),
            capacity_factor=m.capacity_factor,
            load_imbalance=m.load_imbalance,
        )
    return ModelSpec(
        name=f"{model.name}-scaled",
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=SCALED_VOCAB,
        seq_length=min(model.seq_length, SCALED_SEQ),
        activation=model.activation,
        moe=moe,
        tied_embeddings=model.tied_embeddings,
    )


def scale_down(
    strategy: Strategy | dict,
    model: ModelSpec,
    training: TrainingConfig,
    *,
    max_devices: int,
    target: ClusterSpec | None = None,
) -> ScaledDown:
    """A plan of the same layout family as ``strategy`` that fits ``max_devices`` ranks of a small machine.

    ``target``: this machine as a cluster (its device and links; any size). When given, the scaled plan is
    costed on one node of it with exactly the devices the plan uses (``ScaledDown.cluster`` / ``.plan``).
    """
    s = Strategy.from_dict(strategy) if isinstance(strategy, dict) else strategy
    s = s.completed()
    max_devices = max(1, int(max_devices))
    d = _choose_degrees(s, max_devices)
    vpp = 2 if s.vpp > 1 and d["pp"] > 1 else 1
    scaled_model = _scaled_model(model, d["tp"], d["pp"], vpp)

    original_micro = training.global_batch_size // (s.dp * s.micro_batch_size)
    if d["pp"] > 1:
        micro = 2 * d["pp"]  # 1F1B needs at least pp micro-batches, interleaving a multiple of pp
    else:
        micro = 2 if original_micro > 1 else 1
    scaled_training = dataclasses.replace(training, global_batch_size=d["dp"] * micro, dtype="fp32")
    scaled = dataclasses.replace(
        s,
        tp=d["tp"],
        pp=d["pp"],
        dp=d["dp"],
        ep=d["ep"],
        cp=d["cp"],
        vpp=vpp,
        micro_batch_size=1,
        sequence_parallel=bool(s.sequence_parallel and d["tp"] > 1),
        layers_per_stage=None,  # the scaled model has its own layers: the even split of its stages
        # one node: no switch to keep groups under, and the runtime places ranks in the default order only
        order=DEFAULT_ORDER,
    )
    kept = [k for k in KEEP_ORDER if getattr(s, k) > 1 and d[k] > 1]
    dropped = [k for k in KEEP_ORDER if getattr(s, k) > 1 and d[k] == 1]
    out = ScaledDown(scaled_model, scaled, scaled_training, kept, dropped)
    out.changes = _changes(s, scaled, model, scaled_model, training, scaled_training, dropped, max_devices)
    if target is not None:
        out.cluster = dataclasses.replace(target, num_nodes=1, devices_per_node=out.devices, tiers=())
        out.plan = evaluate(scaled_model, out.cluster, scaled_training, scaled)
        original_devices = s.tp * s.pp * s.dp * s.cp
        out.changes.insert(
            0,
            Change(
                "cluster.devices",
                original_devices,
                out.devices,
                f"one node of {target.name} ({target.device.name}), at most {max_devices} ranks here",
            ),
        )
    return out


def _changes(
    s: Strategy,
    scaled: Strategy,
    model: ModelSpec,
    scaled_model: ModelSpec,
    training: TrainingConfig,
    scaled_training: TrainingConfig,
    dropped: list[str],
    max_devices: int,
) -> list[Change]:
    out: list[Change] = []
    for k in ("tp", "pp", "cp", "ep", "dp", "vpp"):
        a, b = getattr(s, k), getattr(scaled, k)
        if a == b:
            continue
        if b > 1:
            why = "same kind of parallelism at the smallest degree"
        elif k in dropped:
            why = f"dropped: {max_devices} ranks cannot hold every kind at 2 (kept first: {', '.join(KEEP_ORDER)})"
        else:
            why = "needs pp > 1" if k == "vpp" else "dropped with the kinds it depends on"
        out.append(Change(f"strategy.{k}", a, b, why))
    if s.micro_batch_size != scaled.micro_batch_size:
        out.append(Change("strategy.micro_batch_size", s.micro_batch_size, 1, "one sequence per micro-batch"))
    if bool(s.sequence_parallel) != bool(scaled.sequence_parallel):
        out.append(Change("strategy.sequence_parallel", s.sequence_parallel, False, "needs tp > 1"))
    if s.layers_per_stage is not None:
        out.append(
            Change(
                "strategy.layers_per_stage",
                ", ".join(map(str, s.layers_per_stage)),
                "even",
                "the scaled model has one layer per pipeline chunk",
            )
        )
    reasons = {
        "num_layers": "one layer per pipeline chunk: the schedule keeps its shape",
        "hidden_size": "small enough for a step in well under a second on a CPU rank",
        "num_attention_heads": "4 heads of 16",
        "num_kv_heads": "the same attention kind (multi-head or grouped-query), divisible by tp",
        "ffn_hidden_size": "the original's ratio to the hidden size, divisible by tp",
        "vocab_size": "the runtime here trains on bytes",
        "seq_length": "short sequences (divisible by 2*cp and tp)",
    }
    for k, why in reasons.items():
        a, b = getattr(model, k), getattr(scaled_model, k)
        if a != b:
            out.append(Change(f"model.{k}", a, b, why))
    if model.moe is not None and scaled_model.moe is not None:
        for k in ("num_experts", "top_k", "expert_ffn_hidden_size", "num_shared_experts", "first_dense_layers",
                  "layer_frequency"):  # fmt: skip
            a, b = getattr(model.moe, k), getattr(scaled_model.moe, k)
            if a != b:
                out.append(
                    Change(f"model.moe.{k}", a, b, "a small MoE of the same shape (ep divides the experts)")
                )
    gbs, sgbs = training.global_batch_size, scaled_training.global_batch_size
    if gbs != sgbs:
        micro = sgbs // (scaled.dp * scaled.micro_batch_size)
        why = (
            f"dp × {micro} micro-batches: 1F1B needs at least pp"
            if scaled.pp > 1
            else f"dp × {micro} micro-batch{'es' if micro > 1 else ''} of one sequence"
        )
        out.append(Change("training.global_batch_size", gbs, sgbs, why))
    if training.dtype != scaled_training.dtype:
        out.append(Change("training.dtype", training.dtype, scaled_training.dtype, "CPU ranks train in fp32"))
    return out
