"""Carbon-aware launching: a job that runs under a green schedule starts when a slot of it opens.

A job created with a green schedule (``green_schedule``, a stored schedule of its team, or ``carbon_aware``,
which schedules it first from its plan's predicted duration and power) waits in ``scheduled``: it holds no
worker slot and no quota. The relay calls :func:`tick` every few seconds:

- a scheduled job whose slot has opened is launched (``job_launch``), remembering where the slot ends;
- an interruptible job still running when its slot ends, with a later slot to come, is paused: it is asked
  to stop like a cancel, and when its ranks have stopped it goes back to ``scheduled`` (not ``cancelled``);
  at the next slot it is launched again and continues from its newest good snapshot (the steps after that
  snapshot are trained again; ``snapshot_every`` bounds them);
- a job still running at the end of its last slot goes on to the end (stopping it would lose the work):
  it says so in an event.

A scheduled job whose window has passed without it being launched (the control plane was down) starts at
once, and says why. A person may start a scheduled job at once (``relaunch``) or cancel it.

``tick(now=...)`` takes the time as an argument so that tests can step through a schedule's slots without
waiting for them; the relay passes nothing (the current time).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from controlplane.common.api import TooMuchQueuedWork
from controlplane.common.models import JobState
from controlplane.green.services import schedule_create
from controlplane.jobs.models import TrainingJob
from controlplane.jobs.services.events import job_event
from controlplane.jobs.services.lifecycle import job_launch
from controlplane.jobs.slots import due_slot, next_slot, slots_of, utc_text

log = logging.getLogger(__name__)


# --- at creation ---------------------------------------------------------------------------------------


def _job_zone(config: dict) -> str:
    return str((config.get("energy") or {}).get("zone") or "")


def check_schedule(*, schedule, team, config: dict, zone_given: bool, now: datetime | None = None) -> dict:
    """A stored schedule a new job may run under; returns the config with the schedule's zone as its energy
    zone. 400s that say what to do: another team's (not found), already another job's, ended, another zone
    than the job meters, interruptible without snapshots."""
    now = now or timezone.now()
    if schedule is None or schedule.team_id != team.pk:
        raise ValidationError({"green_schedule": ["no such green schedule among the job's team's"]})
    taken = TrainingJob.objects.filter(green_schedule=schedule).first()
    if taken is not None:
        raise ValidationError(
            {
                "green_schedule": [
                    f"schedule #{schedule.pk} is already job #{taken.pk}'s ({taken.name!r}): schedule this job "
                    "on its own (each schedule holds the power of one job)"
                ]
            }
        )
    slots = slots_of(schedule)
    if not slots or now >= slots[-1][1]:
        raise ValidationError(
            {
                "green_schedule": [
                    f"schedule #{schedule.pk}'s window ended at {utc_text(slots[-1][1]) if slots else '?'}: "
                    "schedule the job again from now"
                ]
            }
        )
    zone = _job_zone(config)
    if zone_given and zone and zone != schedule.zone:
        raise ValidationError(
            {
                "green_schedule": [
                    f"schedule #{schedule.pk} is for grid zone {schedule.zone}, but the job meters zone {zone} "
                    "(energy.zone): use one zone for both"
                ]
            }
        )
    if schedule.result.get("interruptible") and len(slots) > 1 and not int(config.get("snapshot_every") or 0):
        raise ValidationError(
            {
                "snapshot_every": [
                    f"schedule #{schedule.pk} runs the job in {len(slots)} slots: it is paused between them and "
                    "continues from its snapshots, so it needs snapshot_every > 0"
                ]
            }
        )
    return {**config, "energy": {**(config.get("energy") or {}), "zone": schedule.zone}}


def plan_duration_and_power(plan: dict | None, steps: int) -> tuple[float | None, float | None, str]:
    """The job's run time (h) and IT power (kW) predicted by its plan: steps x predicted step time, and the
    devices x predicted watts per device of the plan's energy block; (None, None, why) when it has none."""
    predicted = (plan or {}).get("predicted") or {}
    step = predicted.get("step_time_s")
    energy = predicted.get("energy") or {}
    watts, devices = energy.get("watts_per_device"), energy.get("devices")
    if not isinstance(step, int | float) or step <= 0:
        return None, None, "the job has no plan with a predicted step time"
    if not isinstance(watts, int | float) or not isinstance(devices, int) or watts <= 0:
        return None, None, "the job's plan has no predicted power (its cluster's device has no tdp_watts)"
    return steps * step / 3600.0, devices * watts / 1000.0, "predicted by the job's plan"


