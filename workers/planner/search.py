"""Enumerate every valid parallel layout, prune by memory (and the user's limits), cost the rest, rank
them by an objective (throughput unless asked otherwise).

``evaluate`` costs one complete strategy; ``search`` costs all layouts compatible with a partial one.
Both go through :class:`~workers.planner.costmodel.CostModel` on numpy arrays (one element per layout),
so a million layouts cost a few hundred numpy operations, not a million Python calls.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from .costmodel import CANDIDATE_ORDERS, DEFAULT_ORDER, RECOMPUTE_CODES, CostModel, GiB, Layouts, dense_order
from .energy import device_power_profile, plan_energy
from .hardware import Efficiency, efficiency_for, profile_origin
from .moe import MeasuredExpertLoad
from .plan import NothingFits, Plan, SearchResult
from .specs import (
    ClusterSpec,
    ModelSpec,
    SpecError,
    Strategy,
    TrainingConfig,
    balanced_stage_split,
    stage_split_problem,
    stage_split_summary,
)

CANDIDATES_CAP = 3000
PARETO_CAP = 200
# the best layouts (by the objective, timed in the pinned or default order) whose placement the search
# then tries in every CANDIDATE_ORDERS order; the rest of the grid keeps the default placement
ORDER_POOL = 256
CHUNK_ROWS = 400_000

# rejection reasons (keys of stats["rejected"])
R_TP = "tp does not divide attention/kv heads (or ffn sizes)"
R_CP = "cp does not divide seq_length"
R_PP = "pp exceeds num_layers"
R_DP = "dp does not divide global_batch_size"
R_EP = "ep does not divide num_experts and dp*cp"
R_VPP = "vpp does not divide layers per stage (or pp == 1)"
R_VPP_UNEVEN = "vpp > 1 with uneven pipeline stages (not supported)"
R_INTERLEAVE = "interleaved schedule needs micro-batches divisible by pp"
R_MBS = "micro_batch_size does not divide the batch per replica"
R_MEM = "exceeds device memory"

# what a search may rank by (``objective``) and the limits a user may set (``constraints``)
OBJECTIVES = {
    "throughput": "most tokens/s first",
    "memory_headroom": "most free memory per device first",
    "communication_volume": "fewest bytes communicated per device per step first",
    "energy": "most tokens per kWh of predicted board energy first",
}
CONSTRAINTS = {
    "max_memory_GiB_per_device": "predicted peak memory per device, GiB (> 0)",
    "max_bubble_fraction": "predicted pipeline bubble share of a step (0..1)",
}
MAX_MEMORY_LIMIT_GiB = 1e6  # a typo or a hostile 1e300 is an error, not a limit (1,000x the largest device)


def _constraint_reason(name: str, limit: float) -> str:
    """The ``stats["rejected"]`` reason of a user constraint."""
    if name == "max_memory_GiB_per_device":
        return f"predicted peak memory above max_memory_GiB_per_device ({limit:g} GiB)"
    return f"predicted pipeline bubble above max_bubble_fraction ({limit:g})"


def checked_ranking(
    objective: str | None = "throughput", constraints: dict | None = None, cluster: ClusterSpec | None = None
) -> tuple[str, dict[str, float]]:
    """``(objective, constraints)`` of a search, checked: a :class:`SpecError` (a ValueError) naming the
    field (``objective``, ``constraints.<name>``), what is wrong and what is allowed. ``None`` values are
    dropped (no limit). With ``cluster``, ``energy`` also needs the device's power (its ``tdp_watts``)."""
    objective = "throughput" if objective is None else objective
    if objective not in OBJECTIVES:
        allowed = "; ".join(f"{k} ({v})" for k, v in OBJECTIVES.items())
        raise SpecError("objective", f"must be one of: {allowed}; got {objective!r}")
    if constraints is None:
        constraints = {}
    if not isinstance(constraints, dict):
        raise SpecError(
            "constraints", f"must be an object with any of {', '.join(CONSTRAINTS)}, got {constraints!r}"
        )
    errors: dict[str, list[str]] = {}
    out: dict[str, float] = {}
    for name, value in constraints.items():
        field = f"constraints.{name}"
        if name not in CONSTRAINTS:
            errors[field] = [f"is not a constraint; allowed: {', '.join(CONSTRAINTS)}"]
            continue
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if name == "max_memory_GiB_per_device" and not (number and 0 < value <= MAX_MEMORY_LIMIT_GiB):
            errors[field] = [f"must be a number of GiB > 0 (and <= {MAX_MEMORY_LIMIT_GiB:g}), got {value!r}"]
        elif name == "max_bubble_fraction" and not (number and 0 <= value <= 1):
            errors[field] = [f"must be a fraction of the step between 0 and 1, got {value!r}"]
        else:
            out[name] = float(value)
    if errors:
        raise SpecError(errors)
    if objective == "energy" and cluster is not None and device_power_profile(cluster) is None:
        raise SpecError(
            "objective",
            f"energy needs the device's power: {cluster.device.name!r} has no tdp_watts here; set the "
            "cluster's device.tdp_watts (board power in W, from its datasheet) or rank by another objective",
        )
    return objective, out


@dataclasses.dataclass(frozen=True)
class Ranking:
    """How a search orders and filters its feasible layouts: the objective and the user's limits."""

    objective: str = "throughput"
    max_memory_bytes: float | None = None
    max_bubble_fraction: float | None = None
    power: tuple[float, float] | None = None
    """(idle, board) watts per device, for ``energy``."""

    @classmethod
    def of(cls, objective: str, constraints: dict[str, float], cluster: ClusterSpec) -> Ranking:
        power = None
        if objective == "energy":
            profile = device_power_profile(cluster)
            power = (float(profile.get("idle_watts") or 0.0), float(profile["tdp_watts"]))
        memory = constraints.get("max_memory_GiB_per_device")
        return cls(
            objective,
            None if memory is None else memory * GiB,
            constraints.get("max_bubble_fraction"),
            power,
        )

    @property
    def needs(self) -> tuple[str, ...]:
        """The timing arrays (beyond step, volume and exposed) this ranking reads."""
        return (("bubble",) if self.max_bubble_fraction is not None else ()) + (
            ("compute", "optimizer") if self.objective == "energy" else ()
        )

    def key(self, vals: dict[str, np.ndarray], headroom: np.ndarray) -> np.ndarray:
        """One complex sort key per layout, smallest best: the objective, then (its ties) throughput; for
        ``throughput`` itself the ties go to the larger memory headroom."""
        step = np.round(vals["step"], 9)  # equally fast to 1 ns
        if self.objective == "throughput":
            return step - 1j * headroom
        if self.objective == "memory_headroom":
            return -np.round(headroom) + 1j * step  # to the byte
        if self.objective == "communication_volume":
            return np.round(vals["volume"]) + 1j * step
        # energy: tokens per kWh = tokens per step / (devices x joules per device per step), and the tokens
        # per step and the devices are the same for every layout, so the least joules per device per step
        # wins: W x step = idle x step + (tdp - idle) x busy (energy.py, W = idle + (tdp - idle) x u)
        idle, tdp = self.power
        busy = np.clip(vals["compute"] + vals["optimizer"], 0.0, vals["step"])
        return np.round(idle * vals["step"] + (tdp - idle) * busy, 6) + 1j * step


