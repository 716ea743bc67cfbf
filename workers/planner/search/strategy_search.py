"""The search: enumerate every valid layout compatible with a partial strategy, prune by memory (and the
user's limits), cost the rest, try the best in every candidate placement, and rank them by the objective
(:func:`search`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..costmodel import CANDIDATE_ORDERS, DEFAULT_ORDER, CostModel, GiB, Layouts, dense_order
from ..hardware import Efficiency
from ..moe import MeasuredExpertLoad
from ..plan import NothingFits, Plan, SearchResult
from ..specs import ClusterSpec, ModelSpec, SpecError, Strategy, TrainingConfig
from .baseline import baseline_tokens_per_device
from .diagnostics import constraint_message, nothing_fits_message
from .enumeration import R_MEM, enumerate_layouts
from .plans import (
    SCALING_NO_BASELINE,
    SCALING_SKIPPED,
    cost_model_for,
    costed_plans,
    leave_idle,
    with_order,
    with_stage_split,
)
from .ranking import Ranking, checked_ranking, constraint_reason, pareto_indices
from .rules import layout_errors, stage_split_errors
from .scan import scan_grid

CANDIDATES_CAP = 3000
PARETO_CAP = 200
# the best layouts (by the objective, timed in the pinned or default order) whose placement the search
# then tries in every CANDIDATE_ORDERS order; the rest of the grid keeps the default placement
ORDER_POOL = 256


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
        tm = with_order(cm, order).timing(sub)
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
    cm = cost_model_for(model, cluster, training, fixed.order, efficiency, expert_load)
    base, extras, rejected = enumerate_layouts(model, cluster, training, fixed)
    scan = scan_grid(cm, base, extras, fixed, progress, should_stop, ranking=ranking)
    if scan.memory_rejected:
        rejected[R_MEM] += scan.memory_rejected
    for name, n in scan.constraint_rejected.items():
        rejected[constraint_reason(name, constraints[name])] += n
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
            stats["tightest"] = constraint_message(scan, constraints)
        else:
            stats["tightest"] = nothing_fits_message(cm, scan.lowest_rejected, rejected, fixed)
        stats["seconds"] = round(time.perf_counter() - started, 3)
        stats.update(leave_idle(whole, cluster, []))
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
        costed = costed_plans(
            with_order(cm, order),
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
    stats.update(leave_idle(whole, cluster, list(plans.values())))
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
            "strategy": with_stage_split(model, sub.strategy(j, placement), pinned).to_dict(),
            "tokens_per_s": round(float(tokens[i]), 1),
            "memory_GiB": round(float(vals["memory"][i] / GiB), 2),
            "comm_share": round(float(share[j]), 4),
        }
        for j, i in enumerate(idx)
    ]
