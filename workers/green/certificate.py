"""The energy and carbon report of a finished training job: a JSON document, its PDF, and their verification.

:func:`build_certificate` turns a job's :meth:`EnergyAccount.summary() <workers.green.energy.EnergyAccount.summary>`
(and the carbon-aware schedule it ran under, if any) into a plain JSON-able document: scope and boundary,
the methods it follows, every input with its source, the results, which figures rest on an estimate, notes,
and a verification code. The document is a calculation report: it says which methods it follows (GHG
Protocol Scope 2 location- and market-based dual reporting, SCI per ISO/IEC 21031:2024 with R = 1M tokens,
energy from a meter or a labelled CodeCarbon-style estimate) and that no third party has verified it. It
never claims to meet a standard.

Rounding rule: every float in the document is rounded once, when the document is built, to
``SIGNIFICANT_FIGURES`` (6) significant figures (``float(f"{x:.6g}")``: the exact binary value rounded half
to even), and written in plain decimal notation without exponent or trailing zeros (``10.4596``,
``0.000123457``, ``12345700``). The canonical JSON that is hashed and the PDF print that same string, so a
printed figure is exactly a hashed one. Integers (tokens) are kept whole.

Verification: HMAC-SHA256 over the canonical JSON of the whole document except its ``verification`` block
(keys sorted, no whitespace, ASCII), keyed with a key derived from the control plane's secret. The full hex
digest stays in the document; the code a person reads is the first 20 base32 characters in groups of four
(100 bits). :func:`verify_certificate` checks the code and compares the figures with a document rebuilt from
the stored measurements; :func:`verify_pdf` reads the printed code and figures back from a downloaded PDF.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import io
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from string import Template
from typing import Any

from workers.green.energy import DEFAULT_PUE, DUAL_REPORTING, PUE_SOURCE, SCI_STANDARD
from workers.green.series import as_utc

FORMAT_VERSION = 1
SIGNIFICANT_FIGURES = 6
"""Every float in a report is rounded to this many significant figures before it is hashed or printed."""
CODE_CHARS = 20
"""Characters of the base32 HMAC digest in the human code (100 bits), printed in groups of four."""
VERIFY_PATH = "/api/certificates/{code}/verify"
ALGORITHM = "HMAC-SHA256"
_KEY_CONTEXT = b"cann-train/green/energy-and-carbon-report/v1"
"""Domain separation: the HMAC key is HMAC-SHA256(secret, this), so the control plane's SECRET_KEY can be
passed as is without a report's digest being usable as any other signature made with that secret."""
MIN_SECRET_BYTES = 16
_CODE_RE = re.compile(rf"^[A-Z2-7]{{{CODE_CHARS}}}$")

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

KEY_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("results.kwh.facility", "Facility energy (IT energy x PUE)", "kWh"),
    ("results.kwh.it", "IT energy", "kWh"),
    ("results.kwh.device", "of which accelerators", "kWh"),
    ("results.kwh.cpu", "of which host CPU", "kWh"),
    ("results.kwh.memory", "of which host memory", "kWh"),
    ("results.kgco2e_location", "Emissions, location-based", "kgCO2e"),
    ("results.kgco2e_market", "Emissions, market-based", "kgCO2e"),
    ("results.sci.value", "SCI (E x I + M) per R, R = 1M tokens", "gCO2e per 1M tokens"),
    ("results.tokens", "Tokens trained", "tokens"),
    ("results.tokens_per_kwh", "Tokens per kWh of IT energy", "tokens/kWh"),
    ("results.cost.value", "Energy cost", "{currency}"),
    ("results.cost.per_1m_tokens", "Energy cost per 1M tokens", "{currency}"),
)
SCHEDULE_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("results.schedule.kgco2e_now", "Predicted emissions had the job started at once", "kgCO2e"),
    ("results.schedule.kgco2e", "Predicted emissions in the chosen window", "kgCO2e"),
    ("results.schedule.saving_kgco2e", "Predicted saving", "kgCO2e"),
    ("results.schedule.saving_pct", "Predicted saving", "%"),
)
READBACK_FIELDS: tuple[str, ...] = (
    "issued_at",
    "job.id",
    *(path for path, _, _ in KEY_FIGURES),
    "results.period.start",
    "results.period.end",
    *(path for path, _, _ in SCHEDULE_FIGURES),
    "inputs.energy.method",
    "inputs.pue.value",
    "inputs.intensity.provider",
    "inputs.intensity.zone",
    "inputs.intensity.kind",
    "inputs.market_factor.g_per_kwh",
    "inputs.embodied.kgco2e_per_device",
)
"""The fields printed, one per line, in the PDF's verification block, which :func:`figures_from_pdf_text`
reads back."""
_FIGURE_SECTIONS = ("job", "inputs", "results")
"""The parts of a document :func:`verify_certificate` compares with the recomputation (the texts around the
figures may change between versions; the HMAC covers them)."""


