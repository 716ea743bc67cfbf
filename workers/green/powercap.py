"""Power-cap advice: what a lower device power limit saves in energy and costs in time (Zeus-style), measured
where the device lets us, predicted from a plan otherwise, and **never applied silently**: nothing here
changes a power limit except :meth:`NvmlPowerLimit.profile`, on explicit request, which always restores it.

**Cost metric.** You, Chung and Chowdhury, "Zeus: Understanding and Optimizing GPU Energy Consumption of DNN
Training", NSDI '23: ``cost = eta x E + (1 - eta) x MAXPOWER x T``, ``eta`` in [0, 1] the user's preference
for energy over time, MAXPOWER the device's maximum power limit, so both terms are joules (reference code:
``ml-energy/zeus`` ``zeus/utils/metric.py`` ``zeus_cost``; its ``ZeusCost`` selector takes MAXPOWER as the
highest profiled limit x the GPUs of the job and picks the limit of least cost, ``MaxSlowdownConstraint``
the lowest limit no slower than a factor of the time at the highest limit). Here E and T are per step and
per device (the job's cost is devices x this: the same ranking).

**Measured advice** (``method = "measured"``): a :class:`PowerProfile` of ``(power_limit_w, step_time_s,
avg_power_w)`` points, from :meth:`NvmlPowerLimit.profile` (NVML sets each limit, runs a workload, reads the
board's energy counter) or recorded elsewhere; :func:`advise` returns the limit of least cost (optionally
no more than ``max_slowdown`` slower per step than the baseline, the profile's default limit or else its
highest), its time cost and energy saving, and the Pareto frontier of (step time, energy per step).

**Model-based advice** (``method = "model"``, never passed off as measured): :func:`predict_powercap` turns a
plan's predicted breakdown (``workers/planner``: ``compute_s optimizer_s exposed_comm_s bubble_s
inline_comm_s step_time_s``) into the same frontier:

- the planner's energy model (``workers/planner/energy.py``): a busy device draws ``tdp_watts``, a waiting
  one ``idle_watts`` (0 unless a measured idle figure is given), busy = compute + optimizer;
- DVFS: board power at core-clock ratio ``f`` (1 = the clock at the default limit) is
  ``P(f) = tdp x (s + (1 - s) x f^3)``: the dynamic part follows the CMOS switching power ``a C V^2 f``
  (Weste & Harris, "CMOS VLSI Design", 4th ed., ch. 5) with the supply voltage scaled in proportion to the
  clock across the DVFS range, hence ``f^3``; ``V ~ f`` is an **assumption** (real V/f curves flatten at a
  voltage floor, where power falls more slowly than ``f^3``). ``s`` (:data:`STATIC_SHARE`) is the share of
  busy board power that does not follow the core clock (leakage, HBM, board): **an assumption**, 0.2, not
  verified from a primary source (one public ``nvidia-smi -q`` log of an idle A100-SXM4-80GB at P0 reads
  68 W of a 400 W limit, 17%: the part that stays when nothing runs, so a lower bound on ``s``);
- a limit ``L`` below ``tdp`` lowers the clock until ``P(f) = L``: ``f = ((L/tdp - s) / (1 - s))^(1/3)``;
  a limit at or below ``s x tdp`` cannot be met by clocks in this model and is left out (said in ``notes``);
- the clock slows the clock-bound share of compute only: ``compute_s x (c / f + 1 - c)``, ``c`` =
  ``compute_bound_share`` (default 1: every compute kernel clock-bound, the largest slowdown; memory-bound
  kernels, the optimizer step and communication run at the memory / network clock, which a power limit does
  not lower). The pipeline bubble is other stages' compute seen from the busiest stage, so it stretches
  with the bubble-free time ``compute_s + inline_comm_s`` (the cost model's ``(p-1)/(v m)`` of it);
  exposed communication does not change;
- busy power under the cap is ``min(L, tdp)``, waiting power ``min(L, idle)``.

Because the planner's busy device draws its full ``tdp_watts``, a cap binds harder in the model than on
real jobs, most of which draw less: the model overstates both the slowdown and the saving of a cap. Each
advice carries an ``anchor``: the model's figure for a fully busy device at 60% of TDP beside published
measurements at that cap (McDonald et al., "Great Power, Great Responsibility: Recommendations for
Reducing Energy for Training Language Models", Findings of NAACL 2022, arXiv:2205.09646, abstract:
power-capping "can enable a 15% decrease in energy usage with marginal increase in overall computation time
when training a transformer-based language model", V100s at 150 W of their 250 W default; coverage of the
paper reports 13.7% less energy on average over the larger runs; Zhao et al., "Sustainable Supercomputing
for AI: GPU Power Capping at HPC Scale", SoCC '23, arXiv:2402.18593: MIT Supercloud's system-wide 60% cap).
With s = 0.2 the model says about +26% time and -24% energy there: it is a bound on what a cap can do to a job that
really keeps its device at TDP, not a forecast for a typical job; measure (``--profile``) before applying.

**Limits.** The model tries limits from ``tdp_watts`` down to the device's minimum in 25 W steps (Zeus's
``GlobalPowerLimitOptimizer`` default ``pl_step``; TDP / 10 for devices under 250 W). The minimum comes
from NVML when the plan's device is here (``nvmlDeviceGetPowerManagementLimitConstraints``), else
:data:`FALLBACK_MIN_LIMIT_FRACTION` x TDP: **an assumption** (the A100-SXM4-80GB log above reads Min Power
Limit 100 W of 400 W; other boards differ).

Where there is no power control (no NVML, no cpufreq: this CPU-only machine), no measured advice exists and
:func:`power_control_status` says why.

Pure Python (torch imported only inside :func:`gemm_workload`, pynvml only where NVML is read); nothing
here imports Django or Celery.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .energy import JOULES_PER_KWH
from .power import NvmlEnergy, SourceUnavailable

STATIC_SHARE = 0.2
"""Share of a busy device's board power that does not follow the core clock: an assumption (module doc)."""
DVFS_EXPONENT = 3.0
"""Dynamic power ~ f^3: CMOS switching power a C V^2 f with V ~ f (Weste & Harris ch. 5; V ~ f assumed)."""
LIMIT_STEP_W = 25.0
"""Stride of the model's limit grid: Zeus ``GlobalPowerLimitOptimizer(pl_step=25)`` (ml-energy/zeus)."""
FALLBACK_MIN_LIMIT_FRACTION = 0.25
"""Minimum power limit / TDP when NVML cannot tell: an assumption (A100-SXM4-80GB: 100 W of 400 W)."""
ANCHOR_CAP_SHARE = 0.6
ANCHOR_PUBLISHED = (
    "McDonald et al., Findings of NAACL 2022 (arXiv:2205.09646), abstract: power-capping 'can enable a 15% "
    "decrease in energy usage with marginal increase in overall computation time when training a "
    "transformer-based language model' (V100, 150 W of the 250 W default = 60%; 13.7% less energy on average "
    "over their larger NLP runs, as reported in coverage of the paper); Zhao et al., SoCC '23 "
    "(arXiv:2402.18593): MIT Supercloud's system-wide 60% GPU power cap"
)
ZEUS_SOURCE = (
    "You, Chung, Chowdhury, 'Zeus: Understanding and Optimizing GPU Energy Consumption of DNN Training', "
    "NSDI '23: cost = eta x E + (1 - eta) x MAXPOWER x T (ml-energy/zeus zeus/utils/metric.py zeus_cost)"
)
CPUFREQ_DIR = Path("/sys/devices/system/cpu/cpu0/cpufreq")
METHODS = ("measured", "model")
NOT_APPLIED = "advice only: no power limit was changed"