def carbon_aware_schedule(*, team, user, name: str, config: dict, plan: dict | None, request: dict):
    """Schedule a new job on the least carbon before its deadline (``carbon_aware``: deadline_h,
    interruptible, zone, duration_h, power_kw, site_cap_kw, forecast_csv): a green schedule in the team's
    knowledge base, named after the job. Its duration and power default to the plan's predictions."""
    duration_h, power_kw = request.get("duration_h"), request.get("power_kw")
    if duration_h is None or power_kw is None:
        planned_h, planned_kw, why = plan_duration_and_power(plan, int(config.get("steps") or 0))
        if planned_h is None:
            raise ValidationError(
                {"carbon_aware": [f"give duration_h and power_kw: {why}, so they cannot be predicted"]}
            )
        duration_h = planned_h if duration_h is None else duration_h
        power_kw = planned_kw if power_kw is None else power_kw
    zone = request.get("zone") or _job_zone(config)
    try:
        schedule = schedule_create(
            team=team,
            created_by=user,
            name=f"job {name}"[:200],
            zone=zone,
            forecast_csv=request.get("forecast_csv"),
            duration_h=duration_h,
            power_kw=power_kw,
            deadline_h=request["deadline_h"],
            interruptible=bool(request.get("interruptible", False)),
            pue=float((config.get("energy") or {}).get("pue") or 1.0),
            site_cap_kw=request.get("site_cap_kw"),
        )
    except ValidationError as e:
        raise ValidationError({"carbon_aware": e.detail}) from None
    return schedule


# --- the relay's tick ---------------------------------------------------------------------------------


def launch_due(now: datetime | None = None) -> list[int]:
    """Launch every scheduled job whose slot has opened (or whose window has passed); the ids launched."""
    now = now or timezone.now()
    launched = []
    for job in TrainingJob.objects.filter(
        state=JobState.SCHEDULED, green_schedule__isnull=False
    ).select_related("green_schedule"):
        slots = slots_of(job.green_schedule)
        due = due_slot(slots, now)
        if due is None:
            continue
        slot_end, overdue = due
        if overdue:
            why = (
                f"Its carbon-aware window ended at {utc_text(slots[-1][1])} before it could run (the control plane "
                "did not launch it in time): it starts now and runs to the end."
            )
        else:
            why = f"Its carbon-aware slot opened: it runs until {utc_text(slot_end)}" + (
                ", then pauses for the next slot." if next_slot(slots, slot_end) else "."
            )
        try:
            job_launch(job=job, scheduled_slot_end=slot_end, why=why)
        except TooMuchQueuedWork as e:  # the team is at its limit: try again at the next tick
            log.info("scheduled job %s waits: %s", job.pk, e.detail)
            continue
        except ValidationError:  # changed state under us (cancelled a moment ago)
            continue
        launched.append(job.pk)
    return launched


def pause_at_slot_end(now: datetime | None = None) -> list[int]:
    """Ask every job whose slot has ended to pause when a later slot is to come (or let it run on past its
    last slot, saying so); the ids asked to pause."""
    now = now or timezone.now()
    paused = []
    ending = TrainingJob.objects.filter(
        green_schedule__isnull=False,
        slot_end_at__lte=now,
        state__in=(JobState.QUEUED, *TrainingJob.ACTIVE_STATES),
        pause_requested=False,
        cancel_requested=False,
    ).values_list("pk", flat=True)
    for pk in ending:
        with transaction.atomic():
            job = TrainingJob.objects.select_for_update().select_related("green_schedule").get(pk=pk)
            if job.slot_end_at is None or job.slot_end_at > now or job.cancel_requested or job.is_finished:
                continue
            upcoming = next_slot(slots_of(job.green_schedule), job.slot_end_at)
            ended = job.slot_end_at
            job.slot_end_at = None
            if upcoming is None:
                job.save(update_fields=["slot_end_at", "updated_at"])
                job_event(
                    job,
                    {
                        "state": job.state,
                        "message": f"Its schedule's last slot ended at {utc_text(ended)}; it runs on to the end.",
                    },
                )
                continue
            message = (
                f"Its carbon-aware slot ended at {utc_text(ended)}: paused until the next slot opens at "
                f"{utc_text(upcoming[0])}; it continues from its newest snapshot."
            )
            if job.state == JobState.QUEUED:  # no worker picked it up yet: nothing to stop
                job.state = JobState.SCHEDULED
                job.nodes.filter(attempt=job.attempts, state=JobState.QUEUED).update(state=JobState.CANCELLED)
                job.save()
                job_event(job, {"state": "scheduled", "attempt": job.attempts, "message": message})
            else:
                job.pause_requested = True
                job.cancel_requested = True  # the supervisor stops its ranks as for a cancel
                job.save()
                job_event(job, {"pausing": True, "attempt": job.attempts, "message": message})
            paused.append(job.pk)
    return paused


def tick(now: datetime | None = None) -> None:
    """The relay's periodic call: pause the jobs whose slot ended, then launch the ones whose slot opened."""
    now = now or timezone.now()
    pause_at_slot_end(now)
    launch_due(now)
