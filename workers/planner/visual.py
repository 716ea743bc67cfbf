"""What the strategy visualizer draws, computed from a plan: the pipeline schedule, where every rank sits on
the topology, and the memory and step-time breakdowns. Pure Python + numpy (no Django, no torch); the
page only plots what these functions return.

- :func:`pipeline_schedule` simulates the real 1F1B order (PipeDream-flush, Narayanan et al. 2021) or the
  interleaved 1F1B order (Megatron-LM virtual stages) with its data dependencies and returns the blocks.
- :func:`placement_map` places every rank like the cost model does (``strategy.order``, innermost
  first; ranks fill nodes in order) and names the link and switch tier each parallel group crosses,
  using :func:`~workers.planner.costmodel.group_strides` and :func:`~workers.planner.costmodel.group_links`.
- :func:`plan_visuals` bundles the four for one ``plan.json`` dict.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .costmodel import Layouts, gradient_group_stride, group_links, group_strides
from .hardware import efficiency_for
from .specs import ClusterSpec, ModelSpec, SpecError, Strategy, TrainingConfig

SCHEDULES = ("1f1b", "interleaved")
# the page draws at most this many pipeline blocks; beyond it fewer micro-batches are drawn (never fewer than
# pp). 2,400 keeps a block of a 16-stage schedule about 8 px wide on a 1,100 px chart; at 8,000 (until issue
# 35) the seed plan drew 6,144 blocks of ~2 px that took 450 ms of the plan page's load (Chromium, here)
SCHEDULE_BLOCK_CAP = 2400
# nodes whose devices are listed one by one in the placement map (all nodes get a summary)
PLACEMENT_NODE_CAP = 128
GROUP_KINDS = ("tp", "cp", "dp", "ep", "edp", "pp")


# --------------------------------------------------------------------------------------------------
# Pipeline schedule
# --------------------------------------------------------------------------------------------------


def _stage_order(stage: int, pp: int, vpp: int, m: int, schedule: str) -> list[tuple[str, int, int]]:
    """The order in which one pipeline stage runs its (kind, micro_batch, chunk) operations.

    1F1B (PipeDream-flush, Narayanan et al. 2021 §2.2): ``pp - stage - 1`` warm-up forwards, then one
    forward / one backward alternately, then the remaining backwards.
    Interleaved (Megatron-LM ``forward_backward_pipelining_with_interleaving``): micro-batches go through
    the ``vpp`` chunks in groups of ``pp``; warm-up is ``2 (pp - stage - 1) + (vpp - 1) pp`` forwards
    (all of them when ``m == pp``), then 1F1B over virtual micro-batches, then the cool-down backwards.
    """
    if schedule == "1f1b":
        warm = min(pp - stage - 1, m)
        order = [("F", i, 0) for i in range(warm)]
        for k in range(m - warm):
            order.append(("F", warm + k, 0))
            order.append(("B", k, 0))
        order.extend(("B", i, 0) for i in range(m - warm, m))
        return order

    total = m * vpp
    group = pp * vpp

    def chunk_of(k: int, forward: bool) -> int:
        c = (k % group) // pp
        return c if forward else vpp - 1 - c

    def micro_of(k: int) -> int:
        return (k // group) * pp + k % pp

    if m == pp:
        warm = total
    else:
        warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    order = [("F", micro_of(k), chunk_of(k, True)) for k in range(warm)]
    for k in range(total - warm):
        fk = warm + k
        order.append(("F", micro_of(fk), chunk_of(fk, True)))
        order.append(("B", micro_of(k), chunk_of(k, False)))
    order.extend(("B", micro_of(k), chunk_of(k, False)) for k in range(total - warm, total))
    return order


def pipeline_schedule(
    pp: int,
    vpp: int,
    num_micro_batches: int,
    t_forward: float,
    t_backward: float,
    schedule: str | None = None,
) -> list[dict[str, Any]]:
    """Blocks of the pipeline schedule, each ``{"stage", "micro_batch", "chunk", "kind": "F"|"B",
    "start", "end"}`` (seconds from the start of the step).

    ``t_forward`` / ``t_backward`` are one micro-batch's forward / backward time on one whole stage; with
    ``vpp`` chunks each chunk takes ``1/vpp`` of it. ``schedule`` defaults to ``"interleaved"`` when
    ``vpp > 1``. Every stage runs its operations in the order of :func:`_stage_order`, each as soon as
    the stage is free and its input exists: the forward of (micro-batch i, virtual stage k) needs the
    forward of virtual stage k-1, the backward needs the backward of virtual stage k+1 (the last one its
    own forward). Chunk c of stage s is virtual stage ``c * pp + s`` (Megatron-LM). Communication takes
    no time here (the cost model charges pipeline p2p separately).

    With equal per-stage times the idle time equals the analytic bubble: ``(pp-1)/(vpp*m)`` of the
    ideal ``m (t_f + t_b)`` (Narayanan et al. SC'21 §2.2).
    """
    schedule = schedule or ("interleaved" if vpp > 1 else "1f1b")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if pp < 1 or vpp < 1 or num_micro_batches < 1:
        raise ValueError("pp, vpp and num_micro_batches must be >= 1")
    if schedule == "1f1b" and vpp != 1:
        raise ValueError("the 1f1b schedule has one chunk per stage (vpp = 1); use 'interleaved'")
    if schedule == "interleaved" and num_micro_batches % pp:
        raise ValueError(
            f"the interleaved schedule needs micro-batches divisible by pp ({num_micro_batches} % {pp})"
        )
    m = num_micro_batches
    tf, tb = t_forward / vpp, t_backward / vpp
    n_virtual = pp * vpp
    orders = [_stage_order(s, pp, vpp, m, schedule) for s in range(pp)]
    pos = [0] * pp
    free = [0.0] * pp
    done: dict[tuple[str, int, int], float] = {}  # (kind, micro, virtual stage) -> end time
    blocks: list[dict[str, Any]] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            order = orders[s]
            while pos[s] < len(order):
                kind, i, c = order[pos[s]]
                k = c * pp + s
                if kind == "F":
                    dep = ("F", i, k - 1) if k > 0 else None
                else:
                    dep = ("B", i, k + 1) if k < n_virtual - 1 else ("F", i, k)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] if dep is not None else 0.0)
                end = start + (tf if kind == "F" else tb)
                done[(kind, i, k)] = end
                free[s] = end
                blocks.append(
                    {"stage": s, "micro_batch": i, "chunk": c, "kind": kind, "start": start, "end": end}
                )
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the Megatron orders never deadlock
            raise RuntimeError("pipeline schedule deadlocked")
    return blocks


def schedule_idle_fraction(blocks: list[dict[str, Any]], pp: int) -> float:
    """Idle time of the drawn schedule as a fraction of the busy (ideal) time of one stage:
    ``(makespan - busy per stage) / busy per stage`` for the busiest stage."""
    makespan = max(b["end"] for b in blocks)
    busy = [0.0] * pp
    for b in blocks:
        busy[b["stage"]] += b["end"] - b["start"]
    ideal = max(busy)
    return (makespan - ideal) / ideal if ideal > 0 else 0.0


def drawn_micro_batches(pp: int, vpp: int, m: int, block_cap: int = SCHEDULE_BLOCK_CAP) -> int:
    """Micro-batches to draw: all of them when few, else about ``3 pp`` (warm-up, a steady 1F1B phase
    and the cool-down all show), fewer when the blocks would exceed ``block_cap``, never fewer than ``pp``
    (rounded to a multiple of ``pp`` so that the interleaved schedule stays valid)."""
    want = 3 * pp
    by_cap = block_cap // (2 * pp * vpp)
    k = max(pp, min(want, (by_cap // pp) * pp))
    return m if m <= k else k


# --------------------------------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------------------------------


def _as_cluster(cluster: ClusterSpec | dict) -> ClusterSpec:
    return cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.from_dict(cluster)


def _as_strategy(strategy: Strategy | dict) -> Strategy:
    return strategy if isinstance(strategy, Strategy) else Strategy.from_dict(strategy)


def _dense_ids(key: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Group index per rank from a per-rank group key, numbering groups by their lowest rank."""
    _uniq, inverse = np.unique(key, return_inverse=True)
    lowest = np.full(inverse.max() + 1, rank.size, dtype=np.int64)
    np.minimum.at(lowest, inverse, rank)
    renumber = np.empty_like(lowest)
    renumber[np.argsort(lowest)] = np.arange(lowest.size)
    return renumber[inverse]


def _tier_name(cluster: ClusterSpec, span_nodes: float, inter: bool) -> str:
    """The outermost level a group spanning ``span_nodes`` nodes reaches: ``intra-node``, or the first
    tier whose switch holds that many nodes (the cost model slows the traffic by the oversubscription of
    every tier below it, see ``group_links``), or ``beyond <last tier>``."""
    if not inter:
        return "intra-node"
    for tier in cluster.tiers:
        if span_nodes <= tier.nodes:
            return tier.name
    return f"beyond {cluster.tiers[-1].name}" if cluster.tiers else "inter-node"


def _reached_tier(cluster: ClusterSpec, node: np.ndarray, group: np.ndarray) -> list[str]:
    """For each group (index = group id), the outermost level its members actually span."""
    n_groups = int(group.max()) + 1
    lo = np.full(n_groups, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n_groups, -1, dtype=np.int64)
    np.minimum.at(lo, group, node)
    np.maximum.at(hi, group, node)
    names = np.array(["intra-node"] * n_groups, dtype=object)
    unresolved = lo != hi
    outer = f"beyond {cluster.tiers[-1].name}" if cluster.tiers else "inter-node"
    names[unresolved] = outer
    for tier in reversed(cluster.tiers):
        inside = unresolved & (lo // tier.nodes == hi // tier.nodes)
        names[inside] = tier.name
    return names.tolist()


def placement_map(
    cluster: ClusterSpec | dict, strategy: Strategy | dict, max_nodes: int = PLACEMENT_NODE_CAP
) -> dict[str, Any]:
    """Where every rank of ``strategy`` sits on ``cluster`` and what each parallel group crosses.

    Ranks fill nodes in order (rank r is device ``r % devices_per_node`` of node ``r // devices_per_node``)
    and are decomposed by ``strategy.order`` (innermost, fastest-varying first) exactly as
    ``costmodel.group_strides`` does: the dense dimensions in that order without ``ep``; the EP group is
    ``ep`` consecutive members of the combined cp×dp dimension, the expert-data-parallel group (``edp``)
    the rest of it. Group kinds: ``tp``, ``cp``, ``pp``, ``dp`` (the gradient group the cost model
    reduces over: dp×cp ranks sharing tp and pp), ``ep``, ``edp``.

    Returns ``{"num_nodes", "devices_per_node", "order", "degrees", "drawn_nodes", "note",
    "devices": {"rank", "node", "local", "coord": {kind: [...]}, "group": {kind: [...]}}`` (the first
    ``drawn_nodes`` nodes, row-major), ``"nodes": [{"node", "stages", "switch": {tier: index}, "groups":
    {kind: distinct groups}}]`` (every node), ``"tiers": [{"name", "nodes", "oversubscription"}]``,
    ``"links": {kind: {"size", "stride", "span_nodes", "per_node", "link", "tier", "bandwidth_GBps",
    "oversubscription_factor", "groups_by_tier": {level: groups}}}``.

    ``links[kind]`` is the cost model's own view (``group_links`` on the group's size and stride):
    ``tier`` is the outermost level the traffic reaches, ``bandwidth_GBps`` the achieved per-device
    bandwidth it is costed at. ``groups_by_tier`` counts the actual groups by the level their members
    span and ``actual_tier`` is the outermost of those; the two agree whenever group spans align with
    nodes and switches and the order keeps cp next to dp (the page flags a difference).
    """
    cluster = _as_cluster(cluster)
    strategy = _as_strategy(strategy)
    s = strategy
    degrees = {k: int(getattr(s, k) or 1) for k in ("tp", "cp", "dp", "pp", "ep")}
    n_dev = cluster.num_devices
    world = degrees["tp"] * degrees["cp"] * degrees["dp"] * degrees["pp"]
    if world != n_dev:
        raise ValueError(f"tp*cp*dp*pp = {world} must equal the device count {n_dev}")
    if (degrees["cp"] * degrees["dp"]) % degrees["ep"]:
        raise ValueError(f"ep={degrees['ep']} must divide dp*cp ({degrees['cp'] * degrees['dp']})")
    dpn = cluster.devices_per_node
    one = Layouts.from_strategies(
        [
            Strategy(
                **{k: degrees[k] for k in degrees},
                vpp=1,
                micro_batch_size=1,
                recompute="none",
                zero_stage=0,
                sequence_parallel=False,
                order=s.order,
            )
        ]
    )
    layout_strides = group_strides(one, s.order)
    strides = {k: int(v[0]) for k, v in layout_strides.items()}
    gradient_stride = int(gradient_group_stride(one, layout_strides, s.order)[0])

    rank = np.arange(n_dev, dtype=np.int64)
    coord = {k: (rank // strides[k]) % degrees[k] for k in ("tp", "cp", "dp", "pp")}
    dense = [p for p in s.order.split("-") if p != "ep"]
    inner, outer = ("cp", "dp") if dense.index("cp") < dense.index("dp") else ("dp", "cp")
    # the combined cp*dp index, its innermost part first (Megatron-Core RankGenerator, expert groups)
    joint = coord[inner] + degrees[inner] * coord[outer]
    ep = degrees["ep"]
    coord["ep"] = joint % ep
    coord["edp"] = joint // ep
    dpcp = degrees["cp"] * degrees["dp"]
    big = n_dev + 1

    def key(*parts: np.ndarray) -> np.ndarray:
        out = np.zeros(n_dev, dtype=np.int64)
        for p in parts:
            out = out * big + p
        return out

    groups = {
        "tp": _dense_ids(key(coord["cp"], coord["dp"], coord["pp"]), rank),
        "cp": _dense_ids(key(coord["tp"], coord["dp"], coord["pp"]), rank),
        "pp": _dense_ids(key(coord["tp"], coord["cp"], coord["dp"]), rank),
        "dp": _dense_ids(key(coord["tp"], coord["pp"]), rank),
        "ep": _dense_ids(key(coord["tp"], coord["pp"], coord["edp"]), rank),
        "edp": _dense_ids(key(coord["tp"], coord["pp"], coord["ep"]), rank),
    }
    coords = {k: coord[k] for k in GROUP_KINDS}

    # the cost model's view of every group's links (same calls as CostModel.timing)
    _name, eff = efficiency_for(cluster.device.name)
    size_stride = {
        "tp": (degrees["tp"], strides["tp"]),
        "cp": (degrees["cp"], strides["cp"]),
        "dp": (dpcp, gradient_stride),
        "ep": (ep, strides["ep"]),
        "edp": (dpcp // ep, strides["edp"]),
        "pp": (degrees["pp"], strides["pp"]),
    }
    node = rank // dpn
    levels = ["intra-node", *(t.name for t in cluster.tiers), "inter-node"]
    levels.append(f"beyond {cluster.tiers[-1].name}" if cluster.tiers else "inter-node")
    links: dict[str, Any] = {}
    for kind, (size, stride) in size_stride.items():
        pattern = {"ep": "all_to_all", "pp": "p2p"}.get(kind, "ring")  # as CostModel.links
        gl = group_links(cluster, eff, np.array([size]), np.array([stride]), pattern=pattern)
        inter = bool(gl.inter[0])
        span_nodes = float(np.ceil(size * stride / dpn))
        factor = float(np.ravel(gl.oversubscription_factor)[0])  # the uplinks' share (group_links)
        reached = _reached_tier(cluster, node, groups[kind])
        by_tier: dict[str, int] = {}
        for name in reached:
            by_tier[name] = by_tier.get(name, 0) + 1
        alone = size == 1  # a group of one rank sends nothing
        links[kind] = {
            "size": int(size),
            "stride": int(stride),
            "span_nodes": 1 if alone or not inter else int(span_nodes),
            "per_node": int(gl.per_node[0]),
            "link": None if alone else (cluster.inter_node.kind if inter else cluster.intra_node.kind),
            "tier": "none" if alone else _tier_name(cluster, span_nodes, inter),
            "bandwidth_GBps": None
            if alone
            else round(float((gl.bw_inter if inter else gl.bw_intra)[0]) / 1e9, 2),
            "oversubscription_factor": float(factor) if inter and not alone else 1.0,
            "groups": len(reached),
            "groups_by_tier": by_tier,
            "actual_tier": "none" if alone else max(by_tier, key=levels.index),
        }

    drawn = min(cluster.num_nodes, max_nodes)
    shown = rank < drawn * dpn
    devices = {
        "rank": rank[shown].tolist(),
        "node": node[shown].tolist(),
        "local": (rank % dpn)[shown].tolist(),
        "coord": {k: v[shown].tolist() for k, v in coords.items()},
        "group": {k: v[shown].tolist() for k, v in groups.items()},
    }
    # per-node summary for every node: stages held, switch under each tier, distinct groups
    nodes = []
    stage_by_node = coord["pp"].reshape(cluster.num_nodes, dpn)
    group_by_node = {k: v.reshape(cluster.num_nodes, dpn) for k, v in groups.items()}
    for n in range(cluster.num_nodes):
        nodes.append(
            {
                "node": n,
                "stages": sorted({int(x) for x in stage_by_node[n]}),
                "switch": {t.name: n // t.nodes for t in cluster.tiers},
                "groups": {k: int(np.unique(v[n]).size) for k, v in group_by_node.items()},
            }
        )
    note = (
        f"all {cluster.num_nodes} nodes drawn"
        if drawn == cluster.num_nodes
        else f"devices of the first {drawn} of {cluster.num_nodes} nodes drawn; every node summarised"
    )
    return {
        "num_nodes": cluster.num_nodes,
        "devices_per_node": dpn,
        "order": s.order,
        "degrees": degrees,
        "strides": strides,
        "drawn_nodes": drawn,
        "note": note,
        "devices": devices,
        "nodes": nodes,
        "tiers": [t.to_dict() for t in cluster.tiers],
        "intra_node": cluster.intra_node.to_dict(),
        "inter_node": cluster.inter_node.to_dict(),
        "links": links,
    }


# --------------------------------------------------------------------------------------------------
# Breakdowns and the bundle
# --------------------------------------------------------------------------------------------------


def _num(d: dict[str, Any], name: str, default: float = 0.0) -> float:
    v = d.get(name)
    return float(v) if isinstance(v, int | float) else default


def memory_breakdown(predicted: dict[str, Any], capacity_GiB: float) -> dict[str, Any]:
    """Memory per device (GiB) of the plan's heaviest stage against the device capacity.

    ``parts`` are the ``memory_GiB_per_device`` fields; ``other`` = total − their sum (the framework
    overhead the cost model adds, plus rounding)."""
    mem = predicted.get("memory_GiB_per_device") or {}
    parts = {k: _num(mem, k) for k in ("params", "grads", "optimizer", "activations")}
    total = _num(mem, "total", sum(parts.values()))
    other = max(0.0, round(total - sum(parts.values()), 2))
    return {
        "parts": parts,
        "other": other,
        "total": total,
        "capacity": float(capacity_GiB),
        "headroom": round(float(capacity_GiB) - total, 2),
        "fits": total <= capacity_GiB,
    }


def plan_breakdown(
    predicted: dict[str, Any] | None, capacity_GiB: float | None = None
) -> dict[str, Any] | None:
    """The two breakdowns the charts stack for any plan (``memory``, ``step_time``), from its predicted
    figures alone; None for a plan with none (infeasible before costing). Without ``capacity_GiB`` the
    capacity is read back as total + ``memory_headroom_GiB``."""
    if not predicted:
        return None
    if capacity_GiB is None:
        total = _num(predicted.get("memory_GiB_per_device") or {}, "total")
        capacity_GiB = total + _num(predicted, "memory_headroom_GiB")
    return {"memory": memory_breakdown(predicted, capacity_GiB), "step_time": step_time_breakdown(predicted)}


def step_time_breakdown(predicted: dict[str, Any]) -> dict[str, Any]:
    """The step time as the cost model adds it up, and each communication kind as exposed + overlapped.

    ``parts`` (seconds, summing to ``step_time_s`` up to rounding): ``compute`` = ``compute_s``; the
    exposed communication inside the micro-batches (``inline_comm_s`` = TP + EP + exposed CP) split into
    ``tp`` = ``comm_s.tp`` and ``ep`` = ``comm_s.ep`` (the cost model never overlaps those) and ``cp`` =
    the rest; ``bubble`` = ``bubble_s``; ``pp`` = ``comm_s.pp`` (p2p added serially); ``dp`` =
    ``dp_exposed_s``; ``optimizer`` = ``optimizer_s``.

    ``comm[kind] = {"total", "exposed", "overlapped"}``: exposed TP/EP/PP = total; exposed CP as above
    (ring attention hides the rest behind the attention core); exposed DP = ``dp_exposed_s``, the rest
    hidden behind the backward (``overlap_grad_reduce``) or ZeRO-3 prefetch. Check: the exposed sum
    equals ``exposed_comm_s``."""
    comm = predicted.get("comm_s") or {}
    totals = {k: _num(comm, k) for k in ("tp", "pp", "dp", "ep", "cp")}
    inline = _num(predicted, "inline_comm_s", totals["tp"] + totals["ep"] + totals["cp"])
    cp_exposed = min(totals["cp"], max(0.0, inline - totals["tp"] - totals["ep"]))
    dp_exposed = _num(predicted, "dp_exposed_s", totals["dp"])
    exposed = {
        "tp": totals["tp"],
        "ep": totals["ep"],
        "cp": cp_exposed,
        "pp": totals["pp"],
        "dp": min(totals["dp"], dp_exposed) if totals["dp"] else dp_exposed,
    }
    step = _num(predicted, "step_time_s")
    parts = {
        "compute": _num(predicted, "compute_s"),
        "tp": exposed["tp"],
        "ep": exposed["ep"],
        "cp": exposed["cp"],
        "pp": exposed["pp"],
        "dp": dp_exposed,
        "bubble": _num(predicted, "bubble_s", _num(predicted, "bubble_fraction") * step),
        "optimizer": _num(predicted, "optimizer_s"),
    }
    return {
        "step_time_s": step,
        "parts": {k: round(v, 4) for k, v in parts.items()},
        "comm": {
            k: {
                "total": round(totals[k], 4),
                "exposed": round(exposed[k], 4),
                "overlapped": round(max(0.0, totals[k] - exposed[k]), 4),
            }
            for k in totals
        },
        "exposed_comm_s": _num(predicted, "exposed_comm_s", sum(exposed.values())),
        "unaccounted_s": round(step - sum(parts.values()), 4),
    }


def _devices_taken(cluster: ClusterSpec, strategy: Strategy) -> ClusterSpec:
    """The part of ``cluster`` a plan's layout takes (all of it, part of one node or whole nodes; the rest
    stay idle, ``ClusterSpec.with_devices``); ``cluster`` itself when the layout cannot run on it."""
    world = math.prod(int(getattr(strategy, k) or 1) for k in ("tp", "cp", "dp", "pp"))
    return cluster if cluster.devices_problem(world) else cluster.with_devices(world)


def plan_visuals(
    model: ModelSpec | dict,
    cluster: ClusterSpec | dict,
    training: TrainingConfig | dict,
    plan: dict[str, Any],
    *,
    max_nodes: int = PLACEMENT_NODE_CAP,
) -> dict[str, Any]:
    """Everything the visualizer draws for one plan (``plan.json`` dict):
    ``{"schedule", "placement", "memory", "step_time"}``.

    Schedule timing, from the cost model's own decomposition of ``predicted``: one stage spends
    ``(compute_s + inline_comm_s) / m`` on a micro-batch (m = ``num_micro_batches``); the cost model
    counts that as ``3 + full`` passes (forward 1, backward 2, full recompute one more forward, run in
    the backward), so ``t_forward = stage_micro / (3 + full)`` and ``t_backward`` the rest (selective
    recompute's extra attention core is spread the same way). The simulated schedule then ends after
    ``compute_s + inline_comm_s + bubble_s`` (the bubble is (p−1)/(v·m) of the ideal time in both).

    ``schedule``: ``blocks`` (of :func:`pipeline_schedule`, for ``drawn_micro_batches`` of the ``m``
    micro-batches, see :func:`drawn_micro_batches` and ``note``), ``kind`` (1f1b / interleaved), ``pp``,
    ``vpp``, ``m``, ``t_forward``, ``t_backward``, ``layers_per_chunk`` (of the heaviest stage),
    ``layers_per_stage`` (the plan's split, first stage to last: uneven when the plan lists it; blocks are
    drawn at the pace of the slowest stage, as the cost model charges them), ``bubble_fraction`` = (p−1)/(v·m)
    (idle / ideal time, for the real m), ``bubble_share_of_step`` (the plan's ``bubble_fraction``: bubble /
    step time), ``drawn_bubble_fraction`` (idle / ideal of the drawn blocks), ``makespan_s`` (ideal +
    bubble, real m), ``pp_p2p_s`` (pipeline sends the cost model adds serially; not drawn).
    ``placement``: :func:`placement_map`. ``memory``: :func:`memory_breakdown`. ``step_time``:
    :func:`step_time_breakdown`.
    """
    model = model if isinstance(model, ModelSpec) else ModelSpec.from_dict(model)
    cluster = _as_cluster(cluster)
    training = training if isinstance(training, TrainingConfig) else TrainingConfig.from_dict(training)
    strategy = _as_strategy(plan["strategy"])
    pred = plan.get("predicted") or {}
    pp = int(strategy.pp or 1)
    vpp = int(strategy.vpp or 1)
    per_replica = training.global_batch_size // max(1, (strategy.dp or 1) * (strategy.micro_batch_size or 1))
    m = int(pred.get("num_micro_batches") or per_replica or 1)
    ideal = _num(pred, "compute_s") + _num(pred, "inline_comm_s")
    stage_micro = ideal / m if m else 0.0
    passes = 3.0 + (1.0 if strategy.recompute == "full" else 0.0)
    t_forward = stage_micro / passes
    t_backward = stage_micro - t_forward
    schedule_kind = "interleaved" if vpp > 1 else "1f1b"
    try:
        layers_per_stage: list[int] | None = list(strategy.stage_layers(model.num_layers))
    except SpecError:  # a stored plan whose split does not fit this model: draw the schedule without it
        layers_per_stage = None
    drawn = drawn_micro_batches(pp, vpp, m)
    if schedule_kind == "interleaved" and drawn % pp:
        drawn = m  # the planner never yields this (interleaving needs m % pp == 0); draw what exists
    blocks = pipeline_schedule(pp, vpp, drawn, t_forward, t_backward, schedule_kind)
    for b in blocks:  # microsecond resolution keeps the page light
        b["start"] = round(b["start"], 6)
        b["end"] = round(b["end"], 6)
    analytic = (pp - 1) / (vpp * m)
    note = (
        f"all {m} micro-batches drawn"
        if drawn == m
        else f"first {drawn} of {m} micro-batches drawn (a complete schedule of {drawn}); the steady "
        f"1F1B phase repeats for the rest"
    )
    schedule = {
        "kind": schedule_kind,
        "blocks": blocks,
        "pp": pp,
        "vpp": vpp,
        "m": m,
        "drawn_micro_batches": drawn,
        "t_forward": t_forward,
        "t_backward": t_backward,
        "layers_per_chunk": max(layers_per_stage) // vpp
        if layers_per_stage
        else model.num_layers // (pp * vpp),
        "layers_per_stage": layers_per_stage,
        "bubble_fraction": analytic,
        "bubble_share_of_step": _num(pred, "bubble_fraction"),
        "drawn_bubble_fraction": schedule_idle_fraction(blocks, pp) if blocks else 0.0,
        "makespan_s": ideal * (1 + analytic),
        "pp_p2p_s": _num(pred.get("comm_s") or {}, "pp"),
        "note": note,
    }
    placement = placement_map(_devices_taken(cluster, strategy), strategy, max_nodes=max_nodes)
    # the plan's cross-switch bytes against the topology-blind placement (search/plans.py _placement), if costed
    placement["traffic"] = pred.get("placement")
    return {
        "schedule": schedule,
        "placement": placement,
        **plan_breakdown(pred, cluster.device.memory_GiB),
    }


__all__ = [
    "drawn_micro_batches",
    "memory_breakdown",
    "plan_breakdown",
    "pipeline_schedule",
    "placement_map",
    "plan_visuals",
    "schedule_idle_fraction",
    "step_time_breakdown",
]
