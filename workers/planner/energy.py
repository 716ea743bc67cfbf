"""Predicted energy and carbon of a plan: what one step, and one million tokens, will draw.

The planner predicts a step time and how much of it each device computes; the device's board power
(``tdp_watts`` of the cluster's device, else of its hardware profile) turns that into watts and then kWh:

- utilisation ``u`` = the busy share of the step on the busiest pipeline stage,
  ``(compute_s + optimizer_s) / step_time_s`` (= ``1 - bubble_fraction - exposed_comm_s / step_time_s``,
  the form used for plan documents that predate the breakdown fields). Not the MFU: MFU counts only the
  model's useful FLOPs against the peak, so a device that runs kernels through the whole step at 40% MFU
  would be charged 40% of its power. Power follows activity (kernels running), not useful FLOPs: Latif et
  al., "Single-Node Power Demand During AI Training: Measurements on an 8-GPU NVIDIA H100 System", IEEE
  Access 13, 2025 (arXiv:2412.08602), measured an 8-GPU H100 node training Llama2-13b "with GPUs near full
  utilization" at up to ~8.4 kW, 82% of its 10.2 kW rating (the node figure includes its hosts).
  The green engine's runtime estimate has the same form (``DeviceEstimate``: TDP x a utilisation, which
  is 1 when the job gives none), so a job's labelled estimate and its plan's prediction compare.
- device power ``W = idle + (tdp - idle) x u`` (a linear power model between idle and board power). No
  idle figure ships: none could be verified from a primary source here, so ``idle = 0`` and
  ``W = tdp x u``, CodeCarbon's TDP x load (``workers/green/data/power_defaults.json``, ``accelerator``).
  A device dict (or the ``idle_watts`` argument) may carry a measured ``idle_watts`` with its source.
  With ``idle = 0`` the time a device waits (pipeline bubble, exposed communication) costs nothing, so
  plans that wait more are predicted too cheap: a lower bound, said in ``notes``.
- IT energy per step = devices x W x step_time_s; per 1M tokens = devices x W x 1e6 / tokens_per_s;
  tokens per kWh = tokens_per_s x 3.6e6 / (devices x W) (IT energy, before PUE, as the green engine's
  ``EnergyAccount.tokens_per_kwh``: the hardware's efficiency, comparable across sites).
- facility energy = IT energy x PUE (the caller's, else the green engine's cited default).
- kgCO2e = facility kWh x intensity (gCO2e/kWh) / 1000, only when an intensity is given (absent, not 0,
  otherwise).

Scope: the accelerator boards only. Host CPUs, host memory, NICs and switches are not predicted (the plan
knows nothing of the hosts); PUE covers the facility overhead above the IT load, not them.

Pure Python; nothing here imports Django, Celery or torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .plan import Plan
from .specs import ClusterSpec, DeviceSpec

JOULES_PER_KWH = 3.6e6
TOKENS_PER_MILLION = 1_000_000
METHOD = "predicted"
SCOPE = "accelerator boards only; host CPUs, memory and network not predicted; facility_ = IT x PUE"
UTILISATION_BASIS = "busy share of the busiest stage: (compute_s + optimizer_s) / step_time_s"
UTILISATION_BASIS_CONTRACT = "busy share: 1 - bubble_fraction - exposed_comm_s / step_time_s"
NO_IDLE_NOTE = "no idle figure: W = tdp_watts x utilisation, waiting time costs 0 W (a lower bound)"
_FACILITY = json.loads((Path(__file__).parent / "data" / "facility.json").read_text())
DEFAULT_PUE = float(_FACILITY["pue"]["default"])
"""Uptime Institute's 2023 industry-average PUE (1.58), for a site that states none; the planner's own
figure (``data/facility.json``, its citation in ``PUE_SOURCE``), which the green engine's accounts use too."""
PUE_SOURCE = _FACILITY["pue"]["source"]
DEFAULT_PUE_REFERENCE = "default: workers/planner/data/facility.json, pue.source"
"""Where the default PUE's citation lives (the plan block points there rather than repeating it)."""


