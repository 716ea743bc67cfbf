"""Building a report: :func:`build_certificate` checks a finished job's energy summary (and the schedule it
ran under), and writes scope and boundary, methodology, every input with its source, the results, the
estimates each figure rests on, notes, and the verification block."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from workers.green.certificate.canonical import SIGNIFICANT_FIGURES, format_number, rounded, value_at
from workers.green.certificate.codes import ALGORITHM, VERIFY_PATH, check_secret, code_of, hmac_digest
from workers.green.certificate.figures import SCHEDULE_FIGURES
from workers.green.energy import DEFAULT_PUE, DUAL_REPORTING, PUE_SOURCE, SCI_STANDARD
from workers.green.series import as_utc

FORMAT_VERSION = 2
"""2: the whole job (every attempt and restart, ``results.segments`` and ``results.recomputed``); a version 1
report covered the attempt that finished the job and is rebuilt that way when checked."""
STATEMENT = (
    "This is a calculation report. cann-train computed the figures below from the job's own power readings "
    "(or, where no power meter was available, from estimates that are labelled as such) following the methods "
    "named under Methodology. No third party has verified them: this is not an assurance statement and it "
    "makes no claim of meeting any standard. The verification code shows that the figures are the ones this "
    "control plane issued, and lets anyone holding the report ask it to recompute them from the stored "
    "measurements."
)
ISSUER = "cann-train control plane"

INTENSITY_KINDS = {
    "actual": "measured grid intensity for the hours the job ran",
    "forecast": "the provider's forecast for those hours, not the measured outcome",
    "average": "an annual country average, not the grid at the hours the job ran",
    "history": "a measured historical series used as a stand-in for the grid at run time",
}
_INTENSITY_ESTIMATE = {
    "forecast": "forecast intensity, not the measured grid",
    "average": "annual-average intensity",
    "history": "historical intensity used as a stand-in",
}


# ------------------------------------------------------------------------------------------- validation


def _check_job(job: Any) -> dict[str, Any]:
    if not isinstance(job, Mapping):
        raise ValueError(
            "job must be a dict such as {'id': 42, 'name': 'llama-7b-pretrain', 'team': 'research'}"
        )
    name = job.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("job needs a 'name' (the training job's name, printed in the report's title)")
    out: dict[str, Any] = {}
    for key, value in job.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", key):
            raise ValueError(f"job keys must be lower-case identifiers such as 'device_count', got {key!r}")
        if value is not None and not isinstance(value, str | int | float):
            raise ValueError(
                f"job[{key!r}] must be text, a number, true/false or null (it is printed), got "
                f"{type(value).__name__}"
            )
        if isinstance(value, str):
            if any(unicodedata.category(ch).startswith("C") for ch in value):
                raise ValueError(f"job[{key!r}] has control characters (a line break?): give it on one line")
            if len(value) > 200:
                raise ValueError(f"job[{key!r}] is {len(value)} characters long: at most 200")
            value = value.strip()
        out[key] = value
    return out


def _require(mapping: Any, keys: Sequence[str], where: str) -> None:
    if not isinstance(mapping, Mapping):
        raise ValueError(
            f"{where} is missing or not a dict: pass EnergyAccount.summary() of the finished job"
        )
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise ValueError(
            f"{where} lacks {', '.join(missing)}: pass EnergyAccount.summary() of the finished job, unchanged"
        )


def _check_summary(summary: Any) -> Mapping[str, Any]:
    _require(summary, ("inputs", "results", "notes"), "energy_summary")
    _require(
        summary["inputs"],
        ("meter", "pue", "intensity", "market_factor", "tariff", "embodied"),
        "energy_summary['inputs']",
    )
    _require(summary["inputs"]["meter"], ("method", "estimated", "missing", "label"), "the meter description")
    _require(
        summary["results"],
        (
            "start",
            "end",
            "hours",
            "intervals",
            "kwh",
            "kgco2e_location",
            "kgco2e_market",
            "cost",
            "tokens",
            "tokens_per_kwh",
            "sci",
        ),
        "energy_summary['results']",
    )
    if not summary["results"]["intervals"]:
        raise ValueError(
            "the job has no energy readings yet (0 intervals): a report needs the account started and at "
            "least one EnergyAccount.add(...) after it"
        )
    return summary


def _check_schedule(schedule: Any) -> Mapping[str, Any]:
    needed = ("start", "slots", "kgco2e", "kgco2e_now", "saving_pct", "intensity")
    if not isinstance(schedule, Mapping) or any(k not in schedule for k in needed):
        raise ValueError(
            "schedule must be Schedule.to_dict() of the schedule the job ran under (or None), with "
            f"{', '.join(needed)}"
        )
    return schedule


# --------------------------------------------------------------------------------------------- building


def _component_basis(energy: Mapping[str, Any], component: str) -> str:
    d = energy.get("components", {}).get(component) or {}
    if d.get("measured"):
        scope = f"; {d['scope']}" if d.get("scope") else ""
        return f"measured by {d.get('source')}{scope}"
    if d.get("source") == "estimate":
        return f"estimate: {d.get('how', 'CodeCarbon-style')}"
    if component in energy.get("missing", []):
        return f"not counted: {d.get('why', 'no meter and no figure to estimate from')}"
    return str(d.get("why", "none"))


def _inputs(summary: Mapping[str, Any]) -> dict[str, Any]:
    given = summary["inputs"]
    meter = given["meter"]
    energy = {
        "method": meter["method"],
        "measured": bool(meter.get("measured", False)),
        "estimated": list(meter.get("estimated", [])),
        "missing": list(meter.get("missing", [])),
        "label": meter.get("label", ""),
        "device_kind": meter.get("device_kind"),
        "components": dict(meter.get("components", {})),
        "tried": list(meter.get("tried", [])),
    }
    pue = given["pue"]
    intensity = given["intensity"]
    if intensity is not None:
        intensity = dict(intensity) | {"meaning": INTENSITY_KINDS.get(intensity.get("kind"), "")}
    embodied = given["embodied"]
    return {
        "energy": energy,
        "pue": {
            "value": pue["value"],
            "source": pue["source"],
            "default": pue["source"] == PUE_SOURCE and pue["value"] == DEFAULT_PUE,
        },
        "intensity": intensity,
        "market_factor": given["market_factor"],
        "tariff": given["tariff"],
        "embodied": None if embodied is None else dict(embodied),
    }


def _schedule_result(schedule: Mapping[str, Any]) -> dict[str, Any]:
    intensity = schedule.get("intensity") or {}
    chosen, now = schedule["kgco2e"], schedule["kgco2e_now"]
    return {
        "basis": (
            "predicted when the job was scheduled, from the plan's power and the intensity series below; "
            "not measured"
        ),
        "start": schedule["start"],
        "end": schedule.get("end"),
        "slots": [list(s) for s in schedule["slots"]],
        "interruptible": schedule.get("interruptible"),
        "objective": schedule.get("objective"),
        "power_kw": schedule.get("power_kw"),
        "pue": schedule.get("pue"),
        "energy_kwh": schedule.get("energy_kwh"),
        "kgco2e": chosen,
        "kgco2e_now": now,
        "saving_kgco2e": None if chosen is None or now is None else now - chosen,
        "saving_pct": schedule["saving_pct"],
        "cost": schedule.get("cost"),
        "cost_now": schedule.get("cost_now"),
        "intensity": {k: intensity.get(k) for k in ("provider", "zone", "kind", "source")},
        "history_used_as_forecast": bool(schedule.get("history_used_as_forecast", False)),
        "method": schedule.get("method"),
        "notes": list(schedule.get("notes", [])),
    }


def _results(summary: Mapping[str, Any], schedule: Mapping[str, Any] | None) -> dict[str, Any]:
    r = summary["results"]
    sci = r["sci"]
    cost = None
    if r["cost"] is not None:
        cost = {
            "value": r["cost"],
            "currency": r["currency"],
            "per_1m_tokens": r["cost_per_1m_tokens"],
            "kwh_without_price": r["kwh_without_price"],
        }
    return {
        "period": {"start": r["start"], "end": r["end"], "hours": r["hours"]},
        "intervals": r["intervals"],
        "tokens": r["tokens"],
        "kwh": dict(r["kwh"]),
        "kwh_without_intensity": r["kwh_without_intensity"],
        "kgco2e_location": r["kgco2e_location"],
        "kgco2e_market": r["kgco2e_market"],
        "sci": {
            "value": sci.get("value"),
            "unit": "gCO2e per 1M tokens",
            "functional_unit": "1M tokens",
            "R": sci.get("R"),
            "E_kwh": sci.get("E_kwh"),
            "EI_g": sci.get("EI_g"),
            "M_g": sci.get("M_g"),
            "M_included": bool(sci.get("M_included", False)),
            "M": sci.get("M"),
            "why": sci.get("why"),
        },
        "tokens_per_kwh": r["tokens_per_kwh"],
        "cost": cost,
        "schedule": None if schedule is None else _schedule_result(schedule),
    } | ({"segments": r["segments"], "recomputed": r["recomputed"]} if "segments" in r else {})


def _estimate_basis(inputs: Mapping[str, Any], results: Mapping[str, Any]) -> dict[str, list[str]]:
    """Figure -> the estimates it rests on (absent: it rests on none)."""
    estimated = inputs["energy"]["estimated"]

    def energy(components: Sequence[str]) -> list[str]:
        hit = [c for c in components if c in estimated]
        return [f"estimated energy ({', '.join(hit)}): no power meter read it"] if hit else []

    it = energy(("device", "cpu", "memory"))
    facility = it + (["industry-average PUE, not this site's"] if inputs["pue"]["default"] else [])
    intensity = inputs["intensity"]
    location = facility + (
        [_INTENSITY_ESTIMATE[intensity["kind"]]]
        if intensity is not None and intensity.get("kind") in _INTENSITY_ESTIMATE
        else []
    )
    embodied = inputs["embodied"]
    sci = location + (
        ["embodied carbon from a published approximation"]
        if embodied and embodied.get("available") and "approximation" in str(embodied.get("confidence", ""))
        else []
    )
    basis = {
        "results.kwh.device": energy(("device",)),
        "results.kwh.cpu": energy(("cpu",)),
        "results.kwh.memory": energy(("memory",)),
        "results.kwh.it": it,
        "results.kwh.facility": facility,
        "results.kgco2e_location": location,
        "results.kgco2e_market": facility,
        "results.sci.value": sci,
        "results.tokens_per_kwh": it,
        "results.cost.value": facility,
        "results.cost.per_1m_tokens": facility,
        "results.recomputed.kwh_facility": facility
        + ["apportioned by steps: each segment's energy per step it trained"],
    }
    schedule = results.get("schedule")
    if schedule is not None:
        kind = (schedule.get("intensity") or {}).get("kind")
        predicted = ["a prediction from the plan's power, not a measurement"] + (
            [_INTENSITY_ESTIMATE[kind]] if kind in _INTENSITY_ESTIMATE else []
        )
        for path, _, _ in SCHEDULE_FIGURES:
            basis[path] = predicted
    return {
        path: reasons
        for path, reasons in basis.items()
        if reasons and value_at({"results": results}, path) is not None
    }


def _device_phrase(job: Mapping[str, Any], energy: Mapping[str, Any]) -> str:
    device, count = job.get("device"), job.get("device_count")
    if device and count:
        return f"{count} x {device}"
    if device:
        return str(device)
    kind = energy.get("device_kind")
    return f"the job's {kind} devices" if kind else "the job's accelerators"


def _scope(job: Mapping[str, Any], inputs: Mapping[str, Any], results: Mapping[str, Any]) -> dict[str, Any]:
    energy, pue, embodied = inputs["energy"], inputs["pue"], inputs["embodied"]
    period = results["period"]
    counted = []
    if energy.get("device_kind") == "cpu":
        counted.append("No accelerators: the job trained on the CPU, whose energy is the host CPU line.")
    else:
        counted.append(
            f"The job's accelerators ({_device_phrase(job, energy)}): {_component_basis(energy, 'device')}."
        )
    counted.append(f"Host CPU: {_component_basis(energy, 'cpu')}.")
    counted.append(f"Host memory: {_component_basis(energy, 'memory')}.")
    counted.append(
        f"Facility overhead (cooling, power distribution and conversion, lighting) through a PUE of "
        f"{pue['value']}"
        + (" (the industry average: this site's own PUE was not given)." if pue["default"] else ".")
    )
    not_counted = [
        "Networking equipment (switches, routers, links between nodes).",
        "Storage outside the hosts (shared file systems, object stores) and preparing or moving the data set.",
        "Host parts no meter here reads: power-supply losses, fans, disks, network cards.",
        "Cooling and other facility overhead beyond what the PUE figure includes.",
        "Energy before the first and after the last power reading (queueing, idle reserved devices).",
    ]
    for component in energy.get("missing", []):
        not_counted.append(f"{component}: no meter and no figure to estimate from (counted as zero).")
    if embodied is None:
        not_counted.append("Embodied carbon: no device was given to look up an embodied figure for.")
    elif not embodied.get("available"):
        not_counted.append(f"Embodied carbon of {embodied.get('device')}: {embodied.get('reason')}")
    else:
        counted.append(
            f"Embodied carbon of {embodied['count']} x {embodied['device']}, amortised over its lifetime, in SCI "
            "only (not in the kgCO2e totals), from a cited figure (see Inputs)."
        )
        not_counted.append("Embodied carbon of networking, storage and the building.")
    if results.get("kwh_without_intensity"):
        not_counted.append(
            f"In kgCO2e: {format_number(results['kwh_without_intensity'])} kWh drawn outside the carbon-intensity "
            "series (they are in the kWh)."
        )
    segments = results.get("segments")
    if segments:
        attempts = len({s["attempt"] for s in segments})
        boundary = (
            f"The whole training job {job['name']}: every attempt ({attempts}) and every restart within one, "
            f"{len(segments)} metered segment{'s' if len(segments) != 1 else ''} from {period['start']} to "
            f"{period['end']}, {format_number(period['hours'])} h metered (the time between segments, while "
            "the job recovered or waited, is not)."
        )
    else:
        boundary = (
            f"One training job, {job['name']}, from its first to its last power reading "
            f"({period['start']} to {period['end']}, {format_number(period['hours'])} h)."
        )
    return {
        "boundary": boundary,
        "counted": counted,
        "not_counted": not_counted,
    }


def _methodology(inputs: Mapping[str, Any]) -> list[dict[str, str]]:
    energy = inputs["energy"]
    market = inputs["market_factor"]
    return [
        {
            "name": "Energy",
            "follows": "power meters where present; otherwise a CodeCarbon-style estimate, labelled as one",
            "how": (
                "Read from power meters where the machine has them: NVML (energy counter or integrated power) for "
                "NVIDIA GPUs, npu-smi power for Ascend NPUs, Intel RAPL for CPU packages and DRAM. Where none "
                "is available the energy is estimated as CodeCarbon does: device TDP x utilisation, CPU TDP x "
                "the job's share of CPU time, 0.375 W per GiB of resident memory. Facility energy = IT energy x "
                f"PUE. This job: {energy.get('label') or energy.get('method')}."
            ),
        },
        {
            "name": "Location- and market-based emissions",
            "follows": DUAL_REPORTING,
            "how": (
                "Location-based: the facility energy of each reading interval, taken as drawn at constant power "
                "over the interval, times the grid intensity in force over it (integrated, not one average). "
                "Market-based: facility energy times the contractual emission factor, with its source"
                + (
                    "."
                    if market is not None
                    else " (not reported for this job: no contractual factor was supplied)."
                )
                + " The two are shown side by side; neither replaces the other."
            ),
        },
        {
            "name": "Software Carbon Intensity",
            "follows": SCI_STANDARD,
            "how": (
                "SCI = (E x I + M) per R, with R = 1M training tokens; E the facility energy in kWh; I the "
                "location-based intensity (SCI admits no market-based instruments); M the embodied carbon of "
                "the reserved devices amortised over their lifetime for the job's duration, left out with its "
                "reason where no trustworthy figure exists."
            ),
        },
        {
            "name": "Cost",
            "follows": "the tariff given for the cluster",
            "how": "Facility energy times the price in force (a flat price, or a time-of-use series integrated "
            "per interval like the intensity).",
        },
        {
            "name": "Rounding and verification code",
            "follows": f"{ALGORITHM} over a canonical JSON of this document",
            "how": (
                f"Every number is rounded once to {SIGNIFICANT_FIGURES} significant figures and written in "
                "plain decimal; the code is computed over those rounded figures, and the same strings are "
                "printed here. The code is the first 20 base32 characters of the HMAC-SHA256 digest."
            ),
        },
    ]


def _notes(
    summary: Mapping[str, Any],
    inputs: Mapping[str, Any],
    results: Mapping[str, Any],
    schedule: Mapping[str, Any] | None,
) -> list[str]:
    energy = inputs["energy"]
    notes = []
    tried = sorted({str(t.get("source")) for t in energy["tried"]})
    tried_text = f"tried {', '.join(tried)}: see Inputs for why each was unavailable" if tried else ""
    if energy["method"] == "estimate":
        notes.append(
            "Energy is an estimate: no power meter on this machine read the job"
            + (f" ({tried_text})" if tried_text else "")
            + ". Every figure computed from it is an estimate."
        )
    elif energy["estimated"]:
        notes.append(
            f"The energy of {', '.join(energy['estimated'])} is an estimate (no meter read it"
            + (f"; {tried_text}" if tried_text else "")
            + "); the other components were measured."
        )
    for note in summary["notes"]:
        # the account's own estimate note says less than the one above
        if not (energy["estimated"] and str(note).startswith("Estimated, not measured")):
            notes.append(str(note))
    if inputs["pue"]["default"]:
        notes.append(
            f"The PUE is the industry average ({inputs['pue']['value']}, Uptime Institute 2023), not a measurement "
            "of this site: facility energy and everything computed from it are approximate."
        )
    intensity = inputs["intensity"]
    if intensity is None:
        notes.append("No carbon intensity was configured: location-based kgCO2e and SCI are not computed.")
    elif intensity.get("provider") == "history":
        notes.append(
            "The shipped history's factors are life-cycle factors (ENTSO-E generation x IPCC SRREN Annex II): "
            "they include upstream emissions that a GHG Protocol Scope 2 inventory reports apart (Scope 3, "
            "category 3), so the location-based figure is higher than a combustion-only Scope 2 figure."
        )
    if inputs["market_factor"] is None:
        notes.append(
            "Market-based emissions are not reported: no contractual emission factor (a power purchase "
            "agreement, a supplier-specific rate, energy attribute certificates, or the residual mix) was given."
        )
    sci = results["sci"]
    if sci["value"] is None and sci.get("why"):
        notes.append(f"SCI is not computed: {sci['why']}.")
    if results["cost"] is None:
        notes.append("No tariff was given for the cluster: the energy cost is not computed.")
    recomputed = results.get("recomputed")
    if "segments" in results and recomputed is None:
        notes.append(
            "The steps trained twice are not computed: a segment of this job ran before the energy events "
            "said where each segment began."
        )
    elif recomputed and recomputed.get("steps"):
        notes.append(
            f"{recomputed['steps']} steps were trained twice (their progress was lost to a fault and trained "
            f"again from a snapshot): their energy, {format_number(recomputed['kwh_facility'])} kWh, is badput, "
            "included in the totals above."
        )
    if "segments" in results:
        notes.append(
            "The inputs (meter, PUE, intensity, tariff) are those of the segment that finished the job; every "
            "segment ran with the job's same energy settings."
        )
    if schedule is not None:
        notes.append(
            "The scheduling saving is a prediction made when the job was scheduled (the plan's power over the "
            "intensity series), compared with starting at once; the measured figures above are what the job drew."
        )
        start = results["period"]["start"]
        if start is not None:
            gap_h = (
                datetime.fromisoformat(start) - datetime.fromisoformat(schedule["start"])
            ).total_seconds() / 3600
            if not -0.1 <= gap_h <= 1.0:
                notes.append(
                    f"The job's first reading ({start}) is not at the scheduled start ({schedule['start']}): the "
                    "predicted saving was not necessarily realised."
                )
    return notes


def build_certificate(
    *,
    job: dict,
    energy_summary: dict,
    schedule: dict | None,
    issued_at: datetime,
    secret: bytes,
) -> dict:
    """The energy and carbon report of a finished job as a JSON-able dict (module docstring).

    ``job``: the job's identity, printed (``name`` required; ``id``, ``team``, ``cluster``, ``device``,
    ``device_count``, ``nodes``... optional: text, numbers, true/false or null). ``energy_summary``:
    :meth:`EnergyAccount.summary` of the finished job. ``schedule``: :meth:`Schedule.to_dict` of the
    carbon-aware schedule it ran under, or None. ``issued_at``: aware datetime (kept to the second).
    ``secret``: the control plane's secret key as bytes. Rebuilding with the same arguments gives the same
    document, byte for byte."""
    secret = check_secret(secret)
    job = _check_job(job)
    summary = _check_summary(energy_summary)
    if schedule is not None:
        _check_schedule(schedule)
    if not isinstance(issued_at, datetime) or issued_at.tzinfo is None:
        raise ValueError("issued_at must be a timezone-aware datetime (e.g. datetime.now(UTC))")
    inputs = rounded(_inputs(summary), "inputs")
    results = rounded(_results(summary, schedule), "results")
    content = {
        "format_version": FORMAT_VERSION if "segments" in results else 1,
        "title": f"Energy and carbon report for training job {job['name']}",
        "issuer": ISSUER,
        "issued_at": as_utc(issued_at).replace(microsecond=0).isoformat(),
        "statement": STATEMENT,
        "job": job,
        "scope": _scope(job, inputs, results),
        "methodology": _methodology(inputs),
        "inputs": inputs,
        "results": results,
        "estimate_basis": _estimate_basis(inputs, results),
        "notes": _notes(summary, inputs, results, schedule),
    }
    content = rounded(content, "document")
    digest = hmac_digest(content, secret)
    code = code_of(digest)
    return content | {
        "verification": {
            "code": code,
            "digest": digest,
            "algorithm": ALGORITHM,
            "covers": "the whole document except this block, as canonical JSON (sorted keys, no whitespace, "
            f"ASCII, numbers rounded to {SIGNIFICANT_FIGURES} significant figures in plain decimal)",
            "verify_path": VERIFY_PATH.format(code=code),
        }
    }
