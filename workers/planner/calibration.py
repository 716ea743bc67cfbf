"""Fitting the few per-device efficiency constants to measured runs, and predicting those runs.

A reference run (``shared/data/reference_runs.json``) is a model, a cluster, a training config, a
partial strategy (published fields fixed, unpublished ones null) and the measured step time. The
planner predicts it the way a user would use it: the fixed fields fixed, the rest searched, the best
plan's step time. The fit minimises the mean absolute percentage error over a set of runs by moving
only the named constants of :class:`~workers.planner.hardware.Efficiency`; nothing is per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .hardware import Efficiency, efficiency_for
from .search import search
from .specs import ClusterSpec, ModelSpec, Strategy, TrainingConfig

# the constants the accuracy fit may move, with physically plausible bounds
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_max": (0.5, 0.95),
    "gemm_half_intensity": (10.0, 600.0),
    "elementwise_traffic": (0.5, 4.0),
}


@dataclass(frozen=True)
class ReferenceRun:
    """One published, measured run."""

    id: str
    source: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingConfig
    fixed: Strategy
    measured_step_s: float

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReferenceRun:
        return cls(
            id=d["id"],
            source=d.get("source", ""),
            model=ModelSpec.from_dict(d["model"]),
            cluster=ClusterSpec.from_dict(d["cluster"]),
            training=TrainingConfig.from_dict(d["training"]),
            fixed=Strategy.from_dict(d["strategy"]),
            measured_step_s=float(d["measured"]["step_time_s"]),
        )


def predict_run(run: ReferenceRun, eff: Efficiency | None = None):
    """The best plan for a run's fixed fields (the rest searched), or None when nothing fits."""
    if eff is None:
        eff = efficiency_for(run.cluster.device.name)[1]
    result = search(run.model, run.cluster, run.training, run.fixed, top_k=1, efficiency=eff, scaling=False)
    return result.best


def errors(runs: Sequence[ReferenceRun], eff: Efficiency) -> np.ndarray:
    """Relative step-time errors (predicted / measured - 1) of each run; +inf when nothing fits."""
    out = []
    for run in runs:
        best = predict_run(run, eff)
        out.append(np.inf if best is None else best.step_time_s / run.measured_step_s - 1.0)
    return np.array(out)


def mape(runs: Sequence[ReferenceRun], eff: Efficiency) -> float:
    """Mean absolute percentage error of the step time, in percent."""
    return float(np.mean(np.abs(errors(runs, eff))) * 100.0)


def fit_efficiency(
    runs: Sequence[ReferenceRun],
    start: Efficiency,
    names: Sequence[str] = tuple(FIT_BOUNDS),
    iterations: int = 60,
) -> Efficiency:
    """Constants ``names`` minimising the MAPE over ``runs``, from ``start``, within ``FIT_BOUNDS``.

    Nelder-Mead on the bounded box (scipy is not a dependency of the project, and a 3-parameter
    simplex is 30 lines); parameters are scaled to [0, 1] so one simplex size suits all of them."""
    lo = np.array([FIT_BOUNDS[n][0] for n in names])
    hi = np.array([FIT_BOUNDS[n][1] for n in names])

    def unpack(u: np.ndarray) -> Efficiency:
        vals = lo + np.clip(u, 0.0, 1.0) * (hi - lo)
        return start.replace(**{n: float(v) for n, v in zip(names, vals, strict=True)})

    def f(u: np.ndarray) -> float:
        return mape(runs, unpack(u))

    x0 = (np.array([getattr(start, n) for n in names]) - lo) / (hi - lo)
    simplex = [x0] + [x0 + np.eye(len(names))[i] * 0.08 for i in range(len(names))]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best point
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
        if max(values) - min(values) < 1e-3:
            break
    return unpack(simplex[int(np.argmin(values))])