def _number(value: Any, name: str, *, low: float = 0.0, low_inclusive: bool = True) -> float:
    """``value`` as a finite float >= (or >) ``low``, else a ValueError naming ``name``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = value >= low if low_inclusive else value > low
    if not ok:
        bound = f">= {low:g}" if low_inclusive else f"> {low:g}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def unpack_plan(plan_or_prediction: Plan | Mapping[str, Any]) -> tuple[Mapping[str, Any], int | None]:
    """(predicted figures, device count from the strategy or None) of a Plan, a plan.json dict or a bare
    ``predicted`` dict."""
    if isinstance(plan_or_prediction, Plan):
        s = plan_or_prediction.strategy
        return plan_or_prediction.predicted, s.tp * s.pp * s.dp * s.cp
    if not isinstance(plan_or_prediction, Mapping):
        raise ValueError(
            f"expected a plan (plan.json) or its predicted figures, got {type(plan_or_prediction).__name__}"
        )
    if "predicted" in plan_or_prediction:
        s = plan_or_prediction.get("strategy") or {}
        try:
            devices = int(s["tp"]) * int(s["pp"]) * int(s["dp"]) * int(s.get("cp") or 1)
        except (KeyError, TypeError, ValueError):
            devices = None
        return plan_or_prediction["predicted"] or {}, devices
    return plan_or_prediction, None


def _device_power_inputs(hardware_profile: DeviceSpec | Mapping[str, Any]) -> dict[str, Any]:
    """``tdp_watts``, ``tdp_source``, ``idle_watts``, ``idle_source`` and ``device`` of a cluster's device
    (``DeviceSpec`` or its dict) or a hardware profile (``data/hardware_profiles.json``)."""
    if isinstance(hardware_profile, DeviceSpec):
        return {
            "device": hardware_profile.name,
            "tdp_watts": hardware_profile.tdp_watts,
            "tdp_source": "cluster.json device.tdp_watts",
            "idle_watts": None,
            "idle_source": None,
        }
    if not isinstance(hardware_profile, Mapping):
        raise ValueError(
            "hardware_profile must be a cluster's device (DeviceSpec or its dict) or a hardware profile "
            f"with tdp_watts, got {type(hardware_profile).__name__}"
        )
    sources = hardware_profile.get("sources") or {}
    return {
        "device": hardware_profile.get("name", ""),
        "tdp_watts": hardware_profile.get("tdp_watts"),
        "tdp_source": hardware_profile.get("tdp_source")
        or sources.get("tdp_watts")
        or sources.get("all")
        or "the device's tdp_watts",
        "idle_watts": hardware_profile.get("idle_watts"),
        "idle_source": hardware_profile.get("idle_source") or sources.get("idle_watts"),
    }


def busy_share(predicted: Mapping[str, Any]) -> tuple[float, str]:
    """(utilisation in [0, 1], how it was obtained) of a plan's predicted figures; see the module docstring."""
    step = _number(predicted.get("step_time_s"), "predicted.step_time_s", low_inclusive=False)
    if isinstance(predicted.get("compute_s"), int | float) and isinstance(
        predicted.get("optimizer_s"), int | float
    ):
        busy = float(predicted["compute_s"]) + float(predicted["optimizer_s"])
        basis = UTILISATION_BASIS
    else:
        missing = [k for k in ("bubble_fraction", "exposed_comm_s") if k not in predicted]
        if missing:
            raise ValueError(
                "the plan's predicted figures lack compute_s/optimizer_s and "
                f"{', '.join(missing)}: re-cost the plan (cann-train strategy) to predict its energy"
            )
        bubble = _number(predicted["bubble_fraction"], "predicted.bubble_fraction")
        exposed = _number(predicted["exposed_comm_s"], "predicted.exposed_comm_s")
        busy = step * (1.0 - bubble) - exposed
        basis = UTILISATION_BASIS_CONTRACT
    return min(1.0, max(0.0, busy / step)), basis