ASSUMPTION_DVFS = (
    "board power at clock ratio f = tdp x (s + (1 - s) f^3): CMOS switching power a C V^2 f (Weste & Harris, "
    "CMOS VLSI Design, 4th ed., ch. 5) with V proportional to f (an assumption: V/f curves flatten at a "
    "voltage floor)"
)
ASSUMPTION_BUSY_TDP = (
    "a busy device draws tdp_watts at the default limit (the planner's energy model): real jobs mostly draw "
    "less, so a cap binds harder here than on them and the slowdown and saving are overstated (see anchor)"
)


# ------------------------------------------------------------------------------------------ cost metric


def zeus_cost(energy_j: float, time_s: float, eta: float, max_power_w: float) -> float:
    """Zeus's energy-time cost (J): ``eta x E + (1 - eta) x MAXPOWER x T`` (You et al. NSDI '23)."""
    return eta * energy_j + (1.0 - eta) * max_power_w * time_s


def _finite(value: Any, name: str, *, low: float | None = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if strict else value >= low
    if not ok:
        bound = "" if low is None else (f" > {low:g}" if strict else f" >= {low:g}")
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return float(value)


def _check_eta(eta: Any) -> float:
    eta = _finite(eta, "eta (the weight of energy against time)", low=None)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1] (0 = fastest, 1 = least energy), got {eta:g}")
    return eta


