"""Power-cap advice: the limit of least Zeus cost among a set of points (optionally no more than a given
slowdown), what it costs in time and saves in energy, the Pareto frontier it was chosen from, and how the
user would apply it (nothing here applies it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.green.energy import JOULES_PER_KWH
from workers.green.powercap.points import (
    ZEUS_SOURCE,
    PowerPoint,
    PowerProfile,
    check_eta,
    check_steps,
    finite_number,
    zeus_cost,
)

NOT_APPLIED = "advice only: no power limit was changed"


@dataclass
class PowerCapAdvice:
    """The limit to use, what it costs in time and saves in energy, and the frontier it was chosen from."""

    method: str
    device: str
    devices: int
    eta: float
    max_slowdown: float | None
    max_power_w: float
    baseline: PowerPoint
    recommended: PowerPoint
    points: list[PowerPoint]
    frontier: list[PowerPoint]
    steps: int | None = None
    how_to_apply: str = ""
    assumptions: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def cost(self, p: PowerPoint) -> float:
        """Zeus cost of a point, J per device per step."""
        return zeus_cost(p.energy_per_step_j, p.step_time_s, self.eta, self.max_power_w)

    def slowdown(self, p: PowerPoint) -> float:
        """How much slower a step is than at the baseline limit (0.05 = 5% slower)."""
        return p.step_time_s / self.baseline.step_time_s - 1.0

    def energy_saving(self, p: PowerPoint) -> float:
        """The share of the baseline's energy per step a point saves (negative: it costs more)."""
        base = self.baseline.energy_per_step_j
        return 1.0 - p.energy_per_step_j / base if base > 0 else 0.0

    @property
    def slowdown_pct(self) -> float:
        return 100.0 * self.slowdown(self.recommended)

    @property
    def energy_saving_pct(self) -> float:
        return 100.0 * self.energy_saving(self.recommended)

    def _point(self, p: PowerPoint) -> dict[str, Any]:
        out = p.to_dict()
        out["zeus_cost_j"] = self.cost(p)
        out["slowdown_pct"] = 100.0 * self.slowdown(p)
        out["energy_saving_pct"] = 100.0 * self.energy_saving(p)
        out["within_max_slowdown"] = (
            self.max_slowdown is None or self.slowdown(p) <= self.max_slowdown + 1e-12
        )
        return out

    def job(self) -> dict[str, Any] | None:
        """Per-job figures over ``steps`` steps of every device, or None without ``steps``."""
        if self.steps is None:
            return None
        n, d = self.steps, self.devices
        base_t, rec_t = n * self.baseline.step_time_s, n * self.recommended.step_time_s
        base_kwh = n * d * self.baseline.energy_per_step_j / JOULES_PER_KWH
        rec_kwh = n * d * self.recommended.energy_per_step_j / JOULES_PER_KWH
        return {
            "steps": n,
            "baseline_time_s": base_t,
            "time_s": rec_t,
            "extra_time_s": rec_t - base_t,
            "slowdown_pct": 100.0 * (rec_t / base_t - 1.0),
            "baseline_energy_kwh": base_kwh,
            "energy_kwh": rec_kwh,
            "energy_saved_kwh": base_kwh - rec_kwh,
            "scope": f"{d} device(s), board energy before PUE",
        }

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "applied": False,
            "note": NOT_APPLIED,
            "device": self.device,
            "devices": self.devices,
            "eta": self.eta,
            "max_slowdown_pct": None if self.max_slowdown is None else 100.0 * self.max_slowdown,
            "max_power_w": self.max_power_w,
            "baseline": self._point(self.baseline),
            "recommended": self._point(self.recommended),
            "slowdown_pct": self.slowdown_pct,
            "energy_saving_pct": self.energy_saving_pct,
            "job": self.job(),
            "frontier": [self._point(p) for p in self.frontier],
            "points": [self._point(p) for p in self.points],
            "how_to_apply": self.how_to_apply,
            "cost_metric": ZEUS_SOURCE,
            "assumptions": list(self.assumptions),
            "sources": list(self.sources),
            "notes": list(self.notes),
        }
        out.update(self.extra)
        return out


def pareto_frontier(points: Sequence[PowerPoint]) -> list[PowerPoint]:
    """The points no other point beats on both step time and energy per step, fastest first."""

    def dominates(q: PowerPoint, p: PowerPoint) -> bool:
        return (
            q.step_time_s <= p.step_time_s
            and q.energy_per_step_j <= p.energy_per_step_j
            and (q.step_time_s < p.step_time_s or q.energy_per_step_j < p.energy_per_step_j)
        )

    front = [p for p in points if not any(dominates(q, p) for q in points if q is not p)]
    return sorted(front, key=lambda p: (p.step_time_s, p.energy_per_step_j, -p.limit_w))


