"""Costing and results: the cost model of a search, and the full plans (``plan.json``) of a short list of
layouts: every ``predicted`` figure, the energy, the placement against the topology-blind one, the idle
devices and the stage split written out."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

from ..costmodel import DEFAULT_ORDER, CostModel, GiB, Layouts
from ..energy import device_power_profile, plan_energy
from ..hardware import Efficiency, efficiency_for, profile_origin
from ..moe import MeasuredExpertLoad
from ..plan import Plan
from ..specs import ClusterSpec, ModelSpec, Strategy
from .rules import stage_split


def cost_model_for(
    model,
    cluster,
    training,
    order: str,
    eff: Efficiency | None,
    expert_load: MeasuredExpertLoad | None = None,
) -> CostModel:
    """The cost model of a search or an evaluation; with ``eff`` None, the device's efficiency profile
    (:func:`~workers.planner.hardware.efficiency_for`), whose origin every plan's ``predicted`` carries."""
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


def leave_idle(cluster: ClusterSpec, used: ClusterSpec, plans: list[Plan]) -> dict[str, Any]:
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


def with_stage_split(model: ModelSpec, s: Strategy, pinned: tuple[int, ...] | None) -> Strategy:
    """``s`` with its stage split written out when it is pinned or uneven (an even split stays implicit,
    so plans of layouts pp divides keep the contract's fields)."""
    split = stage_split(model, s.pp, pinned)
    if pinned is None and len(set(split)) == 1:
        return s
    return dataclasses.replace(s, layers_per_stage=split)


def costed_plans(
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
    assumed = cm.training.assumed_defaults()
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
        if assumed:
            # the training flags the document left to its framework, the values costed and why (issue 37)
            predicted["assumed_defaults"] = assumed
        if int(flat.zero[i]) >= 3 and int(flat.dp[i] * flat.cp[i]) > 1:
            # how the framework's ZeRO-3 gathers were charged (hardware.FrameworkCollectives)
            predicted["zero3_collectives"] = cm.collectives.describe()
        strategy = with_stage_split(cm.model, flat.strategy(i, order), pinned)
        out.append(Plan(strategy, fits, reason, predicted))
    return out


def with_order(cm: CostModel, order: str) -> CostModel:
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
    blind_cm = with_order(cm, DEFAULT_ORDER)
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
