"""A report of the whole job: every attempt, and every torchrun restart within one, added up.

A job's energy is metered in *segments*: each process group meters from its own start
(:class:`workers.green.job.JobEnergy`), so an attempt that recovered a killed rank (a torchrun restart) and a
later relaunch or restore each begin their totals at zero. The segment that finished the job leaves its
:meth:`EnergyAccount.summary`; the ones before it leave their last ``energy`` event (running totals, the
restart, the step before their first). :func:`whole_job_summary` adds them into one summary of the shape
:func:`~workers.green.certificate.build_certificate` takes, with the split per segment and the steps trained
twice (badput): a segment's steps after the step the next segment resumed from were trained again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from workers.green.energy import TOKENS_PER_R

SEGMENT_KEYS = ("attempt", "restart", "start", "end", "intervals", "from_step", "step")
"""What a segment before the last one gives besides its energy event's running totals."""
_SUMMED = (
    "kwh",
    "kwh_it",
    "kwh_device",
    "kwh_cpu",
    "kwh_memory",
    "kgco2e",
    "kgco2e_market",
    "cost",
    "tokens",
)

RECOMPUTED_BASIS = (
    "apportioned: a segment's metered facility energy x (its steps trained again / the steps it trained); "
    "its start-up and the time from its last reading to the fault are not in it"
)


