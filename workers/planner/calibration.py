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

from .hardware import Efficiency, derive_gemm, efficiency_for, find_profile, model_constants
from .search import search
from .specs import ClusterSpec, ModelSpec, Strategy, TrainingConfig

# the constants the accuracy fit may move, with physically plausible bounds
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_max": (0.5, 0.95),
    "gemm_half_intensity": (10.0, 600.0),
    "elementwise_traffic": (0.5, 4.0),
}


# the device-independent constants (hardware.model_constants, plus elementwise_traffic) a cross-device fit
# moves: each run's device turns them into its own gemm_max / gemm_half_intensity (hardware.derive_gemm)
CONSTANT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_of_mamf": (0.5, 1.1),
    "operand_reuse": (0.3, 10.0),
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
    paper: str = ""
    """Which publication the run comes from (a short key): the unit of leave-one-paper-out."""

    @property
    def device(self) -> str:
        """The device profile the run is predicted with (the unit of leave-one-device-out)."""
        return find_profile(self.cluster.device.name)[0]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReferenceRun:
        return cls(
            id=d["id"],
            paper=d.get("paper") or d["id"].split("-")[0],
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


def shipped_constants() -> dict[str, float]:
    """The shipped device-independent constants (:data:`CONSTANT_BOUNDS` names)."""
    a100 = efficiency_for("A100")[1]
    return {**model_constants(), "elementwise_traffic": a100.elementwise_traffic}


def run_efficiency(run: ReferenceRun, constants: dict[str, float] | None = None) -> Efficiency:
    """The constants a run is predicted with: its device profile's, with ``constants`` (a cross-device
    fit's) turned into that device's gemm figures where the profile derives them (every accelerator)."""
    _name, profile = find_profile(run.cluster.device.name)
    eff = Efficiency.from_profile(profile)
    if constants is None:
        return eff
    changes = {}
    if "achievable_matmul" in profile and "gemm_max" not in profile.get("efficiency", {}):
        changes.update(derive_gemm(profile, constants))
    if "elementwise_traffic" in constants:
        changes["elementwise_traffic"] = constants["elementwise_traffic"]
    return eff.replace(**changes)


def run_errors(runs: Sequence[ReferenceRun], constants: dict[str, float] | None = None) -> np.ndarray:
    """Relative step-time errors of runs on any devices, each with :func:`run_efficiency`."""
    out = []
    for run in runs:
        best = predict_run(run, run_efficiency(run, constants))
        out.append(np.inf if best is None else best.step_time_s / run.measured_step_s - 1.0)
    return np.array(out)


def _mape_of(e: np.ndarray) -> float:
    # a run nothing fits for counts as 100% off (not inf: the simplex must still compare points)
    return float(np.mean(np.minimum(np.abs(e), 1.0)) * 100.0)


def fit_constants(
    runs: Sequence[ReferenceRun], start: dict[str, float] | None = None, iterations: int = 60
) -> dict[str, float]:
    """The device-independent constants minimising the MAPE over runs of any devices (leave-one-paper-out
    and leave-one-device-out fit these, so what carries from one device to another is the model)."""
    start = start or shipped_constants()
    names = tuple(CONSTANT_BOUNDS)
    lo = np.array([CONSTANT_BOUNDS[n][0] for n in names])
    hi = np.array([CONSTANT_BOUNDS[n][1] for n in names])

    def unpack(u: np.ndarray) -> dict[str, float]:
        vals = lo + np.clip(u, 0.0, 1.0) * (hi - lo)
        return {**start, **{n: float(v) for n, v in zip(names, vals, strict=True)}}

    x0 = (np.array([start[n] for n in names]) - lo) / (hi - lo)
    best = _nelder_mead(lambda u: _mape_of(run_errors(runs, unpack(u))), x0, iterations)
    return unpack(best)


def fit_efficiency(
    runs: Sequence[ReferenceRun],
    start: Efficiency,
    names: Sequence[str] = tuple(FIT_BOUNDS),
    iterations: int = 60,
) -> Efficiency:
    """Constants ``names`` minimising the MAPE over ``runs``, from ``start``, within ``FIT_BOUNDS``."""
    lo = np.array([FIT_BOUNDS[n][0] for n in names])
    hi = np.array([FIT_BOUNDS[n][1] for n in names])

    def unpack(u: np.ndarray) -> Efficiency:
        vals = lo + np.clip(u, 0.0, 1.0) * (hi - lo)
        return start.replace(**{n: float(v) for n, v in zip(names, vals, strict=True)})

    x0 = (np.array([getattr(start, n) for n in names]) - lo) / (hi - lo)
    return unpack(_nelder_mead(lambda u: mape(runs, unpack(u)), x0, iterations))


def _nelder_mead(f, x0: np.ndarray, iterations: int) -> np.ndarray:
    """Nelder-Mead on the unit box (scipy is not a dependency of the project, and a 3-parameter simplex is
    30 lines); parameters are scaled to [0, 1] so one simplex size suits all of them."""
    n = len(x0)
    simplex = [x0] + [x0 + np.eye(n)[i] * 0.08 for i in range(n)]
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
    return simplex[int(np.argmin(values))]
