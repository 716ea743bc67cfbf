"""Model-based power-cap advice (``method = "model"``, never passed off as measured): a plan's predicted
step, split the way a cap affects it, under each limit of a grid (DVFS: the package docstring derives the
model and names its assumptions), ranked by the same Zeus cost as measured points."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.green.powercap.advice import PowerCapAdvice, advice_from_points, apply_hint
from workers.green.powercap.control import nvml_min_limit
from workers.green.powercap.points import ZEUS_SOURCE, PowerPoint, check_steps, finite_number

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
ASSUMPTION_DVFS = (
    "board power at clock ratio f = tdp x (s + (1 - s) f^3): CMOS switching power a C V^2 f (Weste & Harris, "
    "CMOS VLSI Design, 4th ed., ch. 5) with V proportional to f (an assumption: V/f curves flatten at a "
    "voltage floor)"
)
ASSUMPTION_BUSY_TDP = (
    "a busy device draws tdp_watts at the default limit (the planner's energy model): real jobs mostly draw "
    "less, so a cap binds harder here than on them and the slowdown and saving are overstated (see anchor)"
)


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
        return None if value is None else finite_number(value, f"predicted.{key}")

    step = finite_number(predicted.get("step_time_s"), "predicted.step_time_s", strict=True)
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


def predicted_and_devices(plan_or_prediction: Any) -> tuple[Mapping[str, Any], int | None]:
    """(predicted figures, device count from the strategy or None): read as the planner's energy model reads
    a plan (``workers.planner.energy.unpack_plan``), imported lazily (the planner pulls in numpy)."""
    from workers.planner.energy import unpack_plan

    return unpack_plan(plan_or_prediction)


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
    predicted, plan_devices = predicted_and_devices(plan_or_prediction)
    devices = devices if devices is not None else plan_devices
    if devices is None:
        raise ValueError("devices is required with bare predicted figures (no strategy to count them from)")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a whole number >= 1, got {devices!r}")
    tdp = finite_number(tdp_watts, "tdp_watts (board power, W)", strict=True)
    s = finite_number(static_share, "static_share", strict=True)
    if s >= 1.0:
        raise ValueError(f"static_share must be below 1, got {s:g}")
    c = finite_number(compute_bound_share, "compute_bound_share")
    if c > 1.0:
        raise ValueError(f"compute_bound_share must be in [0, 1], got {c:g}")
    energy_inputs = (predicted.get("energy") or {}).get("inputs") or {}
    if idle_watts is None and energy_inputs.get("idle_watts"):
        idle_watts, idle_source = energy_inputs["idle_watts"], energy_inputs.get("idle_source")
    idle = 0.0 if idle_watts is None else finite_number(idle_watts, "idle_watts")
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
        min_limit_w = finite_number(min_limit_w, "min_limit_w", strict=True)
        grid = model_limits(tdp, min(min_limit_w, tdp))
    else:
        given = {finite_number(w, "a power limit (W)", strict=True) for w in limits}
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
    advice = advice_from_points(
        points,
        baseline,
        eta=eta,
        max_slowdown=max_slowdown,
        max_power_w=tdp,
        method="model",
        device=device_name,
        devices=devices,
        steps=check_steps(steps),
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
