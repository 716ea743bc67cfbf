"""A job's lifecycle: launch (fan out to its nodes, or hand it to a cluster scheduler), cancel."""

from __future__ import annotations

import os

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from controlplane.common.api import TooMuchQueuedWork
from controlplane.common.models import JobState
from controlplane.jobs.models import JobNode, TrainingJob
from controlplane.jobs.selectors import NODE_QUEUE_PREFIX, online_node_queues
from controlplane.jobs.services.events import job_event
from controlplane.jobs.services.faults import resume_plan
from controlplane.jobs.services.launchers import cancel_external, launch_attempt
from controlplane.jobs.services.outcomes import cancelled_message, job_fail
from controlplane.jobs.slots import slots_of, utc_text
from controlplane.jobs.tasks import launch_job, run_node
from controlplane.live.services import enqueue_after_commit, note_deferred

# work one team may have queued or running at once (a runaway script cannot fill the workers' queues)
MAX_ACTIVE_JOBS_PER_TEAM = int(os.environ.get("CANN_TRAIN_MAX_ACTIVE_JOBS", "20"))


def scheduled_message(schedule) -> str:
    """What a job waiting for its carbon-aware window says."""
    slots = slots_of(schedule)
    result = schedule.result
    saving = result.get("saving_pct")
    parts = [f"Waits for its carbon-aware window: starts at {utc_text(slots[0][0])}"]
    if len(slots) > 1:
        parts.append(f"in {len(slots)} slots, pausing between them")
    if isinstance(saving, int | float):
        parts.append(f"predicted {saving:.1f}% less CO2e than starting at once (schedule #{schedule.pk})")
    return ", ".join(parts) + "."


def job_launch(
    *,
    job: TrainingJob,
    resume_from: str | None = None,
    automatic: bool = False,
    why: str = "",
    scheduled_slot_end=None,
) -> TrainingJob:
    """Queue a (re)launch. Only a new job, or a failed / cancelled one, can be launched; a job that
    snapshots continues from its newest good snapshot (``resume``), or from ``resume_from`` exactly (a
    restore, which a succeeded job may do too). ``automatic``: the reaper resuming a job whose worker was
    lost (it is recovering; no quota check: it held its slot all along; its faults keep counting against
    ``max_restarts``). ``why`` goes into the "queued" event. A scheduled job may be launched: by the
    scheduler when its slot opens (``scheduled_slot_end``: when the slot ends, or None past its window), or
    by a person at once (it then runs to the end)."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        allowed = {JobState.FAILED, JobState.CANCELLED, JobState.SCHEDULED}
        if automatic:
            allowed.add(JobState.RECOVERING)
        if resume_from:
            allowed.add(JobState.SUCCEEDED)
        if (job.attempts or job.state == JobState.SCHEDULED) and job.state not in allowed:
            raise ValidationError({"state": [f"a {job.state} job cannot be launched again; cancel it first"]})
        active = (
            TrainingJob.objects.filter(
                team_id=job.team_id, attempts__gt=0, state__in=(JobState.QUEUED, *TrainingJob.ACTIVE_STATES)
            )
            .exclude(pk=job.pk)
            .count()
        )
        if not automatic and active >= MAX_ACTIVE_JOBS_PER_TEAM:
            raise TooMuchQueuedWork(
                f"Your team has {active} jobs queued or running, the most one team may have at once "
                f"(CANN_TRAIN_MAX_ACTIVE_JOBS={MAX_ACTIVE_JOBS_PER_TEAM}). Wait for some to finish, or cancel some."
            )
        job.config, resume = resume_plan(job, resume_from=resume_from)
        job.attempts += 1
        if not automatic:  # a person launched it: the restart budget starts again
            job.restart_budget_from = job.attempts
        job.state = JobState.QUEUED
        job.cancel_requested = job.pause_requested = False
        job.slot_end_at = scheduled_slot_end
        job.cancelled_by = None
        job.error = job.human_readable_error = ""
        job.progress = 0.0
        job.measured = None  # the run summary is the new attempt's to write
        job.goodput = None
        job.started_at = job.finished_at = job.heartbeat_at = None
        job.save()
        attempt = job.attempts
        values = {"state": "queued", "attempt": attempt}
        if resume is not None:
            values["resume"] = resume
            values["message"] = " ".join(filter(None, [why, resume["message"]]))
        elif why:
            values["message"] = why
        if automatic:
            values["automatic"] = True
        # on_commit callbacks run in order: the "queued" event goes out before any worker can answer
        job_event(job, values)
        # through the task outbox: with the broker away the job stays queued and is sent when it is back
        enqueue_after_commit(launch_job, (job.pk, attempt), queue="training", on_deferred=note_deferred(job))
    return job


def job_cancel(*, job: TrainingJob, user=None) -> TrainingJob:
    """Ask the job to stop (``user`` is remembered: the job then says who cancelled it)."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if job.is_finished:
            raise ValidationError({"state": [f"the job already ended ({job.state})"]})
        job.cancel_requested = True
        job.pause_requested = False  # a person's cancel wins over a pause at the end of a slot
        job.cancelled_by = user if user is not None and user.is_authenticated else None
        if job.state in (JobState.QUEUED, JobState.SCHEDULED):  # nothing started: no supervisor to tell
            job.state = JobState.CANCELLED
            job.finished_at = timezone.now()
            job.human_readable_error, job.error = cancelled_message(job), ""
            job.nodes.filter(attempt=job.attempts, state=JobState.QUEUED).update(state=JobState.CANCELLED)
            job_event(
                job, {"state": "cancelled", "attempt": job.attempts, "message": job.human_readable_error}
            )
        elif job.launcher != "local":  # its scheduler stops it (and the follower settles it when it has)
            transaction.on_commit(lambda: cancel_external(job_id=job.pk))
        job.save()
    return job