THROUGHPUT = Ranking()


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


# ------------------------------------------------------------------------------------------------
# Divisibility rules, shared by evaluate (as field errors) and the enumeration (as rejection counts)
# ------------------------------------------------------------------------------------------------


def tp_rule(model: ModelSpec, tp: int) -> str | None:
    if model.num_attention_heads % tp or model.num_kv_heads % tp:
        return f"tp={tp} must divide num_attention_heads ({model.num_attention_heads}) and num_kv_heads ({model.num_kv_heads})"
    if model.ffn_hidden_size % tp or (model.moe and model.moe.expert_ffn_hidden_size % tp):
        return f"tp={tp} must divide ffn_hidden_size (and expert_ffn_hidden_size)"
    return None


def cp_rule(model: ModelSpec, cp: int) -> str | None:
    if model.seq_length % cp:
        return f"cp={cp} must divide seq_length ({model.seq_length})"
    return None


def pp_rule(model: ModelSpec, pp: int) -> str | None:
    # pp need not divide the layers (uneven stages, strategy.layers_per_stage), but every stage needs one
    if pp > model.num_layers:
        return (
            f"pp={pp} exceeds num_layers ({model.num_layers}): every pipeline stage needs at least one layer"
        )
    return None


def ep_rule(model: ModelSpec, ep: int, dp: int, cp: int) -> str | None:
    if model.moe is None:
        return None if ep == 1 else f"ep={ep} must be 1 for a dense model"
    if model.moe.num_experts % ep or (dp * cp) % ep:
        return f"ep={ep} must divide num_experts ({model.moe.num_experts}) and dp*cp ({dp * cp})"
    return None


def vpp_rule(model: ModelSpec, pp: int, vpp: int, split: tuple[int, ...] | None = None) -> str | None:
    """``split``: the layers per stage (default: :func:`balanced_stage_split`). Interleaving needs them
    equal: Megatron-LM's and torch's interleaved 1F1B cut every stage into ``vpp`` equal chunks."""
    split = split or balanced_stage_split(model.num_layers, pp)
    if vpp > 1 and len(set(split)) > 1:
        return (
            f"vpp={vpp} needs equal layers per stage; these stages are uneven ({stage_split_text(split)}): "
            "interleaved 1F1B with uneven stages is not supported (use vpp = 1)"
        )
    per_stage = split[0]
    if per_stage % vpp or (vpp > 1 and pp == 1):
        return f"vpp={vpp} must divide the layers per stage ({per_stage}) and needs pp > 1"
    return None


def stage_split_text(split) -> str:
    """``7, 8 x 14, 7``: a stage split with runs of equal counts folded."""
    runs: list[list[int]] = []
    for n in split:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ", ".join(f"{n} x {k}" if k > 2 else ", ".join([str(n)] * k) for n, k in runs)


