"""The cost metric and the points it ranks: Zeus's energy-time cost, one power limit and what a step does
under it (:class:`PowerPoint`), and a measured profile of such points (:class:`PowerProfile`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ZEUS_SOURCE = (
    "You, Chung, Chowdhury, 'Zeus: Understanding and Optimizing GPU Energy Consumption of DNN Training', "
    "NSDI '23: cost = eta x E + (1 - eta) x MAXPOWER x T (ml-energy/zeus zeus/utils/metric.py zeus_cost)"
)
METHODS = ("measured", "model")


# ------------------------------------------------------------------------------------------ cost metric


def zeus_cost(energy_j: float, time_s: float, eta: float, max_power_w: float) -> float:
    """Zeus's energy-time cost (J): ``eta x E + (1 - eta) x MAXPOWER x T`` (You et al. NSDI '23)."""
    return eta * energy_j + (1.0 - eta) * max_power_w * time_s


def finite_number(value: Any, name: str, *, low: float | None = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if strict else value >= low
    if not ok:
        bound = "" if low is None else (f" > {low:g}" if strict else f" >= {low:g}")
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return float(value)


def check_eta(eta: Any) -> float:
    eta = finite_number(eta, "eta (the weight of energy against time)", low=None)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1] (0 = fastest, 1 = least energy), got {eta:g}")
    return eta


def check_steps(steps: Any) -> int | None:
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    return steps


# ---------------------------------------------------------------------------------------------- points


@dataclass(frozen=True)
class PowerPoint:
    """One power limit and what a training step does under it (per device)."""

    limit_w: float
    """The power limit, W."""
    step_time_s: float
    """Time per step under that limit, s."""
    avg_power_w: float
    """Average board power over the step, W."""
    method: str = "measured"
    """``measured`` (a meter read it) or ``model`` (predicted: see the module docstring)."""
    clock_ratio: float | None = None
    """Model only: the core clock relative to the clock at the default limit."""

    def __post_init__(self) -> None:
        finite_number(self.limit_w, "power_limit_w", strict=True)
        finite_number(self.step_time_s, "step_time_s", strict=True)
        finite_number(self.avg_power_w, "avg_power_w")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")

    @property
    def energy_per_step_j(self) -> float:
        return self.avg_power_w * self.step_time_s

    def to_dict(self) -> dict[str, Any]:
        out = {
            "limit_w": self.limit_w,
            "step_time_s": self.step_time_s,
            "avg_power_w": self.avg_power_w,
            "energy_per_step_j": self.energy_per_step_j,
            "method": self.method,
        }
        if self.clock_ratio is not None:
            out["clock_ratio"] = self.clock_ratio
        return out


@dataclass(frozen=True)
class PowerProfile:
    """Measured ``(power_limit_w, step_time_s, avg_power_w)`` points of one workload on one device."""

    points: tuple[PowerPoint, ...]
    device: str = ""
    source: str = ""
    """How the points were measured (e.g. 'NVML total-energy counter, 5 s GEMM loop per limit')."""
    default_limit_w: float | None = None
    """The device's default limit: the baseline when it was profiled."""
    max_limit_w: float | None = None
    """The device's maximum limit (Zeus's MAXPOWER); else the highest profiled limit."""
    min_limit_w: float | None = None

    @classmethod
    def from_tuples(cls, rows: Sequence[Sequence[float]], **kwargs: Any) -> PowerProfile:
        """A measured profile from ``(power_limit_w, step_time_s, avg_power_w)`` rows."""
        points = []
        for i, row in enumerate(rows):
            if len(row) != 3:
                raise ValueError(
                    f"profile row {i}: expected (power_limit_w, step_time_s, avg_power_w), got {row!r}"
                )
            points.append(PowerPoint(float(row[0]), float(row[1]), float(row[2]), "measured"))
        return cls(points=tuple(points), **kwargs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", tuple(self.points))
        if not self.points:
            raise ValueError(
                "a power profile needs at least one (power_limit_w, step_time_s, avg_power_w) point"
            )
        limits = [p.limit_w for p in self.points]
        if len(set(limits)) != len(limits):
            raise ValueError(f"a power profile has one point per limit; repeated limits in {sorted(limits)}")
        if any(p.method != "measured" for p in self.points):
            raise ValueError("a PowerProfile holds measured points only (the model builds its own)")