def predict_energy(
    plan_or_prediction: Plan | Mapping[str, Any],
    hardware_profile: DeviceSpec | Mapping[str, Any],
    *,
    pue: float | None = None,
    pue_source: str | None = None,
    intensity_g_per_kwh: float | None = None,
    intensity_source: str | None = None,
    num_devices: int | None = None,
    idle_watts: float | None = None,
    idle_source: str | None = None,
) -> dict[str, Any]:
    """Predicted energy (and carbon, given an intensity) of one plan; formulas in the module docstring.

    ``plan_or_prediction``: a :class:`Plan`, a ``plan.json`` dict, or its ``predicted`` dict (then
    ``num_devices`` is required). ``hardware_profile``: the cluster's device (``DeviceSpec`` or dict) or a
    hardware profile; its ``tdp_watts`` is required. ``pue`` (>= 1) and ``intensity_g_per_kwh`` (>= 0)
    each need their source; ``pue`` defaults to the green engine's cited default. ``idle_watts`` (with
    ``idle_source``) overrides the profile's.

    Returns ``{"method": "predicted", "watts_per_device", "utilisation", "devices", "kwh_per_step",
    "kwh_per_1m_tokens", "tokens_per_kwh", "facility_kwh_per_step", "facility_kwh_per_1m_tokens", "pue",
    ["kgco2e_per_step", "kgco2e_per_1m_tokens"], "inputs": {...every input and its source}, "scope",
    "notes"}``: every figure of the block is a prediction from those inputs. kWh figures are IT energy of
    the devices unless named ``facility_``; carbon is on facility energy (location-based).
    """
    predicted, devices = unpack_plan(plan_or_prediction)
    if num_devices is not None:
        devices = num_devices
    if devices is None:
        raise ValueError(
            "num_devices is required with bare predicted figures (no strategy to count them from)"
        )
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"num_devices must be a whole number >= 1, got {devices!r}")

    power = _device_power_inputs(hardware_profile)
    if idle_watts is not None:
        power["idle_watts"], power["idle_source"] = idle_watts, idle_source
    if power["tdp_watts"] is None:
        name = f" {power['device']!r}" if power["device"] else ""
        raise ValueError(
            f"the device{name} has no tdp_watts: set the cluster's device.tdp_watts (board power in W, from "
            "its datasheet) to predict energy"
        )
    tdp = _number(power["tdp_watts"], "tdp_watts", low_inclusive=False)
    idle = 0.0
    if power["idle_watts"] is not None:
        idle = _number(power["idle_watts"], "idle_watts")
        if idle >= tdp:
            raise ValueError(f"idle_watts ({idle:g}) must be below tdp_watts ({tdp:g})")
        if not power["idle_source"]:
            raise ValueError("idle_watts needs its source (a measurement, a paper): pass idle_source")

    if pue is None:
        if pue_source is not None:
            raise ValueError("pue_source given without a pue")
        pue, pue_source = DEFAULT_PUE, DEFAULT_PUE_REFERENCE
    else:
        pue = _number(pue, "pue (total facility energy / IT energy)", low=1.0)
        if not pue_source:
            raise ValueError("a PUE needs its source (a measurement, the operator's report): pass pue_source")
    if intensity_g_per_kwh is not None:
        intensity_g_per_kwh = _number(intensity_g_per_kwh, "intensity_g_per_kwh (gCO2e per kWh)")
        if not intensity_source:
            raise ValueError(
                "a carbon intensity needs its source (provider and zone, or a published average): pass "
                "intensity_source"
            )

    step = _number(predicted.get("step_time_s"), "predicted.step_time_s", low_inclusive=False)
    tokens_per_s = _number(predicted.get("tokens_per_s"), "predicted.tokens_per_s", low_inclusive=False)
    u, basis = busy_share(predicted)

    watts = idle + (tdp - idle) * u
    it_watts = devices * watts
    kwh_per_step = it_watts * step / JOULES_PER_KWH
    kwh_per_1m = it_watts * TOKENS_PER_MILLION / tokens_per_s / JOULES_PER_KWH
    notes = []
    if idle == 0.0:
        notes.append(NO_IDLE_NOTE)
    out: dict[str, Any] = {
        "method": METHOD,
        "watts_per_device": watts,
        "utilisation": u,
        "devices": devices,
        "kwh_per_step": kwh_per_step,
        "kwh_per_1m_tokens": kwh_per_1m,
        "tokens_per_kwh": tokens_per_s * JOULES_PER_KWH / it_watts if it_watts > 0 else None,
        "facility_kwh_per_step": kwh_per_step * pue,
        "facility_kwh_per_1m_tokens": kwh_per_1m * pue,
        "pue": pue,
    }
    if it_watts <= 0:
        notes.append("predicted power is 0 W (no busy time and no idle figure): tokens per kWh is undefined")
    if intensity_g_per_kwh is not None:
        out["kgco2e_per_step"] = kwh_per_step * pue * intensity_g_per_kwh / 1000.0
        out["kgco2e_per_1m_tokens"] = kwh_per_1m * pue * intensity_g_per_kwh / 1000.0
    out["inputs"] = {
        "step_time_s": step,
        "tokens_per_s": tokens_per_s,
        "tdp_watts": tdp,
        "tdp_source": power["tdp_source"],
        "idle_watts": idle,
        **({"idle_source": power["idle_source"]} if idle else {}),
        "utilisation_basis": basis,
        "pue_source": pue_source,
        **(
            {"intensity_g_per_kwh": intensity_g_per_kwh, "intensity_source": intensity_source}
            if intensity_g_per_kwh is not None
            else {}
        ),
    }
    out["scope"] = SCOPE
    out["notes"] = notes
    return out