def _hours(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    return max(0.0, (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() / 3600.0)


def _sum(parts: Sequence[float | None]) -> float | None:
    """A figure any segment could not give (no intensity, no price) is unknown for the job, not zero."""
    return None if any(p is None for p in parts) else float(sum(parts))


def _finished_segment(finished: Mapping[str, Any], last: Mapping[str, Any]) -> dict[str, Any]:
    """The finishing segment in an energy event's terms, from its summary (authoritative over its last event)."""
    r = finished["results"]
    return {
        **{k: last.get(k) for k in ("attempt", "restart", "from_step", "step")},
        "start": r["start"],
        "end": r["end"],
        "intervals": r["intervals"],
        "kwh": r["kwh"]["facility"],
        "kwh_it": r["kwh"]["it"],
        "kwh_device": r["kwh"]["device"],
        "kwh_cpu": r["kwh"]["cpu"],
        "kwh_memory": r["kwh"]["memory"],
        "kgco2e": r["kgco2e_location"],
        "kgco2e_market": r["kgco2e_market"],
        "kwh_without_intensity": r["kwh_without_intensity"],
        "kwh_without_price": r.get("kwh_without_price"),
        "cost": r["cost"],
        "tokens": r["tokens"],
    }


def _check_segments(segments: Any) -> list[Mapping[str, Any]]:
    if not isinstance(segments, list | tuple) or not segments:
        raise ValueError(
            "segments must list every metered segment of the job, oldest first, the finishing one last"
        )
    for i, s in enumerate(segments):
        if not isinstance(s, Mapping):
            raise ValueError(f"segments[{i}] must be a dict (an energy event's values with {SEGMENT_KEYS})")
        missing = [k for k in ("attempt", "step") if s.get(k) is None]
        if missing:
            raise ValueError(f"segments[{i}] lacks {', '.join(missing)}")
    return list(segments)


def _trained_again(segments: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Per segment, its metered steps that a later segment trained again (None: not known, a segment that
    does not say where it began)."""
    out: list[int | None] = []
    for i, s in enumerate(segments):
        if i == len(segments) - 1:
            out.append(0)
            continue
        resumed = segments[i + 1].get("from_step")
        out.append(None if resumed is None else max(0, int(s["step"]) - int(resumed)))
    return out


def _recomputed(
    rows: Sequence[Mapping[str, Any]], again: Sequence[int | None], facility: float
) -> dict[str, Any] | None:
    if len(rows) < 2:
        return {"steps": 0, "kwh_facility": 0.0, "kgco2e_location": 0.0, "share_pct": 0.0,
                "basis": RECOMPUTED_BASIS}  # fmt: skip
    if any(a is None for a in again) or any(r["steps"] is None for r in rows):
        return None
    kwh = kg = 0.0
    kg_known = True
    for row, a in zip(rows, again, strict=True):
        if not a:
            continue
        share = a / row["steps"] if row["steps"] else 0.0
        kwh += row["kwh"] * share
        if row["kgco2e"] is None:
            kg_known = False
        else:
            kg += row["kgco2e"] * share
    return {
        "steps": int(sum(again)),  # type: ignore[arg-type]
        "kwh_facility": kwh,
        "kgco2e_location": kg if kg_known else None,
        "share_pct": 100.0 * kwh / facility if facility else 0.0,
        "basis": RECOMPUTED_BASIS,
    }


def _sci(
    inputs: Mapping[str, Any],
    tokens: int,
    facility: float,
    kg: float | None,
    without: float | None,
    hours: float,
) -> dict[str, Any]:
    embodied = inputs.get("embodied") or None
    out: dict[str, Any] = {
        "functional_unit": "1M tokens",
        "R": tokens / TOKENS_PER_R,
        "E_kwh": facility,
    }
    if embodied and embodied.get("available") and embodied.get("lifetime_hours"):
        m_g = embodied["count"] * embodied["kgco2e_per_device"] * 1000.0 * hours / embodied["lifetime_hours"]
        out |= {"M_g": m_g, "M_included": True,
                "M": f"included: {embodied['count']} x {embodied['device']}, amortised over its lifetime"}  # fmt: skip
    else:
        why = (embodied or {}).get("reason") or "no device given for embodied carbon"
        out |= {"M_g": 0.0, "M_included": False, "M": f"not included: {why}"}
    why = None
    if tokens == 0:
        why = "no tokens trained"
    elif kg is None:
        why = "no carbon intensity for every segment of the job"
    elif without:
        why = f"{without:.6g} kWh were drawn outside the intensity series: E x I is incomplete"
    if why is not None:
        return out | {"value": None, "why": why}
    ei_g = kg * 1000.0
    return out | {"EI_g": ei_g, "value": (ei_g + out["M_g"]) / (tokens / TOKENS_PER_R), "why": None}


def whole_job_summary(finished: Mapping[str, Any], segments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One energy summary of the whole job (module docstring).

    ``finished``: :meth:`EnergyAccount.summary` of the segment that finished the job. ``segments``: every
    metered segment, oldest first: for each the values of its last ``energy`` event (running totals since
    that segment began, ``attempt``, ``restart``, ``from_step``) with ``step`` (that event's step), ``start``
    (when the segment began), ``end`` (its last reading) and ``intervals`` (its readings); the last one is the
    finishing segment, whose figures come from ``finished``. The result has ``finished``'s inputs and notes,
    the figures summed (hours: the metered hours, gaps between segments left out), and ``results.segments``
    (the split) and ``results.recomputed`` (steps trained twice and their energy, or None when a segment does
    not say where it began)."""
    segments = _check_segments(segments)
    inputs = finished["inputs"]
    parts = [*segments[:-1], _finished_segment(finished, segments[-1])]
    again = _trained_again(parts)
    rows = []
    for p, a in zip(parts, again, strict=True):
        from_step = p.get("from_step")
        rows.append(
            {
                "attempt": int(p["attempt"]),
                "restart": int(p.get("restart") or 0),
                "start": p.get("start"),
                "end": p.get("end"),
                "hours": _hours(p.get("start"), p.get("end")),
                "first_step": None if from_step is None else int(from_step) + 1,
                "last_step": int(p["step"]),
                "steps": None if from_step is None else int(p["step"]) - int(from_step),
                "trained_again": a,
                "kwh": p.get("kwh"),
                "kgco2e": p.get("kgco2e"),
                "tokens": p.get("tokens"),
            }
        )
    summed = {k: _sum([p.get(k) for p in parts]) for k in _SUMMED}
    tariff = inputs.get("tariff")
    without_price = (
        None
        if tariff is None
        # an event from before the events carried it: a flat price covers every kWh
        else _sum([p.get("kwh_without_price", 0.0 if tariff.get("kind") == "flat" else None) for p in parts])
    )
    without_intensity = None if inputs.get("intensity") is None else _sum(
        [p.get("kwh_without_intensity") for p in parts]
    )  # fmt: skip
    tokens = int(summed["tokens"] or 0)
    facility, it = summed["kwh"] or 0.0, summed["kwh_it"] or 0.0
    hours = sum(r["hours"] for r in rows)
    cost = summed["cost"]
    last = finished["results"]
    results = {
        "start": rows[0]["start"] or last["start"],
        "end": last["end"],
        "hours": hours,
        "intervals": int(sum(int(p.get("intervals") or 0) for p in parts)),
        "kwh": {
            "device": summed["kwh_device"],
            "cpu": summed["kwh_cpu"],
            "memory": summed["kwh_memory"],
            "it": it,
            "facility": facility,
        },
        "kgco2e_location": summed["kgco2e"],
        "kwh_without_intensity": without_intensity,
        "kgco2e_market": summed["kgco2e_market"],
        "cost": cost,
        "currency": last.get("currency"),
        "kwh_without_price": without_price,
        "cost_per_1m_tokens": cost / (tokens / TOKENS_PER_R) if cost is not None and tokens else None,
        "tokens": tokens,
        "tokens_per_kwh": tokens / it if it else None,
        "sci": _sci(inputs, tokens, facility, summed["kgco2e"], without_intensity, hours),
        "segments": rows,
        "recomputed": _recomputed(rows, again, facility),
    }
    return {**finished, "results": results}


def covers(results: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a whole-job report's figures cover, for its headline (the PDF's and the report page's): attempts,
    restarts within them, first and last step, steps trained twice (None: not known); None for a report of
    the finishing attempt only (format version 1)."""
    segments = results.get("segments")
    if not segments:
        return None
    attempts = len({s["attempt"] for s in segments})
    recomputed = results.get("recomputed")
    return {
        "attempts": attempts,
        "restarts": len(segments) - attempts,
        "first_step": next((s["first_step"] for s in segments if s.get("first_step") is not None), None),
        "last_step": segments[-1]["last_step"],
        "trained_twice": None if recomputed is None else recomputed["steps"],
    }