def _check_steps(steps: Any) -> int | None:
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
        _finite(self.limit_w, "power_limit_w", strict=True)
        _finite(self.step_time_s, "step_time_s", strict=True)
        _finite(self.avg_power_w, "avg_power_w")
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


# --------------------------------------------------------------------------------------------- advice


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


def _advise(
    points: Sequence[PowerPoint],
    baseline: PowerPoint,
    *,
    eta: float,
    max_slowdown: float | None,
    max_power_w: float,
    **kwargs: Any,
) -> PowerCapAdvice:
    eta = _check_eta(eta)
    if max_slowdown is not None:
        max_slowdown = _finite(max_slowdown, "max_slowdown (a fraction: 0.05 = 5% slower per step)")
    max_power_w = _finite(max_power_w, "max_power_w (Zeus's MAXPOWER)", strict=True)
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
    advice = _advise(
        profile.points,
        baseline,
        eta=eta,
        max_slowdown=max_slowdown,
        max_power_w=max_power,
        method="measured",
        device=profile.device,
        devices=1,
        steps=_check_steps(steps),
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


# ------------------------------------------------------------------------------------- power control here


def power_control_status(*, cpufreq_dir: str | Path = CPUFREQ_DIR) -> dict[str, Any]:
    """Whether this machine can set and measure a power limit: ``{"available", "why", "nvml", "cpufreq"}``.
    Measured advice needs NVML (an NVIDIA driver and GPU); cpufreq is reported for CPU jobs, but cann-train
    has no CPU power-limit profiler, so it never makes measured advice available."""
    nvml: dict[str, Any]
    try:
        import pynvml
    except ImportError:
        nvml = {"available": False, "why": "nvidia-ml-py is not installed (pip install nvidia-ml-py)"}
    else:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            missing = isinstance(exc, getattr(pynvml, "NVMLError_LibraryNotFound", ()))
            hint = ": no NVIDIA driver (libnvidia-ml.so.1) on this machine" if missing else ""
            nvml = {"available": False, "why": f"NVML did not initialise ({exc}){hint}"}
        else:
            try:
                count = int(pynvml.nvmlDeviceGetCount())
                nvml = {"available": count > 0, "gpus": count}
                if not count:
                    nvml["why"] = "NVML sees no GPU"
            finally:
                pynvml.nvmlShutdown()
    cpufreq_dir = Path(cpufreq_dir)
    if cpufreq_dir.is_dir():
        cpufreq = {
            "available": True,
            "path": str(cpufreq_dir),
            "why": "present, but cann-train profiles power limits only through NVML (no CPU profiler)",
        }
    else:
        cpufreq = {"available": False, "why": f"{cpufreq_dir} is absent: no CPU frequency control here"}
    available = bool(nvml.get("available"))
    why = "" if available else f"NVML: {nvml['why']}; cpufreq: {cpufreq['why']}"
    return {"available": available, "why": why, "nvml": nvml, "cpufreq": cpufreq}


@dataclass(frozen=True)
class PowerLimits:
    """A GPU's power limits as NVML reports them, W."""

    min_w: float
    max_w: float
    default_w: float
    current_w: float


class NvmlPowerLimit:
    """Read, set and profile one NVIDIA GPU's power limit through NVML (``nvidia-ml-py``).

    ``NvmlPowerLimit(0)`` opens CUDA device 0 (mapped through ``CUDA_VISIBLE_DEVICES`` as
    :class:`~workers.green.power.NvmlEnergy` does, whose energy reading it uses). Reading the limits needs no
    privilege; :meth:`profile` changes the limit (``nvmlDeviceSetPowerManagementLimit``: root or
    CAP_SYS_ADMIN) and always restores the one it found. Raises :class:`SourceUnavailable` with the reason
    where NVML, the GPU or the permission is missing. Use it as a context manager (it closes NVML)."""

    def __init__(self, index: int = 0, *, env: dict[str, str] | None = None):
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"the device index must be a CUDA ordinal >= 0, got {index!r}")
        self.index = index
        self._meter = NvmlEnergy([index], env=env)  # SourceUnavailable: no pynvml / driver / device
        import pynvml

        self._nvml = pynvml
        gpu = self._meter.gpus[0]
        self.handle, self.name, self.energy_mode = gpu["handle"], gpu["name"], gpu["mode"]

    def __enter__(self) -> NvmlPowerLimit:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._meter.close()

    def limits(self) -> PowerLimits:
        """Min, max, default and current limits (``nvmlDeviceGetPowerManagementLimitConstraints``,
        ``...DefaultLimit``, ``...Limit``; mW there, W here)."""
        nv = self._nvml
        try:
            low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(self.handle)
            default = nv.nvmlDeviceGetPowerManagementDefaultLimit(self.handle)
            current = nv.nvmlDeviceGetPowerManagementLimit(self.handle)
        except nv.NVMLError as exc:
            raise SourceUnavailable(
                f"{self.name} (cuda:{self.index}) does not report its power limits through NVML: {exc}"
            ) from exc
        return PowerLimits(low / 1000.0, high / 1000.0, default / 1000.0, current / 1000.0)

    def energy_j(self) -> float:
        """The board's energy since this object opened, J (NVML's counter, else integrated power)."""
        return float(self._meter.joules(time.monotonic())["device"])

    def _set_mw(self, milliwatts: int) -> None:
        nv = self._nvml
        try:
            nv.nvmlDeviceSetPowerManagementLimit(self.handle, int(milliwatts))
        except nv.NVMLError_NoPermission as exc:
            raise SourceUnavailable(
                f"changing the power limit of {self.name} (cuda:{self.index}) needs root (or CAP_SYS_ADMIN): "
                f"NVML says {exc}; nothing was changed"
            ) from exc
        except nv.NVMLError as exc:
            raise SourceUnavailable(
                f"NVML refused the power limit {milliwatts / 1000:g} W on {self.name} (cuda:{self.index}): {exc}"
            ) from exc

    def profile(
        self,
        workload: Callable[[], int | None],
        limits: Sequence[float],
        *,
        warmup: Callable[[], Any] | None = None,
        sleep_s: float = 0.0,
    ) -> PowerProfile:
        """Measure ``workload`` under each limit (W): set the limit, run ``warmup`` (unmeasured, lets clocks
        settle), then run ``workload`` between two energy readings. ``workload()`` must finish its device work
        before it returns (synchronise) and returns the steps it ran (None = 1). The limit found on entry is
        restored in a ``finally``, whatever happens; a failed restore raises with the command to fix it."""
        if not limits:
            raise ValueError("profile needs at least one power limit (W)")
        bounds = self.limits()
        wanted = [_finite(w, "a power limit (W)", strict=True) for w in limits]
        outside = [w for w in wanted if not bounds.min_w - 1e-6 <= w <= bounds.max_w + 1e-6]
        if outside:
            raise ValueError(
                f"{self.name} accepts limits from {bounds.min_w:g} to {bounds.max_w:g} W; "
                f"{', '.join(f'{w:g}' for w in outside)} W is outside (nothing was changed)"
            )
        original_mw = int(round(bounds.current_w * 1000))
        self._set_mw(original_mw)  # a no-op change: fails early, before anything moves, without permission
        points: list[PowerPoint] = []
        try:
            for w in wanted:
                self._set_mw(int(round(w * 1000)))
                if sleep_s:
                    time.sleep(sleep_s)
                if warmup is not None:
                    warmup()
                e0, t0 = self.energy_j(), time.perf_counter()
                steps = workload()
                t1, e1 = time.perf_counter(), self.energy_j()
                steps = 1 if steps is None else steps
                if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                    raise ValueError(f"the workload must return the steps it ran (>= 1), got {steps!r}")
                wall = t1 - t0
                points.append(PowerPoint(w, wall / steps, max(0.0, e1 - e0) / wall, "measured"))
        finally:
            try:
                self._set_mw(original_mw)
            except SourceUnavailable as exc:
                raise RuntimeError(
                    f"could not restore the power limit of {self.name} to {original_mw / 1000:g} W: {exc}. "
                    f"Restore it by hand: sudo nvidia-smi -i {self.index} -pl {original_mw / 1000:g}"
                ) from exc
        how = (
            "NVML total-energy counter"
            if self.energy_mode == "energy counter"
            else "NVML power samples integrated"
        )
        return PowerProfile(
            points=tuple(points),
            device=self.name,
            source=f"measured on {self.name} (cuda:{self.index}): {how}, wall time per step; "
            f"limit restored to {original_mw / 1000:g} W",
            default_limit_w=bounds.default_w,
            max_limit_w=bounds.max_w,
            min_limit_w=bounds.min_w,
        )