def stage_split(model: ModelSpec, pp: int, pinned: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Layers per stage of a layout with ``pp`` stages: the ``pinned`` ``strategy.layers_per_stage`` or the
    balanced split (:func:`balanced_stage_split`)."""
    return tuple(pinned) if pinned is not None else balanced_stage_split(model.num_layers, pp)


def stage_split_errors(model: ModelSpec, s: Strategy) -> dict[str, list[str]]:
    """What is wrong with ``s.layers_per_stage`` for this model (its length is checked by the parser when
    ``pp`` is given; here against ``pp`` and the model's ``num_layers``)."""
    if s.layers_per_stage is None:
        return {}
    problem = stage_split_problem(s.layers_per_stage, s.pp or len(s.layers_per_stage), model.num_layers)
    return {"strategy.layers_per_stage": [problem]} if problem else {}


def _pinned_pp(fixed: Strategy) -> int | None:
    """The pp a partial strategy pins: its ``pp``, or the length of a pinned ``layers_per_stage``."""
    return fixed.pp if fixed.layers_per_stage is None else len(fixed.layers_per_stage)


def layout_errors(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingConfig, s: Strategy
) -> dict[str, list[str]]:
    """Every divisibility rule a complete strategy breaks, keyed by ``strategy.<field>``. A layout may take
    fewer devices than the cluster has: part of one node or whole nodes (``ClusterSpec.devices_problem``)."""
    errors: dict[str, list[str]] = {}

    def add(name, msg):
        if msg:
            errors.setdefault(f"strategy.{name}", []).append(msg)

    world = s.tp * s.pp * s.dp * s.cp
    if problem := cluster.devices_problem(world):
        add("dp", f"tp*pp*dp*cp = {world}: {problem}")
    add("tp", tp_rule(model, s.tp))
    add("cp", cp_rule(model, s.cp))
    add("pp", pp_rule(model, s.pp))
    add("ep", ep_rule(model, s.ep, s.dp, s.cp))
    errors.update(stage_split_errors(model, s))
    if not errors.get("strategy.pp") and not errors.get("strategy.layers_per_stage"):
        add("vpp", vpp_rule(model, s.pp, s.vpp, s.layers_per_stage))
    gbs = training.global_batch_size
    if gbs % (s.dp * s.micro_batch_size):
        add(
            "micro_batch_size",
            f"dp*micro_batch_size = {s.dp * s.micro_batch_size} must divide global_batch_size ({gbs})",
        )
    elif s.vpp > 1 and (gbs // (s.dp * s.micro_batch_size)) % s.pp:
        add(
            "vpp",
            f"interleaving needs the {gbs // (s.dp * s.micro_batch_size)} micro-batches to be divisible by pp={s.pp}",
        )
    return errors


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------


def _options(fixed: Any, values: list) -> list:
    return values if fixed is None else [v for v in values if v == fixed] or []


def enumerate_layouts(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingConfig, fixed: Strategy
) -> tuple[np.ndarray, tuple[list, list, list], Counter]:
    """All layouts obeying the divisibility rules and the fixed fields, factored as ``base`` rows
    (tp, cp, pp, dp, ep, vpp, mbs, and with a pinned split the first, heaviest middle and last stage's
    layers) times ``extras`` = (recompute codes, ZeRO stages, sp flags) for :meth:`Layouts.grid`;
    rejections are counted by reason at the level where the rule fires (one count per rejected partial
    layout).

    Each pp gets one stage split: ``fixed.layers_per_stage`` (which pins pp to its length) or the balanced
    split (:func:`balanced_stage_split`: even when pp divides the layers)."""
    n = cluster.num_devices
    gbs = training.global_batch_size
    pinned = fixed.layers_per_stage
    fixed_pp = _pinned_pp(fixed)
    rejected: Counter = Counter()
    blocks: list[np.ndarray] = []
    # a pinned split travels with the rows; the balanced one the cost model works out from pp itself
    # (CostModel.stage_layers), which keeps the common case's grid as small as it was
    columns = 7 if pinned is None else 10
    for tp in _options(fixed.tp, divisors(n)):
        if tp_rule(model, tp):
            rejected[R_TP] += 1
            continue
        for cp in _options(fixed.cp, divisors(n // tp)):
            if cp_rule(model, cp):
                rejected[R_CP] += 1
                continue
            for pp in _options(fixed_pp, divisors(n // (tp * cp))):
                if pp_rule(model, pp):
                    rejected[R_PP] += 1
                    continue
                dp = n // (tp * cp * pp)
                if fixed.dp is not None and dp != fixed.dp:
                    continue
                if gbs % dp:
                    rejected[R_DP] += 1
                    continue
                if model.moe is None:
                    eps = _options(fixed.ep, [1])
                    if fixed.ep not in (None, 1):
                        rejected[R_EP] += 1
                else:
                    eps = []
                    for ep in _options(fixed.ep, divisors(model.moe.num_experts)):
                        if (dp * cp) % ep:
                            rejected[R_EP] += 1
                        else:
                            eps.append(ep)
                    if fixed.ep is not None and model.moe.num_experts % fixed.ep:
                        rejected[R_EP] += 1
                split = stage_split(model, pp, pinned)
                vpps = []
                if len(set(split)) > 1:  # uneven stages: plain 1F1B only
                    vpps = _options(fixed.vpp, [1])
                    if fixed.vpp not in (None, 1):
                        rejected[R_VPP_UNEVEN] += 1
                else:
                    per_stage = split[0]
                    for v in _options(fixed.vpp, divisors(per_stage)):
                        if v > 1 and pp == 1:
                            rejected[R_VPP] += 1
                        else:
                            vpps.append(v)
                    if fixed.vpp is not None and per_stage % fixed.vpp:
                        rejected[R_VPP] += 1
                per_replica = gbs // dp
                mbss = _options(fixed.micro_batch_size, divisors(per_replica))
                if fixed.micro_batch_size is not None and per_replica % fixed.micro_batch_size:
                    rejected[R_MBS] += 1
                if not (eps and vpps and mbss):
                    continue
                # the (ep, vpp, mbs) sub-grid of this (tp, cp, pp) in numpy: a Python loop over it
                # dominated the search time
                ne, nv, nm = len(eps), len(vpps), len(mbss)
                e = np.repeat(np.asarray(eps, dtype=np.int64), nv * nm)
                v = np.tile(np.repeat(np.asarray(vpps, dtype=np.int64), nm), ne)
                b = np.tile(np.asarray(mbss, dtype=np.int64), ne * nv)
                bad = (v > 1) & ((per_replica // b) % pp != 0)
                rejected[R_INTERLEAVE] += int(bad.sum())
                keep = ~bad
                k = int(keep.sum())
                block = np.empty((k, columns), dtype=np.int64)
                block[:, 0], block[:, 1], block[:, 2], block[:, 3] = tp, cp, pp, dp
                block[:, 4], block[:, 5], block[:, 6] = e[keep], v[keep], b[keep]
                if pinned is not None:
                    block[:, 7], block[:, 8], block[:, 9] = stage_split_summary(split)
                blocks.append(block)
    base = np.concatenate(blocks) if blocks else np.zeros((0, columns), dtype=np.int64)
    extras = (
        [RECOMPUTE_CODES[fixed.recompute]] if fixed.recompute else [0, 1, 2],
        [fixed.zero_stage] if fixed.zero_stage is not None else [0, 1, 2, 3],
        [int(fixed.sequence_parallel)] if fixed.sequence_parallel is not None else [0, 1],
    )
    return base, extras, rejected


def _valid_mask(grid: Layouts, fixed: Strategy) -> np.ndarray:
    """Grid cells that are distinct layouts: sequence parallelism is the same layout as none when
    tp == 1, so unless the strategy pins it, keep only sp = 0 there."""
    if fixed.sequence_parallel is not None:
        return np.ones(grid.shape, dtype=bool)
    return np.broadcast_to(~((grid.sp == 1) & (grid.tp == 1)), grid.shape)


# ------------------------------------------------------------------------------------------------
# Costing and results
# ------------------------------------------------------------------------------------------------


def _cost_model(
    model,
    cluster,
    training,
    order: str,
    eff: Efficiency | None,
    expert_load: MeasuredExpertLoad | None = None,
) -> CostModel:
    origin = None
    if eff is None:
        _name, eff = efficiency_for(cluster.device.name)
        origin = profile_origin(cluster.device.name)
    cm = CostModel(model, cluster, training, eff, order=order, expert_load=expert_load)
    cm.efficiency_profile = origin  # where its constants come from: every plan's predicted carries it
    return cm


# why a plan's scaling_efficiency is null (never a made-up 1.0): its baseline was not computed
SCALING_SKIPPED = (
    "not computed: the baseline (best per-device throughput at the smallest device count that fits) was "
    "skipped for this plan"
)
SCALING_NO_BASELINE = "not computed: no layout of this model fits at any device count of this cluster"


def _predicted(
    cm: CostModel,
    i: int,
    mem: dict,
    tm: dict,
    th: dict,
    baseline_per_device: float | None,
    scaling_note: str = SCALING_SKIPPED,
) -> dict[str, Any]:
    """plan.json ``predicted`` of the i-th layout of flat cost arrays. ``scaling_efficiency`` is null, with
    ``scaling_efficiency_note`` (``scaling_note``) saying why, when there is no baseline."""

    def r(x, nd=4):
        return float(round(float(x), nd))

    step = float(tm["step"][i])
    per_device = float(th["tokens_per_s"][i]) / cm.cluster.num_devices
    scaling = per_device / baseline_per_device if baseline_per_device else None
    return {
        "step_time_s": r(step),
        "tokens_per_s": r(th["tokens_per_s"][i], 1),
        "model_tflops_per_device": r(th["model_tflops"][i], 2),
        "hardware_tflops_per_device": r(th["hardware_tflops"][i], 2),
        "mfu": r(th["mfu"][i]),
        "memory_GiB_per_device": {
            k: r(mem[k][i] / GiB, 2) for k in ("params", "grads", "optimizer", "activations", "total")
        },
        "bubble_fraction": r(tm["bubble"][i] / step),
        "comm_s": {k: r(tm[k][i]) for k in ("tp", "pp", "dp", "ep", "cp")},
        "exposed_comm_s": r(tm["exposed"][i]),
        "scaling_efficiency": None if scaling is None else r(scaling),
        # extensions (not in the seed contract): the rest of the breakdown
        **({"scaling_efficiency_note": scaling_note} if scaling is None else {}),
        "compute_s": r(tm["compute"][i]),
        "inline_comm_s": r(tm["inline_comm"][i]),
        "dp_exposed_s": r(tm["dp_exposed"][i]),
        "bubble_s": r(tm["bubble"][i]),
        "optimizer_s": r(tm["optimizer"][i]),
        # the runtime's host-side share of compute_s and optimizer_s (hardware.Framework): only where
        # `cann-train calibrate` measured it (this machine's cpu), absent for the accelerator profiles
        **({"framework_s": r(tm["framework"][i])} if cm.fw.measured else {}),
        "num_micro_batches": int(tm["micro"][i]),
        "memory_headroom_GiB": r((cm.memory_bytes - mem["total"][i]) / GiB, 2),
        "comm_volume_GB_per_device": r(tm["volume"][i] / 1e9, 3),
        # the efficiency profile behind these figures (hardware.profile_origin); its "note" says when they
        # rest on the shipped cpu placeholder (`cann-train calibrate` never ran)
        **({"efficiency_profile": cm.efficiency_profile} if getattr(cm, "efficiency_profile", None) else {}),
    }


def evaluate(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingConfig,
    strategy: Strategy,
    *,
    efficiency: Efficiency | None = None,
    scaling: bool = True,
    expert_load: MeasuredExpertLoad | None = None,
) -> Plan:
    """Cost one complete strategy ("what-if"). Raises :class:`SpecError` when a field is missing or
    breaks a divisibility rule; a layout that does not fit in memory comes back with ``feasible=False``
    and the reason. ``expert_load``: the per-expert load measured by past runs of an MoE model (see
    :class:`~workers.planner.moe.MeasuredExpertLoad`); without it, uniform routing."""
    missing = [f"strategy.{k}" for k, v in strategy.to_dict().items() if v is None]
    if missing:
        raise SpecError({k: ["is required to evaluate a plan (use search to fill it)"] for k in missing})
    errors = layout_errors(model, cluster, training, strategy)
    if errors:
        raise SpecError(errors)
    used = cluster.with_devices(strategy.tp * strategy.pp * strategy.dp * strategy.cp)
    cm = _cost_model(model, used, training, strategy.order, efficiency, expert_load)
    base = (
        baseline_tokens_per_device(model, used, training, cm.eff, expert_load=expert_load)
        if scaling
        else None
    )
    layouts = Layouts.from_strategies([strategy], model.num_layers)
    note = SCALING_NO_BASELINE if scaling else SCALING_SKIPPED
    plan = _plans(cm, layouts, base, strategy.order, strategy.layers_per_stage, scaling_note=note)[0]
    _leave_idle(cluster, used, [plan])
    return plan


def _leave_idle(cluster: ClusterSpec, used: ClusterSpec, plans: list[Plan]) -> dict[str, Any]:
    """Plans costed on ``used``, a part of ``cluster`` (``ClusterSpec.with_devices``): each says in its
    ``predicted`` how many of the cluster's devices it takes (``devices_used``, ``devices_idle``,
    ``idle_note``). Returns the search stats that say the same (``devices_used``, ``nodes_used``, ``note``,
    as ``search_allowing_idle_nodes`` writes them); nothing when ``used`` is all of ``cluster``."""
    if used.num_devices == cluster.num_devices:
        return {}
    idle = cluster.num_devices - used.num_devices
    where = (
        f"{used.num_nodes} of its {cluster.num_nodes} nodes"
        if used.devices_per_node == cluster.devices_per_node
        else "part of one node"
    )
    note = (
        f"uses {used.num_devices} of the cluster's {cluster.num_devices} devices ({where}); the other {idle} "
        f"{'stays' if idle == 1 else 'stay'} idle (not costed, not in the predicted energy)"
    )
    for plan in plans:
        plan.predicted.update(devices_used=used.num_devices, devices_idle=idle, idle_note=note)
    return {"devices_used": used.num_devices, "nodes_used": used.num_nodes, "note": note}


def _with_stage_split(model: ModelSpec, s: Strategy, pinned: tuple[int, ...] | None) -> Strategy:
    """``s`` with its stage split written out when it is pinned or uneven (an even split stays implicit,
    so plans of layouts pp divides keep the contract's fields)."""
    split = stage_split(model, s.pp, pinned)
    if pinned is None and len(set(split)) == 1:
        return s
    return dataclasses.replace(s, layers_per_stage=split)


def _plans(
    cm: CostModel,
    flat: Layouts,
    baseline: float | None,
    order: str,
    pinned: tuple[int, ...] | None = None,
    scaling_note: str = SCALING_SKIPPED,
) -> list[Plan]:
    """Full plans for a (short) flat list of layouts (``pinned``: the search's fixed layers_per_stage;
    ``scaling_note``: why scaling_efficiency is null when ``baseline`` is None)."""
    mem = cm.memory(flat)
    tm = cm.timing(flat)
    th = cm.throughput(flat, tm)
    moe_load = np.broadcast_to(cm.moe_load(flat), (len(flat),))
    power = device_power_profile(cm.cluster)
    # where the groups sit on the switches, against the topology-blind placement (issue 15)
    placements = _placement(cm, flat, tm)
    out = []
    for i in range(len(flat)):
        total = float(mem["total"][i])
        fits = total <= cm.memory_bytes
        reason = (
            ""
            if fits
            else (
                f"needs {total / GiB:.1f} GiB per device; the device has {cm.cluster.device.memory_GiB:g} GiB"
            )
        )
        predicted = _predicted(cm, i, mem, tm, th, baseline, scaling_note)
        if (origin := cm.moe_imbalance_origin()) is not None:
            # busiest EP rank / mean behind comm_s.ep and the expert compute, and how it was found
            predicted["moe_imbalance"] = {"value": round(float(moe_load[i]), 4), **origin}
        # optional extension: predicted energy per step and per 1M tokens (workers/planner/energy.py)
        predicted["energy"] = plan_energy(predicted, cm.cluster.num_devices, power, cm.cluster.device.name)
        predicted["placement"] = placements[i]
        if int(flat.zero[i]) >= 3 and int(flat.dp[i] * flat.cp[i]) > 1:
            # how the framework's ZeRO-3 gathers were charged (hardware.FrameworkCollectives)
            predicted["zero3_collectives"] = cm.collectives.describe()
        strategy = _with_stage_split(cm.model, flat.strategy(i, order), pinned)
        out.append(Plan(strategy, fits, reason, predicted))
    return out


def _with_order(cm: CostModel, order: str) -> CostModel:
    """``cm`` placing ranks in ``order`` (the same model, cluster, efficiency and measured loads)."""
    if order == cm.order:
        return cm
    other = copy.copy(cm)
    other.order = order
    return other


def _placement(cm: CostModel, flat: Layouts, tm: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """plan.json ``predicted.placement`` of each layout: the bytes per device per step that leave a leaf
    switch (the innermost tier; ``by_tier`` for each) in ``cm``'s order and in the topology-blind
    :data:`~workers.planner.costmodel.DEFAULT_ORDER` with the same degrees, and the saving."""
    blind_cm = _with_order(cm, DEFAULT_ORDER)
    blind_tm = tm if blind_cm is cm else blind_cm.timing(flat)
    n = len(flat)
    mine = {k: np.broadcast_to(v, (n,)) for k, v in cm.cross_switch_bytes(flat, tm).items()}
    blind = {k: np.broadcast_to(v, (n,)) for k, v in blind_cm.cross_switch_bytes(flat, blind_tm).items()}
    leaf = cm.cluster.tiers[0].name if cm.cluster.tiers else None
    blind_step = np.broadcast_to(blind_tm["step"], (n,))
    out = []
    for i in range(n):
        ours = float(mine[leaf][i]) if leaf else 0.0
        theirs = float(blind[leaf][i]) if leaf else 0.0
        block: dict[str, Any] = {
            "order": cm.order,
            "cross_switch_GB_per_step": round(ours / 1e9, 3),
            "by_tier_GB_per_step": {k: round(float(v[i]) / 1e9, 3) for k, v in mine.items()},
            "topology_blind": {
                "order": DEFAULT_ORDER,
                "cross_switch_GB_per_step": round(theirs / 1e9, 3),
                "step_time_s": round(float(blind_step[i]), 4),
            },
            "saving_pct": round(100.0 * (1.0 - ours / theirs), 1) if theirs > 0 else 0.0,
        }
        if ours == 0.0:
            block["note"] = (
                "nothing leaves a leaf switch: every group fits under one"
                if leaf
                else "the cluster lists no switch tiers: every node under one switch, nothing crosses"
            )
        out.append(block)
    return out


def _best_orders(
    cm: CostModel, flat: Layouts, vals: dict[str, np.ndarray], pool: np.ndarray, orders: list[str]
) -> np.ndarray:
    """Index into ``orders`` of the placement of least step time for each layout of ``flat`` (0, the
    pinned or default order, for those outside ``pool`` and for ties); ``vals`` (the timing arrays of the
    scan) are updated in place for the layouts that move."""
    chosen = np.zeros(len(flat), dtype=np.int64)
    if len(orders) < 2 or not len(pool):
        return chosen
    sub = flat.take(pool)
    best = vals["step"][pool].copy()
    for j, order in enumerate(orders[1:], start=1):
        tm = _with_order(cm, order).timing(sub)
        step = np.broadcast_to(tm["step"], best.shape)
        better = step < best * (1.0 - 1e-9)
        if not better.any():
            continue
        best = np.where(better, step, best)
        moved = pool[better]
        chosen[moved] = j
        for k in vals:
            if k != "memory":
                vals[k][moved] = np.broadcast_to(tm[k], best.shape)[better]
    return chosen


def _orders_to_try(fixed: Strategy, pinned: bool) -> list[str]:
    """The placements a search times: the pinned one alone, else one order of each distinct dense
    placement of :data:`CANDIDATE_ORDERS`, the default first."""
    if pinned or fixed.is_complete:
        return [fixed.order]
    out: list[str] = []
    for order in CANDIDATE_ORDERS:
        if dense_order(order) not in {dense_order(o) for o in out}:
            out.append(order)
    return out


def _dominated_by(ax, ah, ac, x, h, c) -> np.ndarray:
    """Which of (x, h, c) some anchor (ax, ah, ac) is at least as good as on all three objectives."""
    out = np.zeros(len(x), dtype=bool)
    step = max(1, 2_000_000 // max(1, len(ax)))
    for s in range(0, len(x), step):
        bx, bh, bc = x[s : s + step, None], h[s : s + step, None], c[s : s + step, None]
        out[s : s + step] = ((ax[None, :] >= bx) & (ah[None, :] >= bh) & (ac[None, :] <= bc)).any(axis=1)
    return out


def _pareto_sweep(x, h, c) -> np.ndarray:
    """Exact front of points already sorted best-throughput-first: a point can only be dominated by one
    that sorts before it, so each block is checked against the front so far, then within itself."""
    front_x = front_h = front_c = np.empty(0)
    keep: list[np.ndarray] = []
    block = 512
    for start in range(0, len(x), block):
        bx, bh, bc = x[start : start + block], h[start : start + block], c[start : start + block]
        idx = np.arange(start, start + len(bx))
        if len(front_x):
            alive = ~_dominated_by(front_x, front_h, front_c, bx, bh, bc)
            bx, bh, bc, idx = bx[alive], bh[alive], bc[alive], idx[alive]
        # an earlier point of the block at least as good everywhere dominates (or duplicates) it
        geq = (bx[None, :] >= bx[:, None]) & (bh[None, :] >= bh[:, None]) & (bc[None, :] <= bc[:, None])
        sel = ~(geq & np.tri(len(bx), k=-1, dtype=bool)).any(axis=1)
        keep.append(idx[sel])
        front_x = np.concatenate([front_x, bx[sel]])
        front_h = np.concatenate([front_h, bh[sel]])
        front_c = np.concatenate([front_c, bc[sel]])
    return np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64)


def pareto_indices(tokens: np.ndarray, headroom: np.ndarray, volume: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on all of (tokens max, headroom max, volume min),
    best throughput first, exact duplicates kept once.

    numpy has no skyline routine, so: sort by throughput, take the exact front of the fastest few
    thousand, drop every later point it dominates (a point dominated by a front point is dominated, so
    no front point is lost), and repeat on the survivors."""
    # one complex argsort sorts by (-tokens, -headroom) lexicographically, ~3x faster than lexsort;
    # fall back to the 3-key lexsort only if equal (tokens, headroom) pairs differ in volume
    order = np.argsort(-tokens - 1j * headroom)
    x, h, c = tokens[order], headroom[order], volume[order]
    if ((x[1:] == x[:-1]) & (h[1:] == h[:-1]) & (c[1:] != c[:-1])).any():
        order = np.lexsort((volume, -headroom, -tokens))
        x, h, c = tokens[order], headroom[order], volume[order]
    front = np.zeros(0, dtype=np.int64)
    remaining = np.arange(len(x))
    while len(remaining):
        head, rest = remaining[:4096], remaining[4096:]
        if len(front):
            head = head[~_dominated_by(x[front], h[front], c[front], x[head], h[head], c[head])]
        front = np.concatenate([front, head[_pareto_sweep(x[head], h[head], c[head])]])
        # a few spread-out front points remove most of the rest cheaply, the whole front the others
        for a in (front[:: max(1, len(front) // 24)], front):
            if len(rest):
                rest = rest[~_dominated_by(x[a], h[a], c[a], x[rest], h[rest], c[rest])]
        remaining = rest
    return order[front]


class _Scan:
    """Feasible layouts of one grid as flat arrays, and the counts of the scan."""

    def __init__(self):
        self.parts: list[tuple[Layouts, dict[str, np.ndarray]]] = []
        self.evaluated = 0
        self.feasible = 0
        self.memory_rejected = 0
        self.lowest_rejected: float | None = None
        # layouts a user constraint rejected (name -> count) and the least each rejected one asked for
        self.constraint_rejected: Counter = Counter()
        self.constraint_lowest: dict[str, float] = {}
        self.cancelled = False
        self.best_key = (np.inf, np.inf)
        self.best_plan: dict | None = None

    def reject(self, name: str, values: np.ndarray) -> None:
        """Count layouts the user constraint ``name`` rejected (``values``: what each of them needs)."""
        self.constraint_rejected[name] += len(values)
        low = float(values.min())
        self.constraint_lowest[name] = min(self.constraint_lowest.get(name, low), low)

    def joined(self) -> tuple[Layouts, dict[str, np.ndarray]]:
        names = [name for name, _a in self.parts[0][0].arrays()]
        flat = Layouts(**{n: np.concatenate([getattr(p[0], n) for p in self.parts]) for n in names})
        vals = {k: np.concatenate([p[1][k] for p in self.parts]) for k in self.parts[0][1]}
        return flat, vals


def _scan(
    cm: CostModel,
    base: np.ndarray,
    extras: tuple[list, list, list],
    fixed: Strategy,
    progress=None,
    should_stop=None,
    memory_only: bool = False,
    ranking: Ranking = THROUGHPUT,
) -> _Scan:
    """Memory for every layout of the grid, time for those that fit, in chunks of base rows; the
    ``ranking``'s limits reject layouts after the device's own memory (the memory limit before costing,
    the bubble limit after), and its key picks the best so far that ``progress`` reports."""
    scan = _Scan()
    if not len(base):
        return scan
    per_row = len(extras[0]) * len(extras[1]) * len(extras[2])
    rows_per_chunk = max(1, CHUNK_ROWS // per_row)
    for start in range(0, len(base), rows_per_chunk):
        if should_stop is not None and should_stop():
            scan.cancelled = True
            break
        chunk = base[start : start + rows_per_chunk]
        grid = Layouts.grid(chunk, *extras)
        valid = _valid_mask(grid, fixed)
        total = np.broadcast_to(cm.memory(grid, parts=False)["total"], grid.shape)
        ok = valid & (total <= cm.memory_bytes)
        bad = valid & ~ok
        scan.evaluated += int(valid.sum())
        if bad.any():
            scan.memory_rejected += int(bad.sum())
            low = float(total[bad].min())
            scan.lowest_rejected = low if scan.lowest_rejected is None else min(scan.lowest_rejected, low)
        if ranking.max_memory_bytes is not None:
            over = ok & (total > ranking.max_memory_bytes)
            if over.any():
                scan.reject("max_memory_GiB_per_device", total[over] / GiB)
                ok = ok & ~over
        rows_ok = ok.reshape(len(chunk), -1).any(axis=1)
        if memory_only:
            scan.feasible += int(ok.sum())
        elif rows_ok.any():
            sub = Layouts.grid(chunk[rows_ok], *extras)
            ok_sub = ok[rows_ok]
            tm = cm.timing(sub)
            idx = np.nonzero(ok_sub)
            shape = ok_sub.shape
            vals = {
                k: np.broadcast_to(tm[k], shape)[idx] for k in ("step", "volume", "exposed", *ranking.needs)
            }
            vals["memory"] = total[rows_ok][idx]
            flat = sub.flat(idx)
            if ranking.max_bubble_fraction is not None:
                share = vals["bubble"] / vals["step"]
                over = share > ranking.max_bubble_fraction
                if over.any():
                    scan.reject("max_bubble_fraction", share[over])
                    keep = np.nonzero(~over)[0]
                    vals = {k: v[keep] for k, v in vals.items()}
                    flat = flat.take(keep)
            if len(vals["step"]):
                scan.parts.append((flat, vals))
                scan.feasible += len(vals["step"])
            if progress is not None and len(vals["step"]):
                key = ranking.key(vals, cm.memory_bytes - vals["memory"])
                i = int(np.argmin(key))
                if (key[i].real, key[i].imag) < scan.best_key:
                    scan.best_key = (float(key[i].real), float(key[i].imag))
                    best = _plans(cm, flat.take([i]), None, fixed.order, fixed.layers_per_stage)[0]
                    scan.best_plan = best.to_dict()
        if progress is not None:
            progress(
                scan.evaluated, scan.feasible, scan.best_plan, min(1.0, (start + len(chunk)) / len(base))
            )
    return scan


_BASELINE_CACHE: dict[str, float | None] = {}


def clear_caches() -> None:
    """Forget cached scaling baselines (benchmarks measure cold searches)."""
    _BASELINE_CACHE.clear()


def _device_counts(cluster: ClusterSpec) -> list[ClusterSpec]:
    """Smaller clusters of the same kind, ascending: part of one node, then whole nodes
    (powers of two and divisors of the node count)."""
    out = []
    dpn = cluster.devices_per_node
    for d in divisors(dpn)[:-1]:
        out.append(
            ClusterSpec(
                name=f"{cluster.name}[{d} devices]",
                num_nodes=1,
                devices_per_node=d,
                device=cluster.device,
                intra_node=cluster.intra_node,
                inter_node=cluster.inter_node,
                tiers=cluster.tiers,
            )
        )
    nodes = set(divisors(cluster.num_nodes))
    k = 1
    while k < cluster.num_nodes:
        nodes.add(k)
        k *= 2
    out.extend(cluster.with_nodes(n) for n in sorted(nodes))
    return out


def baseline_tokens_per_device(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingConfig,
    eff: Efficiency,
    known_best: float | None = None,
    expert_load: MeasuredExpertLoad | None = None,
) -> float | None:
    """Best tokens/s per device of the same model and global batch on the smallest device count where
    any layout fits: the denominator of ``scaling_efficiency`` (per-device throughput at this size over
    this). ``known_best``: the best tokens/s per device of a free search on ``cluster`` itself, if
    already known. Cached per (model, training, device, links, efficiency)."""
    cdict = cluster.to_dict()
    cdict.pop("name")
    key = json.dumps(
        [model.to_dict(), training.to_dict(), cdict, repr(eff), repr(expert_load)], sort_keys=True
    )
    if key in _BASELINE_CACHE:
        return _BASELINE_CACHE[key]
    result = None
    for small in _device_counts(cluster):
        cm = CostModel(model, small, training, eff, expert_load=expert_load)
        base, (rcs, _zeros, _sps), _ = enumerate_layouts(model, small, training, Strategy())
        # the least memory of a base row is at ZeRO-3 with sequence parallelism (both only ever shrink
        # memory), so checking those first finds the smallest size that fits at a fraction of the cost
        probe = _scan(cm, base, (rcs, [3], [0, 1]), Strategy(), memory_only=True)
        if not probe.feasible:
            continue
        if small.num_devices == cluster.num_devices and known_best is not None:
            result = known_best
            break
        scan = _scan(cm, base, (rcs, [0, 1, 2, 3], [0, 1]), Strategy())
        _flat, vals = scan.joined()
        tokens = training.global_batch_size * model.seq_length / vals["step"]
        result = float(tokens.max()) / small.num_devices
        break
    _BASELINE_CACHE[key] = result
    return result


def _dp_degrees_allowed(model: ModelSpec, cluster: ClusterSpec, fixed: Strategy) -> list[int]:
    """The data-parallel degrees left once tp, cp and pp obey the model's shape (and the fixed fields)."""
    n, out = cluster.num_devices, set()
    for tp in _options(fixed.tp, divisors(n)):
        if tp_rule(model, tp):
            continue
        for cp in _options(fixed.cp, divisors(n // tp)):
            if cp_rule(model, cp):
                continue
            for pp in _options(_pinned_pp(fixed), divisors(n // (tp * cp))):
                dp = n // (tp * cp * pp)
                if not pp_rule(model, pp) and fixed.dp in (None, dp):
                    out.add(dp)
    return sorted(out)


def _batch_message(model: ModelSpec, cluster: ClusterSpec, training: TrainingConfig, fixed: Strategy) -> str:
    """When the global batch is what blocks every layout: the degrees the device count leaves to dp (none
    of which divides the batch) and the nearest batches that would work; "" when the batch is not it."""
    gbs = training.global_batch_size
    dps = _dp_degrees_allowed(model, cluster, fixed)
    if not dps or any(gbs % dp == 0 for dp in dps):
        return ""
    below = max((gbs // dp * dp for dp in dps if gbs // dp), default=0)
    above = min(-(-gbs // dp) * dp for dp in dps)
    shown = ", ".join(map(str, dps[:6])) + (", …" if len(dps) > 6 else "")
    return (
        f"global_batch_size {gbs} is not divisible by any data-parallel degree these {cluster.num_devices} "
        f"devices leave (dp ∈ {{{shown}}} once tp, cp and pp fit the model) — use a global batch one of them "
        f"divides, e.g. {' or '.join(str(b) for b in (below, above) if b)}"
    )


def _constraint_message(scan: _Scan, constraints: dict[str, float]) -> str:
    """When the user's limits rejected every layout that fits the device: which limit rejected how many,
    the least a layout needs, and what to relax (one " — " before the change, as ``_tightest``)."""
    whys, changes = [], []
    if n := scan.constraint_rejected.get("max_memory_GiB_per_device"):
        limit, low = (
            constraints["max_memory_GiB_per_device"],
            scan.constraint_lowest["max_memory_GiB_per_device"],
        )
        whys.append(
            f"max_memory_GiB_per_device = {limit:g} rejected {n:,} layouts that fit the device "
            f"(the leanest needs {low:.2f} GiB per device)"
        )
        changes.append(
            f"raise max_memory_GiB_per_device to at least {math.ceil(low * 100) / 100:g} GiB (or add nodes)"
        )
    if n := scan.constraint_rejected.get("max_bubble_fraction"):
        limit, low = constraints["max_bubble_fraction"], scan.constraint_lowest["max_bubble_fraction"]
        whys.append(
            f"max_bubble_fraction = {limit:g} rejected {n:,} layouts that fit in memory "
            f"(the smallest predicted bubble is {low:.3f})"
        )
        changes.append(
            f"raise max_bubble_fraction to at least {math.ceil(low * 1000) / 1000:g}, or pin pp to fewer "
            "stages"
        )
    return "; ".join(whys) + " — " + ", or ".join(changes)


def _tightest(cm: CostModel, lowest: float | None, rejected: Counter, fixed: Strategy) -> str:
    """The message a user gets when nothing fits."""
    if lowest is not None:
        free = [k.upper() for k in ("tp", "pp") if getattr(fixed, k) is None]
        hint = "add nodes" + (f" or raise {'/'.join(free)}" if free else " or unpin fields of the strategy")
        return (
            f"needs ≥ {lowest / GiB:.1f} GiB per device at best; the device has "
            f"{cm.cluster.device.memory_GiB:g} GiB — {hint}"
        )
    if batch := _batch_message(cm.model, cm.cluster, cm.training, fixed):
        return batch
    if rejected:
        reason, n = rejected.most_common(1)[0]
        return f"no layout obeys the divisibility rules; most rejections: {reason} ({n})"
    return "no layout matches the fixed strategy fields"


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingConfig,
    fixed: Strategy | dict | None = None,
    top_k: int = 10,
    progress: Callable[[int, int, dict | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    *,
    efficiency: Efficiency | None = None,
    scaling: bool = True,
    raise_if_empty: bool = False,
    objective: str = "throughput",
    constraints: dict | None = None,
    expert_load: MeasuredExpertLoad | None = None,
) -> SearchResult:
    """Find the best layouts that fit: the fastest, or the best by ``objective``.

    ``fixed`` pins any subset of strategy fields (None/absent = search it); with every field pinned the
    result holds exactly that plan ("what-if"). ``progress(evaluated, feasible, best_plan_dict, fraction)``
    is called once per chunk (a handful of times; ``fraction`` of the layout grid scanned, 0..1); ``should_stop()`` is polled between chunks and ends the
    search early with ``stats['cancelled'] = True`` (the result holds what was found so far). When
    nothing fits the result has ``best=None`` and ``stats['tightest']`` names the tightest constraint;
    with ``raise_if_empty=True`` :class:`NothingFits` is raised instead.

    ``objective`` (:data:`OBJECTIVES`) orders ``top`` and picks ``best``: ``throughput`` (tokens/s),
    ``memory_headroom`` (free memory per device), ``communication_volume`` (bytes per device per step,
    least first) or ``energy`` (tokens per kWh); ties go to throughput. ``constraints`` (:data:`CONSTRAINTS`)
    reject layouts above ``max_memory_GiB_per_device`` or ``max_bubble_fraction``, counted in
    ``stats['rejected']`` like the device's own limits. A bad value raises :class:`SpecError` (a
    ValueError) naming the field; ``stats`` echoes both. ``expert_load``: as in :func:`evaluate`.
    """
    started = time.perf_counter()
    objective, constraints = checked_ranking(objective, constraints, cluster)
    ranking = Ranking.of(objective, constraints, cluster)
    # a placement the user names is kept; otherwise the search picks one for its best layouts
    order_pinned = (
        bool(fixed.get("order"))
        if isinstance(fixed, dict)
        else fixed is not None and (fixed.order != DEFAULT_ORDER)
    )
    if fixed is None:
        fixed = Strategy()
    elif isinstance(fixed, dict):
        try:
            fixed = Strategy.from_dict(fixed)
        except SpecError as exc:
            raise exc.prefixed("strategy") from None
    whole = cluster
    degrees = (fixed.tp, fixed.pp, fixed.dp, fixed.cp)
    if None not in degrees and not cluster.devices_problem(math.prod(degrees)):
        cluster = cluster.with_devices(math.prod(degrees))  # the devices the pinned degrees take
    if fixed.is_complete:
        errors = layout_errors(model, cluster, training, fixed)
        if errors:
            raise SpecError(errors)
    elif errors := stage_split_errors(model, fixed):
        raise SpecError(errors)
    cm = _cost_model(model, cluster, training, fixed.order, efficiency, expert_load)
    base, extras, rejected = enumerate_layouts(model, cluster, training, fixed)
    scan = _scan(cm, base, extras, fixed, progress, should_stop, ranking=ranking)
    if scan.memory_rejected:
        rejected[R_MEM] += scan.memory_rejected
    for name, n in scan.constraint_rejected.items():
        rejected[_constraint_reason(name, constraints[name])] += n
    stats: dict[str, Any] = {
        "evaluated": scan.evaluated,
        "feasible": scan.feasible,
        "rejected": dict(sorted(rejected.items(), key=lambda kv: -kv[1])),
        "seconds": 0.0,
        "cancelled": scan.cancelled,
        "objective": objective,
        "constraints": constraints,
    }
    if scan.constraint_rejected:
        stats["constraint_rejected"] = dict(scan.constraint_rejected)
    if not scan.feasible:
        if scan.constraint_rejected:
            stats["tightest"] = _constraint_message(scan, constraints)
        else:
            stats["tightest"] = _tightest(cm, scan.lowest_rejected, rejected, fixed)
        stats["seconds"] = round(time.perf_counter() - started, 3)
        stats.update(_leave_idle(whole, cluster, []))
        if raise_if_empty:
            raise NothingFits(stats["tightest"], stats["rejected"], stats)
        return SearchResult(best=None, top=[], pareto=[], stats=stats)

    flat, vals = scan.joined()
    headroom = cm.memory_bytes - vals["memory"]
    # placement is part of the search: the best layouts are timed in every candidate order and each keeps
    # the one of least step time (issue 15)
    orders = _orders_to_try(fixed, order_pinned)
    pool = np.array([], dtype=np.int64)
    if len(orders) > 1:
        first = ranking.key(vals, headroom).real
        n_pool = min(len(first), ORDER_POOL)
        pool = np.argpartition(first, n_pool - 1)[:n_pool] if n_pool < len(first) else np.arange(len(first))
    order_of = _best_orders(cm, flat, vals, pool, orders)
    stats["orders_tried"] = orders
    step = vals["step"]
    tokens = training.global_batch_size * model.seq_length / step
    # best by the objective first (throughput: fastest first; among equally fast layouts, to 1 ns, the one
    # with more memory headroom); ties of any other objective go to the faster layout
    rank_key = ranking.key(vals, headroom)
    k = min(len(step), max(1, top_k))
    top_idx = np.argpartition(rank_key.real, k - 1)[:k] if k < len(step) else np.arange(len(step))
    tie = rank_key.real <= rank_key.real[top_idx].max()
    cand = np.nonzero(tie)[0]
    top_idx = cand[np.argsort(rank_key[cand])][:k]
    pareto_idx = pareto_indices(tokens, headroom, vals["volume"])
    baseline = None
    if scaling:
        free_best = float(tokens.max()) / cluster.num_devices if not fixed.fixed_fields() else None
        baseline = baseline_tokens_per_device(
            model, cluster, training, cm.eff, known_best=free_best, expert_load=expert_load
        )

    wanted = np.unique(np.concatenate([top_idx, pareto_idx[:PARETO_CAP]]))
    plans: dict[int, Plan] = {}
    for j, order in enumerate(orders):
        these = wanted[order_of[wanted] == j]
        if not len(these):
            continue
        costed = _plans(
            _with_order(cm, order),
            flat.take(these),
            baseline,
            order,
            fixed.layers_per_stage,
            scaling_note=SCALING_NO_BASELINE if scaling else SCALING_SKIPPED,
        )
        plans.update(zip(these.tolist(), costed, strict=True))
    top = [plans[int(i)] for i in top_idx]
    pareto = [plans[int(i)] for i in pareto_idx[:PARETO_CAP]]
    stats["pareto_size"] = int(len(pareto_idx))
    stats.update(_leave_idle(whole, cluster, list(plans.values())))
    stats["seconds"] = round(time.perf_counter() - started, 3)
    if progress is not None:
        progress(scan.evaluated, scan.feasible, top[0].to_dict(), 1.0)
    return SearchResult(
        best=top[0],
        top=top,
        pareto=pareto,
        stats=stats,
        candidates_fn=lambda: _candidates(
            flat, tokens, vals, np.argsort(rank_key), pareto_idx, fixed.order, model, fixed.layers_per_stage
        ),
    )


def _candidates(
    flat: Layouts, tokens, vals, order, pareto_idx, placement: str, model: ModelSpec, pinned=None
) -> list[dict[str, Any]]:
    """Compact feasible candidates for a scatter plot: the Pareto points, the fastest, and an even
    subsample of the rest (by rank), up to ``CANDIDATES_CAP``."""
    chosen = set(pareto_idx[: CANDIDATES_CAP // 3].tolist())
    chosen.update(order[: CANDIDATES_CAP // 3].tolist())
    room = CANDIDATES_CAP - len(chosen)
    if room > 0:
        chosen.update(order[:: max(1, len(order) // room)][:room].tolist())
    idx = np.array(sorted(chosen, key=lambda i: vals["step"][i]), dtype=np.int64)
    sub = flat.take(idx)
    share = vals["exposed"][idx] / vals["step"][idx]
    return [
        {
            "strategy": _with_stage_split(model, sub.strategy(j, placement), pinned).to_dict(),
            "tokens_per_s": round(float(tokens[i]), 1),
            "memory_GiB": round(float(vals["memory"][i] / GiB), 2),
            "comm_share": round(float(share[j]), 4),
        }
        for j, i in enumerate(idx)
    ]


# how many smaller node counts a search tries when the whole cluster admits no layout
MAX_FEWER_NODES_TRIES = 128


def without_nodes(cluster: ClusterSpec, lose_nodes: int) -> ClusterSpec:
    """What-if: the cluster after losing ``lose_nodes`` nodes (a ``SpecError`` on ``lose_nodes`` when that
    leaves none)."""
    if not 1 <= lose_nodes < cluster.num_nodes:
        raise SpecError(
            "lose_nodes",
            f"must be between 1 and {cluster.num_nodes - 1} (the cluster has {cluster.num_nodes} nodes), "
            f"got {lose_nodes}",
        )
    smaller = cluster.with_nodes(cluster.num_nodes - lose_nodes)
    return dataclasses.replace(
        smaller, name=f"{cluster.name} minus {lose_nodes} node{'s' if lose_nodes > 1 else ''}"
    )


def search_allowing_idle_nodes(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingConfig, **kwargs
) -> tuple[SearchResult, ClusterSpec]:
    """``search`` on every node; when nothing fits there (often: the device count has a factor no degree can
    take, e.g. 7 nodes), on the largest smaller node count that admits a plan, saying so in
    ``stats['note']`` and ``stats['nodes_used']``: a real run would leave the other nodes idle. Returns the
    result and the cluster it was found on. ``progress`` is reported for the full-cluster search only."""
    result = search(model, cluster, training, **kwargs)
    # the user's own limits rejected layouts that use every node: fewer nodes would not be the answer
    if result.best is not None or result.stats.get("cancelled") or result.stats.get("constraint_rejected"):
        return result, cluster
    kwargs.pop("progress", None)
    full = cluster.num_nodes
    for nodes in range(full - 1, max(0, full - MAX_FEWER_NODES_TRIES), -1):
        smaller = cluster.with_nodes(nodes)
        attempt = search(model, smaller, training, **kwargs)
        if attempt.best is not None or attempt.stats.get("cancelled"):
            attempt.stats["nodes_used"] = nodes
            attempt.stats["note"] = (
                f"no layout uses all {full} nodes ({result.stats.get('tightest', 'no layout fits')}); "
                f"the best plan uses {nodes} nodes and leaves {full - nodes} idle"
            )
            return attempt, smaller
    return result, cluster