def job_fan_out(*, job_id: int, attempt: int) -> str:
    """Give each node of a queued attempt its ``run_node`` task: any training worker for a one-node job,
    the ``node.<name>`` queues of live node workers for a multi-node one. An elastic job starts on as many
    as are online, from ``min_nodes`` up to its ``max_nodes`` (``nnodes``)."""
    job = TrainingJob.objects.get(pk=job_id)
    if job.attempts != attempt or job.state != JobState.QUEUED:
        return "skipped"
    if settings.JOB_LAUNCHER != "local":  # Slurm or Kubernetes runs it (controlplane.jobs.services.launchers)
        return launch_attempt(job_id=job_id, attempt=attempt)
    if job.nnodes == 1:
        queues = ["training"]
    else:
        online = online_node_queues()
        if len(online) < job.min_nodes:
            needs = (
                f"at least {job.min_nodes} of its {job.nnodes} nodes (min_nodes)"
                if job.elastic
                else f"{job.nnodes} nodes"
            )
            job_fail(
                job_id=job.pk,
                human=(
                    f"This job needs {needs} but {len(online)} node worker(s) are online "
                    f"({', '.join(online) or 'none'}). Start a worker per node with "
                    "CANN_TRAIN_NODE=<name> celery -A controlplane worker -Q training,node.<name>, then relaunch."
                ),
            )
            return "failed"
        queues = online[: job.nnodes]
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.QUEUED:  # cancelled meanwhile
            return "skipped"
        job.state = JobState.LAUNCHING
        job.heartbeat_at = timezone.now()
        # (an earlier attempt may have run through Slurm / Kubernetes)
        job.launcher, job.external_id, job.external_state = "local", "", ""
        job.save()
        for rank in range(len(queues)):
            JobNode.objects.create(
                job=job,
                attempt=attempt,
                node_rank=rank,
                node_name=queues[rank].removeprefix(NODE_QUEUE_PREFIX) if job.nnodes > 1 else "",
            )
        values = {"state": "launching", "attempt": attempt, "nodes": queues}
        if job.elastic:
            values["message"] = (
                f"Starting on {len(queues)} of its {job.nnodes} nodes (elastic: it goes on with at least "
                f"{job.min_nodes}"
                + (", and grows when more node workers come online" if len(queues) < job.nnodes else "")
                + ")."
            )
        job_event(job, values)
        for rank, queue in enumerate(queues):
            enqueue_after_commit(run_node, (job_id, attempt, rank), queue=queue)
    return f"launched on {', '.join(queues)}"