def nvml_min_limit(device_name: str) -> tuple[float | None, str]:
    """(the minimum power limit of the plan's device from NVML, or None, and why / where from): used only
    when a GPU here is that device (its name contains the plan's, or the other way round)."""
    try:
        with NvmlPowerLimit(0) as gpu:
            here = gpu.name
            a, b = here.lower(), (device_name or "").lower()
            if not b or not (b in a or a.removeprefix("nvidia ") in b):
                return None, f"the GPU here ({here}) is not the plan's device ({device_name or 'unnamed'})"
            limits = gpu.limits()
            return limits.min_w, f"NVML nvmlDeviceGetPowerManagementLimitConstraints on {here} (cuda:0)"
    except SourceUnavailable as exc:
        return None, str(exc)


def gemm_workload(seconds: float, *, device_index: int = 0, size: int = 8192, per_step: int = 8):
    """A callable for :meth:`NvmlPowerLimit.profile`: square GEMMs (bf16 where supported, else fp16) on CUDA
    device ``device_index`` for ``seconds`` (or the seconds it is called with); a step is ``per_step`` GEMMs
    then a synchronise. It returns the steps it ran. Raises :class:`SourceUnavailable` without CUDA."""
    seconds = _finite(seconds, "seconds", strict=True)
    import torch

    if not torch.cuda.is_available():
        raise SourceUnavailable(f"no CUDA device visible to torch {torch.__version__}")
    device = torch.device("cuda", device_index)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def run(for_s: float | None = None) -> int:
        steps, end = 0, time.perf_counter() + (seconds if for_s is None else for_s)
        while steps == 0 or time.perf_counter() < end:
            for _ in range(per_step):
                torch.mm(a, b)
            torch.cuda.synchronize(device)
            steps += 1
        return steps

    run.describe = f"{per_step} x {size}x{size} {str(dtype).removeprefix('torch.')} GEMMs per step"  # type: ignore[attr-defined]
    return run


