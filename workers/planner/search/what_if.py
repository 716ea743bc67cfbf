"""What-if: cost one complete strategy (:func:`evaluate`), the cluster after losing nodes
(:func:`without_nodes`), and a search that falls back to fewer nodes when no layout uses them all
(:func:`search_allowing_idle_nodes`)."""

from __future__ import annotations

import dataclasses

from ..costmodel import Layouts
from ..hardware import Efficiency
from ..moe import MeasuredExpertLoad
from ..plan import Plan, SearchResult
from ..specs import ClusterSpec, ModelSpec, SpecError, Strategy, TrainingConfig
from .baseline import baseline_tokens_per_device
from .plans import SCALING_NO_BASELINE, SCALING_SKIPPED, cost_model_for, costed_plans, leave_idle
from .rules import layout_errors
from .strategy_search import search


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
    cm = cost_model_for(model, used, training, strategy.order, efficiency, expert_load)
    base = (
        baseline_tokens_per_device(model, used, training, cm.eff, expert_load=expert_load)
        if scaling
        else None
    )
    layouts = Layouts.from_strategies([strategy], model.num_layers)
    note = SCALING_NO_BASELINE if scaling else SCALING_SKIPPED
    plan = costed_plans(cm, layouts, base, strategy.order, strategy.layers_per_stage, scaling_note=note)[0]
    leave_idle(cluster, used, [plan])
    return plan


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
