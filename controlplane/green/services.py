"""Writes of the green app: carbon-aware schedules (the knowledge base of green schedules).

A schedule is computed by the engine (``workers.green.schedule.schedule``) on a carbon-intensity series: the
team's uploaded forecast CSV, or the best series ``workers.green.providers.resolve_series`` finds for a zone
(a configured live provider, else the shipped 2020 history moved onto the requested dates and labelled
``history``, else CodeCarbon's annual country average). The stored schedule keeps what was asked, what the
engine chose and where every figure came from.

A site power cap is shared by the team's scheduled jobs: the team's stored schedules in the same zone whose
slots reach into the new job's window are the power already reserved (their IT kW over their slots).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import APIException, ValidationError

from controlplane.accounts.models import Team
from controlplane.green.models import GreenSchedule
from controlplane.green.selectors import schedules_holding_power
from workers.green import schedule as scheduler
from workers.green.providers import parse_forecast_csv, resolve_series
from workers.green.schedule import NoRoomError, PriceSeries, Reservation
from workers.green.series import IntensitySeries

MAX_FORECAST_CSV_CHARS = 1_000_000
"""An uploaded forecast's size limit: ~30,000 rows of ``2026-03-10T12:00:00Z,123.4``, a year at 15-minute
steps; a schedule needs only now to now + deadline (at most a week)."""


class NoRoomForJob(APIException):
    """The site power cap, with what the team's stored schedules already reserve, leaves the job no room
    before its deadline: the request is valid, nothing fits (409)."""

    status_code = 409
    default_code = "no_room"


def _utc_label(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC")


def _uploaded_series(text: str, *, zone: str, current: datetime) -> tuple[IntensitySeries, dict]:
    """The uploaded forecast as a series and its provenance; figures that all lie before the current time
    are past figures standing in for a forecast (kind ``history``), as the CLI labels them."""
    try:
        series = parse_forecast_csv(text, zone=zone, source="forecast CSV uploaded with the request")
    except ValueError as e:
        raise ValidationError({"forecast_csv": [str(e)]}) from None
    if series.end <= current:
        series = dataclasses.replace(
            series,
            kind="history",
            source=f"past figures used as a stand-in forecast (they end before the request): {series.source}",
        )
    provenance = {
        "kind": "forecast_csv",
        "rows": len(series.times),
        "start": series.start.isoformat(),
        "end": series.end.isoformat(),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "series_kind": series.kind,
    }
    return series, provenance


def _reservations(*, team, zone: str, start: datetime, end: datetime) -> tuple[list[Reservation], list[dict]]:
    """The power the team's stored schedules in ``zone`` hold over ``[start, end)``: one reservation per
    slot that reaches into it (the engine's inputs, and the rows the answer shows)."""
    held, rows = [], []
    for other in schedules_holding_power(team=team, zone=zone, start=start, end=end):
        for a, b in other.slots:
            slot_start, slot_end = datetime.fromisoformat(a), datetime.fromisoformat(b)
            if slot_start >= end or slot_end <= start:
                continue
            held.append(Reservation(slot_start, slot_end, other.power_kw, label=f"schedule #{other.pk}"))
            rows.append(
                {
                    "schedule": other.pk,
                    "name": other.name,
                    "start": slot_start.isoformat(),
                    "end": slot_end.isoformat(),
                    "kw": other.power_kw,
                }
            )
    return held, rows


def _no_room_message(engine_message: str, rows: list[dict]) -> str:
    if not rows:
        return engine_message
    held = "; ".join(
        f"#{r['schedule']} {r['name']!r} {r['kw']:g} kW from {_utc_label(datetime.fromisoformat(r['start']))} "
        f"to {_utc_label(datetime.fromisoformat(r['end']))}"
        for r in rows[:5]
    )
    more = f" and {len(rows) - 5} more slots" if len(rows) > 5 else ""
    return f"{engine_message}. Power already reserved by the team's schedules: {held}{more}."


def schedule_create(
    *,
    team: Team,
    created_by=None,
    name: str = "",
    zone: str,
    forecast_csv: str | None = None,
    now: datetime | None = None,
    duration_h: float,
    power_kw: float,
    deadline_h: float,
    interruptible: bool = False,
    pue: float = 1.0,
    objective: str = "carbon",
    price_per_kwh: float | None = None,
    currency: str = "",
    carbon_price_per_t: float | None = None,
    site_cap_kw: float | None = None,
    env: Mapping[str, str] | None = None,
    current: datetime | None = None,
) -> GreenSchedule:
    """Schedule a job (``duration_h`` at ``power_kw`` of IT power, done by ``now + deadline_h``) on the least
    carbon (or cost, or a mix) and store it in the team's knowledge base.

    ``now`` defaults to the current time (``current``); for an uploaded forecast that does not cover the
    current time, to its first timestamp. ``env`` configures the live intensity providers (default: this
    process's environment). A bad input is a ``ValidationError`` naming the field; no room under the site
    cap is ``NoRoomForJob`` (409) naming the schedules that hold the power."""
    env = os.environ if env is None else env
    current = current or timezone.now()
    zone = zone.strip()
    duration, deadline = timedelta(hours=duration_h), timedelta(hours=deadline_h)

    if forecast_csv is not None:
        series, source = _uploaded_series(forecast_csv, zone=zone, current=current)
        skipped: list[dict] = []
        if now is not None:
            now_source = "given with the request"
        elif series.start <= current < series.end:
            now, now_source = current, "the current time"
        else:
            now, now_source = (
                series.start,
                "the forecast's first timestamp (it does not cover the current time)",
            )
    else:
        now_source = "given with the request" if now is not None else "the current time"
        now = now or current
        try:
            found = resolve_series(zone, now, now + deadline, env=env, now=current)
        except (LookupError, ValueError) as e:
            raise ValidationError({"zone": [str(e)]}) from None
        series, skipped = found["series"], found["skipped"]
        source = {"kind": "zone", "zone": zone}
    finish_by = now + deadline

    price = None
    if price_per_kwh is not None:
        price = PriceSeries.flat(
            price_per_kwh, currency=currency, source="flat tariff given with the request"
        )

    with transaction.atomic():
        # one capped request of a team at a time: two racing for the same power would both fit
        Team.objects.select_for_update().filter(pk=team.pk).first()
        held, held_rows = ([], [])
        if site_cap_kw is not None:
            held, held_rows = _reservations(team=team, zone=zone, start=now, end=finish_by)
        try:
            chosen = scheduler.schedule(
                series,
                now=now,
                duration=duration,
                power_kw=power_kw,
                deadline=deadline,
                interruptible=interruptible,
                pue=pue,
                price=price,
                objective=objective,
                carbon_price_per_t=carbon_price_per_t,
                power_cap_kw=site_cap_kw,
                reservations=held,
            )
        except NoRoomError as e:
            raise NoRoomForJob(_no_room_message(str(e), held_rows)) from None
        except ValueError as e:
            raise ValidationError({"non_field_errors": [str(e)]}) from None
        window = series.window(now, finish_by)
        request = {
            "source": source,
            "zone": zone,
            "now": now.isoformat(),
            "now_source": now_source,
            "duration_h": duration_h,
            "power_kw": power_kw,
            "deadline_h": deadline_h,
            "interruptible": interruptible,
            "pue": pue,
            "objective": objective,
            "price_per_kwh": price_per_kwh,
            "currency": currency,
            "carbon_price_per_t": carbon_price_per_t,
            "site_cap_kw": site_cap_kw,
        }
        return GreenSchedule.objects.create(
            team=team,
            created_by=created_by,
            name=name or default_name(zone=zone, duration_h=duration_h, power_kw=power_kw),
            zone=zone,
            request=request,
            result=chosen.to_dict(),
            intensity_window={
                "times": [t.isoformat() for t in window.times],
                "values": list(window.values),
                "end": window.end.isoformat(),
                "unit": window.unit,
            },
            reservations=held_rows,
            skipped=skipped,
            start=chosen.start,
            end=chosen.slots[-1][1],
            power_kw=power_kw,
        )


def default_name(*, zone: str, duration_h: float, power_kw: float) -> str:
    return f"{zone} {duration_h:g} h at {power_kw:g} kW"


class ScheduleInUse(APIException):
    """A job runs (or ran) under the schedule: it is that job's record (its report cites it) (409)."""

    status_code = 409
    default_code = "schedule_in_use"


def schedule_delete(*, schedule: GreenSchedule) -> None:
    """Remove a schedule from the knowledge base; the power it held is free for later requests. A schedule
    a job runs or ran under stays (the job waits for it; its energy report cites it): 409."""
    # the job's side of the one-to-one (TrainingJob.green_schedule, related_name "job"): green sits below jobs
    job = GreenSchedule.objects.filter(pk=schedule.pk, job__isnull=False).values(
        "job__pk", "job__name", "job__state"
    )
    if job := job.first():
        raise ScheduleInUse(
            f"Job #{job['job__pk']} ({job['job__name']!r}, {job['job__state']}) runs under schedule "
            f"#{schedule.pk}: it is kept as that job's record (its energy report cites it)."
        )
    schedule.delete()