# ------------------------------------------------------------------------------------------------ model


@dataclass(frozen=True)
class StepBreakdown:
    """A plan's predicted step on its busiest device, split the way a power cap affects it (s)."""

    step_time_s: float
    compute_s: float
    """Compute kernels: the clock-bound share slows under a cap."""
    optimizer_s: float
    """The optimizer step (memory-bound: not slowed)."""
    bubble_s: float
    """Pipeline bubble: stretches with the bubble-free time (compute + inline communication)."""
    inline_comm_s: float
    """Communication inside the micro-batches (TP/EP/CP): part of the bubble-free time, not slowed."""
    other_wait_s: float
    """Exposed communication outside the bubble (PP p2p, DP): not slowed."""
    basis: str


def step_breakdown(predicted: Mapping[str, Any]) -> StepBreakdown:
    """The :class:`StepBreakdown` of a plan's ``predicted`` figures (the planner's breakdown fields, else the
    contract's ``bubble_fraction`` and ``exposed_comm_s``)."""

    def num(key: str) -> float | None:
        value = predicted.get(key)
        return None if value is None else _finite(value, f"predicted.{key}")

    step = _finite(predicted.get("step_time_s"), "predicted.step_time_s", strict=True)
    compute, optimizer, exposed = num("compute_s"), num("optimizer_s"), num("exposed_comm_s")
    bubble = num("bubble_s")
    if bubble is None and num("bubble_fraction") is not None:
        bubble = num("bubble_fraction") * step
    if compute is not None and optimizer is not None:
        inline = num("inline_comm_s") or 0.0
        basis = "the plan's breakdown: compute_s, optimizer_s, bubble_s, inline_comm_s"
    else:
        if bubble is None or exposed is None:
            missing = [k for k, v in (("bubble_fraction", bubble), ("exposed_comm_s", exposed)) if v is None]
            raise ValueError(
                f"the plan's predicted figures lack compute_s/optimizer_s and {', '.join(missing)}: re-cost the "
                "plan (cann-train strategy) to predict what a power cap does to it"
            )
        compute, optimizer, inline = max(0.0, step - bubble - exposed), 0.0, 0.0
        basis = "step_time_s x (1 - bubble_fraction) - exposed_comm_s, all counted as compute (no breakdown)"
    if compute + optimizer > step * (1 + 1e-6):
        raise ValueError(
            f"predicted compute_s + optimizer_s ({compute + optimizer:g} s) exceed step_time_s ({step:g} s)"
        )
    wait = max(0.0, step - compute - optimizer)
    bubble = min(bubble or 0.0, wait)
    return StepBreakdown(step, compute, optimizer, bubble, inline, wait - bubble, basis)


