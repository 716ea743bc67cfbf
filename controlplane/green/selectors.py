"""Reads of the green figures: a job's energy and carbon from its stored ``energy`` events, a team's totals.

Each segment of a job (an attempt, or a torchrun restart within one) meters from its own start
(``workers.green.job``): a segment's last ``energy`` event holds its running totals, and a job's totals are
the sum over its segments.
"""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.accounts.selectors import scoped
from controlplane.green.models import GreenSchedule
from controlplane.live.models import StreamEvent

# the running totals of an energy event that add up over attempts
SUMMED = ("kwh", "kwh_it", "kwh_device", "kwh_cpu", "kwh_memory", "kgco2e", "kgco2e_market", "cost", "tokens")


def segment_of(values: dict) -> tuple[int, int]:
    """(attempt, restart) of an energy event: the segment whose running totals it holds (an event from
    before the events said their restart is its attempt's first)."""
    return int(values.get("attempt") or 1), int(values.get("restart") or 0)


def _totals(last_by_segment: dict[tuple[int, int], dict]) -> dict | None:
    if not last_by_segment:
        return None
    segments = [last_by_segment[k] for k in sorted(last_by_segment)]
    latest = segments[-1]
    # a figure one segment could not give (no intensity, no price) is unknown for the job, not zero
    out: dict = {key: _sum_or_none([seg.get(key) for seg in segments]) for key in SUMMED}
    kwh_it = out.get("kwh_it")
    out["tokens_per_kwh"] = out["tokens"] / kwh_it if kwh_it and out.get("tokens") is not None else None
    for key in (
        "watts",
        "watts_facility",
        "pue",
        "intensity",
        "currency",
        "method",
        "estimated",
        "measured",
        "label",
    ):
        out[key] = latest.get(key)
    out["carbon_note"] = latest.get("carbon_note")
    out["estimate"] = not latest.get("measured", False)
    by_attempt: dict[int, list[dict]] = {}
    for (attempt, _), v in sorted(last_by_segment.items()):
        by_attempt.setdefault(attempt, []).append(v)
    out["attempts"] = [
        {
            "attempt": a,
            "restarts": len(parts) - 1,
            **{k: _sum_or_none([p.get(k) for p in parts]) for k in ("kwh", "kgco2e", "cost", "tokens")},
            "method": parts[-1].get("method"),
            "sci_g_per_1m_tokens": parts[-1].get("sci_g_per_1m_tokens") if len(parts) == 1 else None,
        }
        for a, parts in by_attempt.items()
    ]
    return out


def _sum_or_none(parts: list) -> float | None:
    return None if any(v is None for v in parts) else sum(parts)


def energy_by_stream(streams: Iterable[str]) -> dict[str, dict]:
    """``{stream: totals}`` for the streams that published energy events (one query)."""
    last: dict[str, dict[tuple[int, int], dict]] = {}
    rows = (
        StreamEvent.objects.filter(stream__in=list(streams), kind="energy")
        .order_by("stream", "seq")
        .values_list("stream", "values")
    )
    for stream, values in rows:
        last.setdefault(stream, {})[segment_of(values or {})] = values or {}
    return {stream: t for stream, by in last.items() if (t := _totals(by)) is not None}


def energy_segments(job) -> list[dict]:
    """The job's metered segments, oldest first, as :func:`workers.green.certificate.whole_job_summary`
    takes them: each one's last ``energy`` event's values with its ``step``, ``end`` (that reading's time),
    ``intervals`` (its readings) and ``start`` (when the segment started training: its ``started`` event,
    else its first reading)."""
    segments: dict[tuple[int, int], dict] = {}
    rows = StreamEvent.objects.filter(stream=job.stream, kind="energy").order_by("seq")
    for event in rows.only("time", "step", "values"):
        values = event.values or {}
        key = segment_of(values)
        seg = segments.setdefault(key, {"start": event.time.isoformat(), "intervals": 0})
        seg.update(values)
        seg |= {"attempt": key[0], "restart": key[1], "step": event.step, "end": event.time.isoformat()}
        seg["intervals"] += 1
    started = StreamEvent.objects.filter(stream=job.stream, kind="event", values__state="started")
    for event in started.order_by("seq").only("time", "values"):
        seg = segments.get(segment_of(event.values or {}))
        if seg is not None and event.time.isoformat() < seg["start"]:
            seg["start"] = event.time.isoformat()
    return [segments[k] for k in sorted(segments)]


def job_energy(job) -> dict | None:
    """The job's energy, carbon and cost so far (every attempt), with the meter's label; None before its
    first energy event."""
    return energy_by_stream([job.stream]).get(job.stream)


def team_energy(jobs) -> dict:
    """Totals over ``jobs`` (a queryset of the user's teams' jobs): kWh, kgCO2e and jobs counted; jobs whose
    carbon is unknown are counted apart, not as zero."""
    streams = {f"job/{pk}": pk for pk in jobs.values_list("pk", flat=True)}
    per = energy_by_stream(streams)
    kwh = sum(t["kwh"] or 0.0 for t in per.values())
    with_carbon = [t for t in per.values() if t.get("kgco2e") is not None]
    return {
        "jobs": len(per),
        "kwh": kwh,
        "kgco2e": sum(t["kgco2e"] for t in with_carbon),
        "jobs_without_carbon": len(per) - len(with_carbon),
        "estimated_jobs": sum(1 for t in per.values() if t.get("estimate")),
        "tokens": sum(t.get("tokens") or 0 for t in per.values()),
    }


# --- carbon-aware schedules (the knowledge base of green schedules) -----------------------------------


def schedules_of(user):
    """The schedules of the user's teams, newest first."""
    return scoped(GreenSchedule.objects.select_related("team", "created_by", "job"), user)


def schedule_of(user, pk: int):
    """One schedule of the user's teams; None for another team's (it looks exactly like no schedule)."""
    return schedules_of(user).filter(pk=pk).first()


def schedules_holding_power(*, team, zone: str, start, end):
    """The team's stored schedules in ``zone`` whose chosen slots reach into ``[start, end)``: the power a
    site cap shares with a new request (a site draws from one grid zone, so other zones' jobs are elsewhere)."""
    return GreenSchedule.objects.filter(team=team, zone__iexact=zone, start__lt=end, end__gt=start).order_by(
        "start", "id"
    )


def live_intensity_providers(env) -> dict:
    """Which live carbon-intensity providers this deployment has switched on (``workers.green.providers``),
    for the page to say where a zone's figures will come from: ``{"providers": [...], "problem": str}``."""
    from workers.green.providers import configured_providers

    try:
        return {"providers": [type(p).__name__ for p in configured_providers(env)], "problem": ""}
    except ValueError as e:  # a half-done configuration: the schedule request would say the same
        return {"providers": [], "problem": str(e)}
