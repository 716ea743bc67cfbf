"""cann-train strategy planner: a pure-Python (numpy) engine that finds the parallel layout that trains
fastest within memory and predicts its step time.

Public API (used by the CLI, the Celery tasks and the visualizer)::

    ModelSpec, ClusterSpec, TrainingConfig, Strategy   # .from_dict(d) / .to_dict(); SpecError on bad input
    strategy_short_name(doc) / Strategy.short_name()   # the one short name: tp2-pp4-dp8-ep2-cp2-z1-rsel
    evaluate(model, cluster, training, strategy) -> Plan          # one complete strategy ("what-if")
    search(model, cluster, training, fixed=None, top_k=10, progress=None, should_stop=None) -> SearchResult
    # progress(evaluated, feasible, best_plan_dict | None, fraction 0..1)
    NothingFits                                                   # raised only with search(raise_if_empty=True)

``search`` returns an empty result (``best is None``, ``stats['tightest']`` names the tightest
constraint) when nothing fits; it never imports Django or torch.
"""

from .costmodel import CostModel, Layouts
from .hardware import Efficiency, efficiency_for
from .moe import MeasuredExpertLoad, expected_imbalance
from .plan import NothingFits, Plan, SearchResult
from .search import evaluate, search
from .specs import (
    ClusterSpec,
    DeviceSpec,
    LinkSpec,
    ModelSpec,
    MoESpec,
    SpecError,
    Strategy,
    TierSpec,
    TrainingConfig,
    strategy_short_name,
)

__all__ = [
    "ClusterSpec",
    "CostModel",
    "DeviceSpec",
    "Efficiency",
    "Layouts",
    "LinkSpec",
    "MeasuredExpertLoad",
    "MoESpec",
    "ModelSpec",
    "NothingFits",
    "Plan",
    "SearchResult",
    "SpecError",
    "Strategy",
    "TierSpec",
    "TrainingConfig",
    "efficiency_for",
    "evaluate",
    "expected_imbalance",
    "search",
    "strategy_short_name",
]