def clock_ratio(limit_w: float, tdp_w: float, static_share: float = STATIC_SHARE) -> float | None:
    """Core-clock ratio at which a busy device meets ``limit_w``: ``P(f) = tdp (s + (1-s) f^3) = limit``;
    1 at or above the TDP, None when the limit is at or below the static power (unreachable by clocks)."""
    share = limit_w / tdp_w
    if share >= 1.0:
        return 1.0
    if share <= static_share:
        return None
    return ((share - static_share) / (1.0 - static_share)) ** (1.0 / DVFS_EXPONENT)


def model_point(
    bd: StepBreakdown,
    limit_w: float,
    tdp_w: float,
    *,
    idle_w: float = 0.0,
    static_share: float = STATIC_SHARE,
    compute_bound_share: float = 1.0,
) -> PowerPoint | None:
    """The predicted step (time, average power per device) under ``limit_w``; None when unreachable."""
    f = clock_ratio(limit_w, tdp_w, static_share)
    if f is None:
        return None
    c = compute_bound_share
    compute = bd.compute_s * (c / f + 1.0 - c)
    ideal = bd.compute_s + bd.inline_comm_s
    bubble = bd.bubble_s * (compute + bd.inline_comm_s) / ideal if ideal > 0 else bd.bubble_s
    busy, wait = compute + bd.optimizer_s, bubble + bd.other_wait_s
    step = busy + wait
    energy = min(limit_w, tdp_w) * busy + min(limit_w, idle_w) * wait
    return PowerPoint(limit_w, step, energy / step, "model", f)


def model_limits(tdp_w: float, min_limit_w: float, step_w: float | None = None) -> list[float]:
    """``tdp_w``, then every ``step_w`` below it down to ``min_limit_w`` (included). ``step_w`` defaults to
    Zeus's 25 W, or TDP / 10 for devices under 250 W (so that a small device gets more than a few limits)."""
    if step_w is None:
        step_w = min(LIMIT_STEP_W, tdp_w / 10.0)
    grid, k = [float(tdp_w)], 1
    while tdp_w - k * step_w > min_limit_w + 1e-9:
        grid.append(float(tdp_w - k * step_w))
        k += 1
    if min_limit_w < tdp_w:
        grid.append(float(min_limit_w))
    return grid


def anchor(static_share: float = STATIC_SHARE) -> dict[str, Any]:
    """The model on a fully busy device (no waiting) capped at 60% of TDP, beside published measurements at
    that cap: how far the model's busy-at-TDP premise sits from real jobs."""
    bd = StepBreakdown(1.0, 1.0, 0.0, 0.0, 0.0, 0.0, "a fully busy step")
    base = model_point(bd, 1.0, 1.0, static_share=static_share)
    capped = model_point(bd, ANCHOR_CAP_SHARE, 1.0, static_share=static_share)
    if base is None or capped is None:
        return {"cap_share": ANCHOR_CAP_SHARE, "model": "unreachable with this static share"}
    return {
        "cap_share": ANCHOR_CAP_SHARE,
        "model_slowdown_pct": 100.0 * (capped.step_time_s / base.step_time_s - 1.0),
        "model_energy_saving_pct": 100.0 * (1.0 - capped.energy_per_step_j / base.energy_per_step_j),
        "published": ANCHOR_PUBLISHED,
    }


