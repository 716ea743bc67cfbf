"""Results of the planner: a costed :class:`Plan` (``plan.json``) and a :class:`SearchResult`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .specs import Strategy


@dataclass
class Plan:
    """A strategy with its predicted figures (``plan.json``)."""

    strategy: Strategy
    """The complete layout."""
    feasible: bool
    """Fits in device memory (and obeys every divisibility rule)."""
    reason: str
    """Why it is infeasible; empty when feasible."""
    predicted: dict[str, Any]
    """step_time_s, tokens_per_s, model/hardware TFLOP/s per device, mfu, memory_GiB_per_device,
    bubble_fraction, comm_s, exposed_comm_s, scaling_efficiency (null, with ``scaling_efficiency_note``
    saying why, when its baseline was not computed), plus the breakdown extensions and the
    optional ``energy`` block (predicted watts per device, kWh per step and per 1M tokens, tokens per kWh;
    ``workers/planner/energy.py``), absent from plans costed before it existed. A layout that takes fewer
    devices than its cluster has also carries ``devices_used``, ``devices_idle`` and ``idle_note``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy.to_dict(),
            "feasible": self.feasible,
            "reason": self.reason,
            "predicted": self.predicted,
        }

    @property
    def step_time_s(self) -> float:
        return float(self.predicted["step_time_s"])


class NothingFits(Exception):  # noqa: N818 - a domain outcome, not a programming error
    """No layout fits: ``message`` names the tightest constraint; ``rejected`` counts rejections by reason.

    ``search`` returns an empty result instead of raising unless called with ``raise_if_empty=True``;
    the CLI turns either into exit code 3.
    """

    def __init__(self, message: str, rejected: dict[str, int], stats: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.rejected = dict(rejected)
        self.stats = dict(stats or {})


@dataclass
class SearchResult:
    """What ``search`` found. ``best`` is None when nothing fits (see ``stats['tightest']``)."""

    best: Plan | None
    """Best feasible plan by the search's objective (the fastest unless another was asked)."""
    top: list[Plan]
    """The ``top_k`` best feasible plans by the search's objective (``stats['objective']``), best first."""
    pareto: list[Plan]
    """Plans no other feasible plan beats on all of throughput, memory headroom and communication volume,
    sorted by throughput."""
    stats: dict[str, Any]
    """evaluated, feasible, rejected {reason: n}, seconds, tightest (message when nothing fits),
    cancelled, objective, constraints, constraint_rejected {constraint: n} (when a user limit rejected
    layouts)."""
    candidates_fn: Callable[[], list[dict[str, Any]]] | None = field(default=None, repr=False)
    """Builds :attr:`candidates` on first use (it costs more than the rest of the result)."""
    _candidates: list[dict[str, Any]] | None = field(default=None, init=False, repr=False)

    @property
    def candidates(self) -> list[dict[str, Any]]:
        """Compact feasible candidates for a scatter plot (the Pareto points, the fastest, and an even
        subsample of the rest, a few thousand at most): strategy, tokens_per_s, memory_GiB,
        comm_share (exposed communication / step time)."""
        if self._candidates is None:
            self._candidates = self.candidates_fn() if self.candidates_fn else []
        return self._candidates

    def to_dict(self, with_candidates: bool = False) -> dict[str, Any]:
        """The CLI ``--json`` shape: best, top, pareto, search{evaluated, feasible, rejected, seconds}."""
        out: dict[str, Any] = {
            "best": self.best.to_dict() if self.best else None,
            "top": [p.to_dict() for p in self.top],
            "pareto": [p.to_dict() for p in self.pareto],
            "search": dict(self.stats),
        }
        if with_candidates:
            out["candidates"] = self.candidates
        return out


def predicted_overlap_ratio(predicted: dict[str, Any]) -> float | None:
    """The plan's predicted overlap ratio: communication hidden under compute / all communication
    (``1 - exposed_comm_s / sum(comm_s)``: TP and EP comm count as exposed, the cost model never hides them).
    None for a plan without communication or without these figures (older plans)."""
    comm, exposed = predicted.get("comm_s"), predicted.get("exposed_comm_s")
    if not isinstance(comm, dict) or not isinstance(exposed, int | float):
        return None
    total = sum(v for v in comm.values() if isinstance(v, int | float))
    if total <= 0:
        return None
    return round(min(1.0, max(0.0, 1.0 - exposed / total)), 4)