# ------------------------------------------------------------------------------ rounding and canonical JSON


def round_figure(x: float) -> float:
    """``x`` rounded to ``SIGNIFICANT_FIGURES`` significant figures (idempotent)."""
    if not math.isfinite(x):
        raise ValueError(f"a report figure must be a finite number, got {x!r}")
    return float(f"{x:.{SIGNIFICANT_FIGURES}g}") + 0.0  # + 0.0: -0.0 -> 0.0


def format_number(x: int | float) -> str:
    """The one way a number is written in the canonical JSON and in the PDF: rounded, plain decimal."""
    if isinstance(x, bool):
        raise ValueError("a truth value is not a number")
    if isinstance(x, int):
        return str(x)
    text = format(Decimal(repr(round_figure(float(x)))), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _scalar_text(value: Any) -> str:
    """A leaf as the canonical JSON writes it, strings without quotes (what the PDF prints)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return format_number(value)
    return str(value)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII, numbers by :func:`format_number`: the bytes the HMAC covers."""
    if value is None or isinstance(value, bool):
        return _scalar_text(value)
    if isinstance(value, int | float):
        return format_number(value)
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, Mapping):
        if any(not isinstance(k, str) for k in value):
            raise ValueError("report keys must be strings")
        items = sorted(value.items())
        return "{" + ",".join(f"{_json_string(k)}:{canonical_json(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    raise ValueError(f"a report holds only JSON values, not {type(value).__name__}")


def _json_string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20 or ord(ch) > 0x7E:
            if ord(ch) > 0xFFFF:
                v = ord(ch) - 0x10000
                out.append(f"\\u{0xD800 + (v >> 10):04x}\\u{0xDC00 + (v & 0x3FF):04x}")
            else:
                out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _rounded(value: Any, path: str) -> Any:
    """A copy with every float rounded, tuples as lists and datetimes as ISO strings."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path} is {value!r}: a report figure must be a finite number")
        return round_figure(value)
    if isinstance(value, datetime):
        return as_utc(value).isoformat()
    if isinstance(value, Mapping):
        return {str(k): _rounded(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v, f"{path}.{i}") for i, v in enumerate(value)]
    raise ValueError(f"{path} is a {type(value).__name__}: a report holds only JSON values")


# ------------------------------------------------------------------------------------------------ codes


def _check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes | bytearray):
        raise ValueError(
            "secret must be bytes: pass the control plane's secret key encoded (settings.SECRET_KEY.encode())"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"secret must be at least {MIN_SECRET_BYTES} bytes (got {len(secret)}): use the control plane's "
            "SECRET_KEY, not a short password"
        )
    return bytes(secret)


def _digest(content: Mapping[str, Any], secret: bytes) -> str:
    key = hmac.new(secret, _KEY_CONTEXT, hashlib.sha256).digest()
    return hmac.new(key, canonical_json(content).encode("ascii"), hashlib.sha256).hexdigest()


def code_of(digest_hex: str) -> str:
    """The human code of a hex digest: the first 20 base32 characters, ``XXXX-XXXX-XXXX-XXXX-XXXX``."""
    raw = base64.b32encode(bytes.fromhex(digest_hex)).decode("ascii")[:CODE_CHARS]
    return "-".join(raw[i : i + 4] for i in range(0, CODE_CHARS, 4))


def normalise_code(text: str) -> str:
    """A code as a person may type it (any case, spaces or dashes anywhere) in its printed form; raises
    ``ValueError`` with what is wrong."""
    if not isinstance(text, str):
        raise ValueError("a verification code is text such as ABCD-EFGH-IJKL-MNOP-QRST")
    raw = re.sub(r"[\s-]", "", text).upper()
    if not _CODE_RE.match(raw):
        raise ValueError(
            f"{text!r} is not a verification code: it has {CODE_CHARS} letters A-Z and digits 2-7, "
            "in groups of four (e.g. ABCD-EFGH-IJKL-MNOP-QRST)"
        )
    return "-".join(raw[i : i + 4] for i in range(0, CODE_CHARS, 4))


def _content(document: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "verification"}


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
    }


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
    return {
        "boundary": (
            f"One training job, {job['name']}, from its first to its last power reading "
            f"({period['start']} to {period['end']}, {format_number(period['hours'])} h)."
        ),
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
    secret = _check_secret(secret)
    job = _check_job(job)
    summary = _check_summary(energy_summary)
    if schedule is not None:
        _check_schedule(schedule)
    if not isinstance(issued_at, datetime) or issued_at.tzinfo is None:
        raise ValueError("issued_at must be a timezone-aware datetime (e.g. datetime.now(UTC))")
    inputs = _rounded(_inputs(summary), "inputs")
    results = _rounded(_results(summary, schedule), "results")
    content = {
        "format_version": FORMAT_VERSION,
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
    content = _rounded(content, "document")
    digest = _digest(content, secret)
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


# ------------------------------------------------------------------------------------------- verifying


def value_at(document: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a report (``results.kwh.facility``; list items by index), None
    where the path leads nowhere."""
    node = document
    for part in path.split(".") if path else ():
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _flatten(value: Any, path: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _flatten(v, f"{path}.{i}", out)
    else:
        out[path] = value
    return out


_ABSENT = object()


def _check_code(document: Mapping[str, Any], secret: bytes) -> tuple[bool, dict[str, Any]]:
    verification = document.get("verification")
    stored_code = verification.get("code") if isinstance(verification, Mapping) else None
    stored_digest = verification.get("digest") if isinstance(verification, Mapping) else None
    try:
        expected = _digest(_content(document), secret)
    except ValueError:
        expected = None
    ok = (
        expected is not None
        and isinstance(stored_digest, str)
        and stored_digest.isascii()
        and hmac.compare_digest(stored_digest, expected)
        and stored_code == code_of(expected)
    )
    return ok, {
        "field": "verification.code",
        "certified": stored_code,
        "recomputed": None if expected is None else code_of(expected),
    }


def verify_certificate(document: dict, *, recomputed: dict, secret: bytes) -> dict:
    """Whether a stored report still holds: its code matches its content under ``secret``, and its figures
    (job, inputs, results) equal those of ``recomputed``, the report rebuilt with :func:`build_certificate`
    from the stored measurements.

    Returns ``{"valid", "code_matches", "figures_match", "mismatches": [{"field", "certified",
    "recomputed"}]}``: one mismatch per differing figure (``certified`` the stored value), then, when the
    code does not match, one for ``verification.code`` (``recomputed``: the code the stored content gives)."""
    secret = _check_secret(secret)
    if not isinstance(document, Mapping):
        raise ValueError("document must be a stored report (a dict from build_certificate)")
    if not isinstance(recomputed, Mapping) or not isinstance(recomputed.get("results"), Mapping):
        raise ValueError("recomputed must be build_certificate(...) rebuilt from the stored measurements")
    code_ok, code_mismatch = _check_code(document, secret)
    certified: dict[str, Any] = {}
    again: dict[str, Any] = {}
    for section in _FIGURE_SECTIONS:
        _flatten(document.get(section, _ABSENT), section, certified)
        _flatten(recomputed.get(section, _ABSENT), section, again)
    mismatches = []
    for field in sorted(set(certified) | set(again)):
        a, b = certified.get(field, _ABSENT), again.get(field, _ABSENT)
        if (
            a is _ABSENT
            or b is _ABSENT
            or _scalar_text(a) != _scalar_text(b)
            or isinstance(a, str) != isinstance(b, str)
        ):
            mismatches.append(
                {
                    "field": field,
                    "certified": None if a is _ABSENT else a,
                    "recomputed": None if b is _ABSENT else b,
                }
            )
    if not code_ok:
        mismatches.append(code_mismatch)
    figures_ok = not [m for m in mismatches if m["field"] != "verification.code"]
    return {
        "valid": code_ok and figures_ok,
        "code_matches": code_ok,
        "figures_match": figures_ok,
        "mismatches": mismatches,
    }


_READBACK_START = "Figures covered by the code"
_PRINTED_CODE_RE = re.compile(r"Verification code:?\s*([A-Z2-7]{4}(?:-[A-Z2-7]{4}){4})")
_PRINTED_FIELD_RE = re.compile(r"^\s*((?:job|inputs|results)(?:\.[A-Za-z0-9_]+)+|issued_at) = (.*?)\s*$")


def figures_from_pdf_text(text: str) -> dict:
    """The code and the figures printed in a report's verification block, from the PDF's extracted text
    (``pypdf``): ``{"code": "XXXX-...", "figures": {field: printed text}}`` (``code`` None when absent)."""
    if not isinstance(text, str):
        raise ValueError("text must be the text extracted from the report's PDF")
    found = _PRINTED_CODE_RE.search(text)
    figures: dict[str, str] = {}
    start = text.find(_READBACK_START)
    if start >= 0:
        for line in text[start:].splitlines():
            m = _PRINTED_FIELD_RE.match(line)
            if m:
                figures.setdefault(m.group(1), m.group(2))
    return {"code": found.group(1) if found else None, "figures": figures}


def pdf_text(pdf_bytes: bytes) -> str:
    """The text of a PDF, page after page (``pypdf``)."""
    if not isinstance(pdf_bytes, bytes | bytearray) or not bytes(pdf_bytes[:5]) == b"%PDF-":
        raise ValueError("that is not a PDF (it does not start with %PDF-): upload the report as downloaded")
    from pypdf import PdfReader  # optional at import time: only verifiers of downloaded PDFs need it

    reader = PdfReader(io.BytesIO(bytes(pdf_bytes)))
    return "\n".join(page.extract_text() or "" for page in reader.pages)


def verify_pdf(pdf_bytes: bytes, document: dict, secret: bytes) -> dict:
    """Whether a downloaded PDF shows the stored report: the printed code is the stored one and the stored
    report's code matches its content under ``secret``; each printed figure equals the stored one.

    Same shape as :func:`verify_certificate`; a mismatch's ``certified`` is what the PDF prints and
    ``recomputed`` the stored value, as text."""
    secret = _check_secret(secret)
    if not isinstance(document, Mapping):
        raise ValueError("document must be the stored report (a dict from build_certificate)")
    printed = figures_from_pdf_text(pdf_text(pdf_bytes))
    stored_ok, _ = _check_code(document, secret)
    stored_code = (document.get("verification") or {}).get("code")
    code_ok = stored_ok and printed["code"] is not None and printed["code"] == stored_code
    mismatches = []
    for field in sorted(set(READBACK_FIELDS) | set(printed["figures"])):
        shown = printed["figures"].get(field)
        stored = _scalar_text(value_at(document, field))
        if shown != stored:
            mismatches.append({"field": field, "certified": shown, "recomputed": stored})
    if not code_ok:
        mismatches.append(
            {"field": "verification.code", "certified": printed["code"], "recomputed": stored_code}
        )
    figures_ok = not [m for m in mismatches if m["field"] != "verification.code"]
    return {
        "valid": code_ok and figures_ok,
        "code_matches": code_ok,
        "figures_match": figures_ok,
        "mismatches": mismatches,
    }


# ---------------------------------------------------------------------------------------------- the PDF

_PAGE = Template(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>$title</title>
<style>
@page {
  size: A4; margin: 16mm 15mm 18mm 15mm;
  @bottom-left { content: "Verification code $code"; font: 7pt "DejaVu Sans Mono", monospace; color: #555; }
  @bottom-right { content: "page " counter(page) " of " counter(pages); font: 7pt "DejaVu Sans", sans-serif;
                  color: #555; }
}
body { font-family: "DejaVu Sans", "Liberation Sans", sans-serif; font-size: 8.6pt; line-height: 1.35;
       color: #1a1a1a; }
h1 { font-size: 16pt; margin: 0 0 2mm 0; color: #14401c; }
h2 { font-size: 11pt; margin: 5mm 0 1.5mm 0; color: #14401c; border-bottom: 0.6pt solid #9bb59f;
     padding-bottom: 0.6mm; }
p { margin: 1mm 0; }
.meta { color: #444; margin-bottom: 3mm; }
.code { border: 1.6pt solid #14401c; border-radius: 2mm; padding: 2.5mm 4mm; margin: 2mm 0 3mm 0;
        background: #f3f8f3; }
.code .label { font: bold 10pt "DejaVu Sans", sans-serif; color: #14401c; letter-spacing: 0; }
.code .value { font: bold 17pt "DejaVu Sans Mono", monospace; letter-spacing: 0.04em; }
.code .how { font-size: 7.6pt; color: #333; }
.statement { border-left: 2pt solid #b58900; padding: 1mm 3mm; background: #fdf8ea; margin: 2mm 0; }
table { width: 100%; border-collapse: collapse; margin: 1mm 0 2mm 0; table-layout: fixed; }
th, td { border-bottom: 0.4pt solid #cfd8d0; padding: 1mm 1.4mm; text-align: left; vertical-align: top; }
th { background: #e9f1ea; font-size: 8pt; }
td.num { font-family: "DejaVu Sans Mono", monospace; }
.verify { break-inside: avoid; }
td.sub { padding-left: 5mm; color: #333; }
.src { font-size: 7.2pt; color: #444; overflow-wrap: break-word; }
.est { display: inline-block; background: #fff0c2; border: 0.5pt solid #c9a227; border-radius: 1mm;
       padding: 0 1mm; font-size: 7pt; font-weight: bold; color: #6b5300; }
.why { font-size: 7.2pt; color: #555; }
ul { margin: 1mm 0 1mm 5mm; padding: 0; }
li { margin: 0.6mm 0; }
.readback { font: 7.4pt "DejaVu Sans Mono", monospace; background: #f5f5f5; padding: 2mm 3mm;
            border: 0.4pt solid #ccc; }
.readback div { white-space: pre; }
</style></head>
<body>
<h1>$title</h1>
<div class="meta">$meta</div>
<div class="code"><div class="value"><span class="label">Verification code:</span> $code</div>
<div class="how">Check it: GET $verify_path recomputes every figure from the stored measurements.</div></div>
<div class="statement">$statement</div>
<h2>Results</h2>
$results
$schedule
<h2>Scope and boundary</h2>
<p>$boundary</p>
<p><b>Counted</b></p><ul>$counted</ul>
<p><b>Not counted</b></p><ul>$not_counted</ul>
<h2>Methodology</h2>
$methodology
<h2>Inputs and their sources</h2>
$inputs
<h2>Notes</h2>
<ul>$notes</ul>
<div class="verify">
<h2>How to verify</h2>
<p>Ask the control plane that issued this report: <b>GET $verify_path</b> (or
GET /api/certificates/&lt;code&gt;/verify with the code above). It recomputes every figure from the job's
stored measurements and says whether this report matches them; an altered figure, input or code fails.
A downloaded PDF can be checked the same way: its printed code and the figures below are compared with the
stored report. Every number below is written exactly as the code covers it ($sig significant figures,
plain decimal).</p>
<div class="readback"><div>$readback_title</div>
$readback</div>
</div>
</body></html>
"""
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _shown(value: Any) -> str:
    return (
        _scalar_text(value) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)
    )


def _estimate_tag(document: Mapping[str, Any], path: str) -> str:
    reasons = (document.get("estimate_basis") or {}).get(path)
    if not reasons:
        return ""
    return f' <span class="est">estimate</span> <span class="why">{_e("; ".join(reasons))}</span>'


def _figure_rows(document: Mapping[str, Any], figures: Sequence[tuple[str, str, str]]) -> str:
    currency = ((document.get("results") or {}).get("cost") or {}).get("currency") or ""
    rows = []
    for path, label, unit in figures:
        value = value_at(document, path)
        unit = unit.format(currency=currency)
        css = "sub" if label.startswith("of which") else ""
        if value is None:
            why = _not_computed_why(document, path)
            cell = f'<td class="num">not computed</td><td class="why">{_e(why)}</td>'
        else:
            cell = (
                f'<td class="num">{_e(_shown(value))} {_e(unit)}</td><td>{_estimate_tag(document, path)}</td>'
            )
        rows.append(f'<tr><td class="{css}">{_e(label)}</td>{cell}</tr>')
    return (
        '<table><tr><th style="width:36%">Figure</th><th style="width:26%">Value</th><th>Rests on</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _not_computed_why(document: Mapping[str, Any], path: str) -> str:
    inputs, results = document.get("inputs") or {}, document.get("results") or {}
    if path == "results.kgco2e_location":
        return "no carbon intensity was configured"
    if path == "results.kgco2e_market":
        return "no contractual emission factor was given"
    if path == "results.sci.value":
        return str((results.get("sci") or {}).get("why") or "")
    if path.startswith("results.cost"):
        if inputs.get("tariff") is None:
            return "no tariff was given"
        return "part of the energy falls outside the tariff, or no tokens were counted"
    if path == "results.tokens_per_kwh":
        return "no IT energy"
    return ""


def _input_rows(document: Mapping[str, Any]) -> str:
    inputs, results = document["inputs"], document["results"]
    energy = inputs["energy"]
    rows: list[tuple[str, str, str, str]] = []  # input, value, kind, source
    for component, name in (
        ("device", "Accelerator energy"),
        ("cpu", "Host CPU energy"),
        ("memory", "Host memory energy"),
    ):
        d = energy["components"].get(component) or {}
        if d.get("measured"):
            kind = f"measured ({d.get('source')})"
        elif d.get("source") == "estimate":
            kind = "estimate"
        else:
            kind = "not metered"
        how = d.get("how") or d.get("why") or ""
        if d.get("utilisation"):
            how += f"; utilisation: {d['utilisation']}"
        if d.get("scope"):
            how += f"; scope: {d['scope']}"
        sources = [str(d[k]) for k in ("tdp_source", "watts_per_GiB_source", "method_source") if d.get(k)]
        rows.append((name, how, kind, " | ".join(sources)))
    if energy["tried"]:
        rows.append(
            (
                "Meters tried, not available",
                "; ".join(
                    f"{t.get('source')} ({t.get('component')}): {t.get('why')}" for t in energy["tried"]
                ),
                "",
                "",
            )
        )
    pue = inputs["pue"]
    rows.append(
        (
            "PUE",
            _shown(pue["value"]),
            "industry-average default" if pue["default"] else "the cluster's figure",
            str(pue["source"]),
        )
    )
    intensity = inputs["intensity"]
    if intensity is None:
        rows.append(("Grid carbon intensity", "none configured", "", ""))
    else:
        rows.append(
            (
                "Grid carbon intensity",
                f"provider {intensity.get('provider')}, zone {intensity.get('zone')}, {intensity.get('unit')}, "
                f"series {intensity.get('start')} to {intensity.get('end')}; {intensity.get('meaning')}",
                str(intensity.get("kind")),
                str(intensity.get("source")),
            )
        )
    market = inputs["market_factor"]
    rows.append(
        ("Market-based factor", "not given", "", "")
        if market is None
        else (
            "Market-based factor",
            f"{_shown(market['g_per_kwh'])} gCO2e/kWh",
            "contractual",
            str(market["source"]),
        )
    )
    tariff = inputs["tariff"]
    if tariff is None:
        rows.append(("Tariff", "not given", "", ""))
    elif tariff.get("kind") == "flat":
        rows.append(
            ("Tariff", f"{_shown(tariff['price_per_kwh'])} {tariff['unit']}", "flat", str(tariff["source"]))
        )
    else:
        rows.append(
            (
                "Tariff",
                f"time-of-use, {tariff.get('points')} prices, {tariff.get('start')} to {tariff.get('end')}",
                "time-of-use",
                str(tariff.get("source")),
            )
        )
    embodied = inputs["embodied"]
    if embodied is None:
        rows.append(("Embodied carbon (SCI's M)", "not included", "", "no device was given to look one up"))
    elif not embodied.get("available"):
        rows.append(
            (
                "Embodied carbon (SCI's M)",
                f"not included for {embodied.get('device')}",
                "",
                str(embodied.get("reason")),
            )
        )
    else:
        rows.append(
            (
                "Embodied carbon (SCI's M)",
                f"{_shown(embodied['kgco2e_per_device'])} kgCO2e per device x {embodied['count']} "
                f"{embodied['device']}, lifetime {_shown(embodied['lifetime_hours'])} h",
                "approximation"
                if "approximation" in str(embodied.get("confidence", ""))
                else "published figure",
                f"{embodied.get('source', '')} Confidence: {embodied.get('confidence', 'not stated')}.",
            )
        )
    rows.append(
        (
            "Tokens (SCI's R)",
            f"{_shown(results['tokens'])} tokens over {_shown(results['intervals'])} reading intervals",
            "counted by the training loop",
            "",
        )
    )
    body = "".join(
        f"<tr><td>{_e(a)}</td><td>{_e(b)}</td><td>"
        + ('<span class="est">estimate</span>' if c == "estimate" else _e(c))
        + f'</td><td class="src">{_e(d)}</td></tr>'
        for a, b, c, d in rows
    )
    return (
        '<table><tr><th style="width:18%">Input</th><th style="width:32%">Value</th>'
        '<th style="width:15%">Kind</th><th>Source</th></tr>' + body + "</table>"
    )


def _schedule_html(document: Mapping[str, Any]) -> str:
    schedule = (document.get("results") or {}).get("schedule")
    if schedule is None:
        return ""
    intensity = schedule.get("intensity") or {}
    slots = ", ".join(f"{a} to {b}" for a, b in schedule.get("slots") or [])
    return (
        "<h2>Carbon-aware scheduling</h2>"
        f"<p>{_e(schedule['basis'].capitalize())}. Chosen: {_e(slots)} "
        f"({'interruptible' if schedule.get('interruptible') else 'one contiguous run'}, objective "
        f"{_e(schedule.get('objective'))}; intensity: provider {_e(intensity.get('provider'))}, zone "
        f"{_e(intensity.get('zone'))}, kind {_e(intensity.get('kind'))}).</p>"
        + _figure_rows(document, SCHEDULE_FIGURES)
    )


def _html(document: Mapping[str, Any]) -> str:
    for key in ("title", "job", "scope", "methodology", "inputs", "results", "notes", "verification"):
        if key not in document:
            raise ValueError(f"the document lacks {key!r}: render a report from build_certificate(...)")
    job = document["job"]
    code = document["verification"]["code"]
    meta = " · ".join(
        [f"{k.replace('_', ' ')}: {_e(_shown(v))}" for k, v in job.items() if k != "name" and v is not None]
        + [f"issued {_e(document['issued_at'])} by {_e(document.get('issuer', ISSUER))}"]
    )
    methodology = "".join(
        f"<p><b>{_e(m['name'])}</b> (follows: {_e(m['follows'])}). {_e(m['how'])}</p>"
        for m in document["methodology"]
    )
    readback = "\n".join(
        f"<div>{_e(field)} = {_e(_scalar_text(value_at(document, field)))}</div>" for field in READBACK_FIELDS
    )
    return _PAGE.substitute(
        title=_e(document["title"]),
        meta=meta,
        code=_e(code),
        verify_path=_e(document["verification"].get("verify_path") or VERIFY_PATH.format(code=code)),
        statement=_e(document["statement"]),
        results=_figure_rows(document, KEY_FIGURES),
        schedule=_schedule_html(document),
        boundary=_e(document["scope"]["boundary"]),
        counted="".join(f"<li>{_e(x)}</li>" for x in document["scope"]["counted"]),
        not_counted="".join(f"<li>{_e(x)}</li>" for x in document["scope"]["not_counted"]),
        methodology=methodology,
        inputs=_input_rows(document),
        notes="".join(f"<li>{_e(n)}</li>" for n in document["notes"]),
        sig=SIGNIFICANT_FIGURES,
        readback_title=_READBACK_START + ":",
        readback=readback,
    )


def _no_fetching(url: str, *args: Any, **kwargs: Any) -> dict:
    raise ValueError(f"the report fetches no external resources (asked for {url})")


def render_pdf(document: dict) -> bytes:
    """The report as an A4 PDF (WeasyPrint), self-contained: inline CSS, the machine's own fonts, nothing
    fetched (any URL is refused)."""
    if not isinstance(document, Mapping):
        raise ValueError("document must be a report (a dict from build_certificate)")
    from weasyprint import HTML  # heavy import (Pango): only where PDFs are made

    return HTML(string=_html(document), url_fetcher=_no_fetching, base_url=None).write_pdf()