def predict_powercap(
    plan_or_prediction: Any,
    *,
    tdp_watts: float,
    tdp_source: str = "",
    devices: int | None = None,
    device_name: str = "",
    eta: float = 0.5,
    max_slowdown: float | None = None,
    steps: int | None = None,
    limits: Sequence[float] | None = None,
    min_limit_w: float | None = None,
    min_limit_source: str | None = None,
    idle_watts: float | None = None,
    idle_source: str | None = None,
    static_share: float = STATIC_SHARE,
    compute_bound_share: float = 1.0,
    measured_status: Mapping[str, Any] | None = None,
    read_nvml: bool = True,
) -> PowerCapAdvice:
    """Model-based advice for a plan (``method = "model"`` on every point): a :class:`Plan`, a ``plan.json``
    dict or its ``predicted`` dict (then ``devices`` is needed), the device's ``tdp_watts`` (the baseline
    limit and Zeus's MAXPOWER), ``eta`` / ``max_slowdown`` / ``steps`` as in :func:`advise`. ``limits``
    default to the 25 W grid from the TDP down to ``min_limit_w`` (NVML when the plan's device is here, else
    :data:`FALLBACK_MIN_LIMIT_FRACTION` x TDP, said in ``assumptions``; ``read_nvml=False`` skips NVML).
    ``measured_status`` (from :func:`power_control_status`) says whether measured advice could be had here,
    and why not."""
    from workers.planner.energy import _unpack

    predicted, plan_devices = _unpack(plan_or_prediction)
    devices = devices if devices is not None else plan_devices
    if devices is None:
        raise ValueError("devices is required with bare predicted figures (no strategy to count them from)")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a whole number >= 1, got {devices!r}")
    tdp = _finite(tdp_watts, "tdp_watts (board power, W)", strict=True)
    s = _finite(static_share, "static_share", strict=True)
    if s >= 1.0:
        raise ValueError(f"static_share must be below 1, got {s:g}")
    c = _finite(compute_bound_share, "compute_bound_share")
    if c > 1.0:
        raise ValueError(f"compute_bound_share must be in [0, 1], got {c:g}")
    energy_inputs = (predicted.get("energy") or {}).get("inputs") or {}
    if idle_watts is None and energy_inputs.get("idle_watts"):
        idle_watts, idle_source = energy_inputs["idle_watts"], energy_inputs.get("idle_source")
    idle = 0.0 if idle_watts is None else _finite(idle_watts, "idle_watts")
    bd = step_breakdown(predicted)

    assumptions = [ASSUMPTION_BUSY_TDP, ASSUMPTION_DVFS]
    assumptions.append(
        f"static share s = {s:g} of busy board power does not follow the clock"
        + (" (assumption, not verified from a primary source)" if s == STATIC_SHARE else " (given)")
    )
    assumptions.append(
        f"compute_bound_share = {c:g} of compute_s slows with the clock"
        + (" (every compute kernel clock-bound: the largest slowdown)" if c == 1.0 else "")
        + "; optimizer, communication and memory-bound kernels do not"
    )
    if idle == 0.0:
        assumptions.append("no idle figure: a waiting device draws 0 W (as the planner's energy model)")
    notes = [f"breakdown: {bd.basis}"]
    if min_limit_w is None and limits is None:
        min_limit_w, why = (
            nvml_min_limit(device_name)
            if read_nvml
            else (None, "not read: the plan is costed away from its devices")
        )
        if min_limit_w is not None:
            min_limit_source = why
        else:
            min_limit_w = FALLBACK_MIN_LIMIT_FRACTION * tdp
            min_limit_source = f"assumed {FALLBACK_MIN_LIMIT_FRACTION:g} x TDP (NVML: {why})"
            assumptions.append(
                f"minimum power limit {min_limit_w:g} W = {FALLBACK_MIN_LIMIT_FRACTION:g} x TDP: an assumption "
                "(an A100-SXM4-80GB reports 100 W of 400 W through nvidia-smi; other devices differ)"
            )
    if limits is None:
        min_limit_w = _finite(min_limit_w, "min_limit_w", strict=True)
        grid = model_limits(tdp, min(min_limit_w, tdp))
    else:
        given = {_finite(w, "a power limit (W)", strict=True) for w in limits}
        above = sorted(w for w in given if w > tdp)
        if above:
            notes.append(
                f"left out {', '.join(f'{w:g}' for w in above)} W: above tdp_watts, the model's default"
            )
        grid = sorted({w for w in given if w <= tdp} | {tdp}, reverse=True)
    points, unreachable = [], []
    for w in grid:
        p = model_point(bd, w, tdp, idle_w=idle, static_share=s, compute_bound_share=c)
        if p is None:
            unreachable.append(w)
        else:
            points.append(p)
    if unreachable:
        notes.append(
            f"left out {', '.join(f'{w:g}' for w in unreachable)} W: at or below the model's static power "
            f"({s * tdp:g} W), clocks alone cannot meet them in this model"
        )
    baseline = points[0]  # the TDP: the default limit
    advice = _advise(
        points,
        baseline,
        eta=eta,
        max_slowdown=max_slowdown,
        max_power_w=tdp,
        method="model",
        device=device_name,
        devices=devices,
        steps=_check_steps(steps),
        assumptions=assumptions,
        sources=[
            ZEUS_SOURCE,
            f"tdp_watts {tdp:g} W: {tdp_source or 'given'}",
            *([f"idle_watts {idle:g} W: {idle_source}"] if idle else []),
            *([f"minimum limit: {min_limit_source}"] if min_limit_source else []),
            "DVFS: Weste & Harris, CMOS VLSI Design, 4th ed., ch. 5 (P = a C V^2 f)",
            f"limit grid: {min(LIMIT_STEP_W, tdp / 10):g} W steps (Zeus GlobalPowerLimitOptimizer's default "
            f"pl_step is {LIMIT_STEP_W:g} W; TDP / 10 below 250 W)"
            if limits is None
            else "limits: given",
        ],
        notes=notes,
    )
    advice.how_to_apply = apply_hint(device_name, advice.recommended.limit_w, default_w=tdp)
    advice.extra = {
        "label": "model: predicted from the plan, not measured",
        "inputs": {
            "tdp_watts": tdp,
            "idle_watts": idle,
            "static_share": s,
            "compute_bound_share": c,
            "min_limit_w": min_limit_w,
            "breakdown": {k: v for k, v in bd.__dict__.items()},
        },
        "anchor": anchor(s),
    }
    if measured_status is not None:
        advice.extra["measured"] = {
            "available": bool(measured_status.get("available")),
            "why": measured_status.get("why")
            or "measure it: cann-train green powercap --profile (NVML, root)",
        }
    return advice