def device_power_profile(cluster: ClusterSpec) -> dict[str, Any] | None:
    """Where a cluster's device power comes from: the cluster's own ``device.tdp_watts``, else the matched
    hardware profile's (``data/hardware_profiles.json``, its source copied), else None."""
    device = cluster.device
    if device.tdp_watts is not None:
        return {
            "name": device.name,
            "tdp_watts": device.tdp_watts,
            "tdp_source": "cluster.json device.tdp_watts",
        }
    from .hardware import PROFILES_PATH, find_profile

    name, profile = find_profile(device.name)
    if profile.get("tdp_watts") is None:
        return None
    sources = profile.get("sources") or {}
    cited = sources.get("tdp_watts") or sources.get("all")
    return {
        "name": device.name,
        "tdp_watts": profile["tdp_watts"],
        "tdp_source": f"data/{PROFILES_PATH.name} profile {name}" + (f": {cited}" if cited else ""),
        **({"idle_watts": profile["idle_watts"]} if profile.get("idle_watts") is not None else {}),
        **({"idle_source": sources["idle_watts"]} if sources.get("idle_watts") else {}),
    }


def plan_energy(
    predicted: Mapping[str, Any], devices: int, power_profile: Mapping[str, Any] | None, device_name: str = ""
) -> dict[str, Any]:
    """The optional ``predicted["energy"]`` block of a costed plan: :func:`predict_energy` with the default
    PUE and no intensity, or ``{"method": "predicted", "unavailable": why}`` when the device's power is
    unknown (the visualizer then shows no tokens/kWh for it)."""
    if power_profile is None:
        return {
            "method": METHOD,
            "unavailable": f"no tdp_watts for the device {device_name!r}: set the cluster's device.tdp_watts "
            "(board power in W, from its datasheet) to predict energy",
        }
    try:
        return predict_energy(predicted, power_profile, num_devices=devices)
    except ValueError as exc:
        return {"method": METHOD, "unavailable": str(exc)}


__all__ = ["busy_share", "device_power_profile", "plan_energy", "predict_energy"]
