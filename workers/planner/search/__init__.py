"""Enumerate every valid parallel layout, prune by memory (and the user's limits), cost the rest, rank
them by an objective (throughput unless asked otherwise).

``evaluate`` costs one complete strategy; ``search`` costs all layouts compatible with a partial one.
Both go through :class:`~workers.planner.costmodel.CostModel` on numpy arrays (one element per layout),
so a million layouts cost a few hundred numpy operations, not a million Python calls.

One module per step: ``rules`` (the divisibility rules and the stage split), ``enumeration`` (the
candidate grid), ``scan`` (memory and time over the grid, pruned), ``ranking`` (objectives, limits and the
Pareto front), ``plans`` (the full ``plan.json`` of the chosen layouts), ``baseline`` (the scaling
baseline), ``diagnostics`` (why nothing fits), ``strategy_search`` (:func:`search` itself) and ``what_if``
(:func:`evaluate`, losing nodes, leaving nodes idle). Every name is importable from here.
"""

from .baseline import baseline_tokens_per_device, clear_caches
from .enumeration import (
    R_CP,
    R_DP,
    R_EP,
    R_INTERLEAVE,
    R_MBS,
    R_MEM,
    R_PP,
    R_TP,
    R_VPP,
    R_VPP_UNEVEN,
    enumerate_layouts,
)
from .plans import SCALING_NO_BASELINE, SCALING_SKIPPED
from .ranking import (
    CONSTRAINTS,
    OBJECTIVES,
    THROUGHPUT,
    MAX_MEMORY_LIMIT_GiB,
    Ranking,
    checked_ranking,
    pareto_indices,
)
from .rules import (
    cp_rule,
    divisors,
    ep_rule,
    layout_errors,
    pp_rule,
    stage_split,
    stage_split_errors,
    stage_split_text,
    tp_rule,
    vpp_rule,
)
from .scan import CHUNK_ROWS
from .strategy_search import CANDIDATES_CAP, ORDER_POOL, PARETO_CAP, search
from .what_if import MAX_FEWER_NODES_TRIES, evaluate, search_allowing_idle_nodes, without_nodes

__all__ = [
    "CANDIDATES_CAP",
    "CHUNK_ROWS",
    "CONSTRAINTS",
    "MAX_FEWER_NODES_TRIES",
    "MAX_MEMORY_LIMIT_GiB",
    "OBJECTIVES",
    "ORDER_POOL",
    "PARETO_CAP",
    "R_CP",
    "R_DP",
    "R_EP",
    "R_INTERLEAVE",
    "R_MBS",
    "R_MEM",
    "R_PP",
    "R_TP",
    "R_VPP",
    "R_VPP_UNEVEN",
    "SCALING_NO_BASELINE",
    "SCALING_SKIPPED",
    "THROUGHPUT",
    "Ranking",
    "baseline_tokens_per_device",
    "checked_ranking",
    "clear_caches",
    "cp_rule",
    "divisors",
    "enumerate_layouts",
    "ep_rule",
    "evaluate",
    "layout_errors",
    "pareto_indices",
    "pp_rule",
    "search",
    "search_allowing_idle_nodes",
    "stage_split",
    "stage_split_errors",
    "stage_split_text",
    "tp_rule",
    "vpp_rule",
    "without_nodes",
]