def plan_powercap_block(
    predicted: Mapping[str, Any],
    devices: int,
    power_profile: Mapping[str, Any] | None,
    device_name: str = "",
    *,
    eta: float = 0.5,
    max_slowdown: float | None = None,
) -> dict[str, Any]:
    """The optional ``predicted["energy"]["powercap"]`` block of a costed plan: :func:`predict_powercap`'s
    dict for the device of ``power_profile`` (``workers.planner.energy.device_power_profile(cluster)``)
    without its dominated ``points`` (the ``frontier`` holds the rest), or ``{"method": "model",
    "unavailable": why}`` when its power is unknown or the plan cannot be modelled. Never reads NVML (a plan
    is costed away from its devices): the minimum limit is the labelled fallback."""
    if power_profile is None or power_profile.get("tdp_watts") is None:
        return {
            "method": "model",
            "unavailable": f"no tdp_watts for the device {device_name!r}: set the cluster's device.tdp_watts",
        }
    tdp = float(power_profile["tdp_watts"])
    try:
        block = predict_powercap(
            predicted,
            devices=devices,
            tdp_watts=tdp,
            tdp_source=power_profile.get("tdp_source", ""),
            device_name=device_name or power_profile.get("name", ""),
            eta=eta,
            max_slowdown=max_slowdown,
            read_nvml=False,
            idle_watts=power_profile.get("idle_watts"),
            idle_source=power_profile.get("idle_source"),
        ).to_dict()
        block.pop("points")
        return block
    except ValueError as exc:
        return {"method": "model", "unavailable": str(exc)}


__all__ = [
    "PowerCapAdvice",
    "PowerLimits",
    "PowerPoint",
    "PowerProfile",
    "NvmlPowerLimit",
    "advise",
    "gemm_workload",
    "pareto_frontier",
    "plan_powercap_block",
    "power_control_status",
    "predict_powercap",
    "step_breakdown",
    "zeus_cost",
]
