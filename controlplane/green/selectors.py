"""Reads of the green figures: a job's energy and carbon from its stored ``energy`` events, a team's totals.

Each attempt of a job meters from its own start (``workers.green.job``): an attempt's last ``energy`` event
holds its running totals, and a job's totals are the sum over its attempts.
"""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.accounts.selectors import scoped
from controlplane.green.models import GreenSchedule
from controlplane.live.models import StreamEvent

# the running totals of an energy event that add up over attempts
SUMMED = ("kwh", "kwh_it", "kwh_device", "kwh_cpu", "kwh_memory", "kgco2e", "kgco2e_market", "cost", "tokens")


def _totals(last_by_attempt: dict[int, dict]) -> dict | None:
    if not last_by_attempt:
        return None
    attempts = [last_by_attempt[a] for a in sorted(last_by_attempt)]
    latest = attempts[-1]
    out: dict = {}
    for key in SUMMED:
        parts = [a.get(key) for a in attempts]
        # a figure one attempt could not give (no intensity, no price) is unknown for the job, not zero
        out[key] = None if any(v is None for v in parts) else sum(parts)
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
    out["attempts"] = [
        {
            "attempt": a,
            **{k: v.get(k) for k in ("kwh", "kgco2e", "cost", "tokens", "method", "sci_g_per_1m_tokens")},
        }
        for a, v in sorted(last_by_attempt.items())
    ]
    return out


def energy_by_stream(streams: Iterable[str]) -> dict[str, dict]:
    """``{stream: totals}`` for the streams that published energy events (one query)."""
    last: dict[str, dict[int, dict]] = {}
    rows = (
        StreamEvent.objects.filter(stream__in=list(streams), kind="energy")
        .order_by("stream", "seq")
        .values_list("stream", "values")
    )
    for stream, values in rows:
        attempt = int((values or {}).get("attempt") or 1)
        last.setdefault(stream, {})[attempt] = values or {}
    return {stream: t for stream, by in last.items() if (t := _totals(by)) is not None}


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