def advice_from_points(
    points: Sequence[PowerPoint],
    baseline: PowerPoint,
    *,
    eta: float,
    max_slowdown: float | None,
    max_power_w: float,
    **kwargs: Any,
) -> PowerCapAdvice:
    eta = check_eta(eta)
    if max_slowdown is not None:
        max_slowdown = finite_number(max_slowdown, "max_slowdown (a fraction: 0.05 = 5% slower per step)")
    max_power_w = finite_number(max_power_w, "max_power_w (Zeus's MAXPOWER)", strict=True)
    advice = PowerCapAdvice(
        eta=eta,
        max_slowdown=max_slowdown,
        max_power_w=max_power_w,
        baseline=baseline,
        recommended=baseline,
        points=sorted(points, key=lambda p: -p.limit_w),
        frontier=pareto_frontier(points),
        **kwargs,
    )
    allowed = [p for p in points if max_slowdown is None or advice.slowdown(p) <= max_slowdown + 1e-12]
    # least cost; ties go to the faster, then the cheaper point, so the choice is on the frontier
    advice.recommended = min(
        allowed, key=lambda p: (advice.cost(p), p.step_time_s, p.energy_per_step_j, -p.limit_w)
    )
    return advice


def advise(
    profile: PowerProfile,
    eta: float = 0.5,
    max_slowdown: float | None = None,
    *,
    steps: int | None = None,
    device_index: int | None = None,
) -> PowerCapAdvice:
    """Measured advice from a :class:`PowerProfile`: the limit of least Zeus cost (``eta`` in [0, 1]: 0 picks
    the fastest point, 1 the least energy), no more than ``max_slowdown`` (a fraction: 0.05 = 5%) slower per
    step than the baseline (the profile's default limit, else its highest). MAXPOWER is the device's maximum
    limit, else the highest profiled one. ``steps`` adds per-job figures."""
    if not isinstance(profile, PowerProfile):
        raise ValueError(f"expected a PowerProfile, got {type(profile).__name__}")
    by_limit = {p.limit_w: p for p in profile.points}
    if profile.default_limit_w is not None and profile.default_limit_w in by_limit:
        baseline, basis = by_limit[profile.default_limit_w], "the default limit"
    else:
        baseline, basis = max(profile.points, key=lambda p: p.limit_w), "the highest profiled limit"
    max_power = profile.max_limit_w or max(by_limit)
    advice = advice_from_points(
        profile.points,
        baseline,
        eta=eta,
        max_slowdown=max_slowdown,
        max_power_w=max_power,
        method="measured",
        device=profile.device,
        devices=1,
        steps=check_steps(steps),
        sources=[ZEUS_SOURCE, *([profile.source] if profile.source else [])],
        notes=[f"baseline: {basis} ({baseline.limit_w:g} W)"],
    )
    index = "<gpu>" if device_index is None else str(device_index)
    advice.how_to_apply = apply_hint(advice.device, advice.recommended.limit_w, index, baseline.limit_w)
    return advice


def device_kind(name: str) -> str:
    """``nvidia``, ``npu``, ``cpu`` or ``unknown`` from a device name (what would set its power limit)."""
    key = (name or "").strip().lower()
    if key.startswith("cpu"):
        return "cpu"
    if "ascend" in key or "910" in key:
        return "npu"
    nvidia = ("nvidia", "tesla", "a100", "a800", "h100", "h200", "h800", "h20", "v100", "b100", "b200")
    nvidia += ("gh200", "gb200", "l40", "l4", "a10", "a30", "a40", "rtx", "geforce", "quadro")
    return "nvidia" if any(n in key for n in nvidia) else "unknown"


def apply_hint(device: str, limit_w: float, index: str = "<gpu>", default_w: float | None = None) -> str:
    """How the user would apply a limit themselves (nothing here applies it)."""
    w = int(round(limit_w))
    kind = device_kind(device)
    if kind == "nvidia":
        back = f" (`-pl {int(round(default_w))}` puts the default back)" if default_w else ""
        return (
            f"not applied. To apply it yourself: `sudo nvidia-smi -i {index} -pl {w}` on every GPU of the job "
            f"(root; it lasts until changed or the driver reloads){back}"
        )
    if kind == "cpu":
        return (
            "not applied. The job trains on CPUs: a package power limit (RAPL, /sys/class/powercap) or a clock "
            "ceiling (cpufreq scaling_max_freq) would apply it; cann-train sets neither"
        )
    return (
        "not applied. cann-train sets and measures power limits only through NVML (NVIDIA GPUs): set "
        f"{w} W with the {device or 'device'}'s own management tool"
    )
