"""Following the jobs a cluster scheduler runs (``launchers``): :func:`follow_external_jobs` (the relay runs it
periodically, beside the reaper) asks the scheduler about every active external job and moves it through the
local path's own state changes (``node_started``, ``node_finished`` -> ``settle_attempt``), so its events,
feeds and pages are those of any job: running when the scheduler runs it, then succeeded / failed (with the
scheduler's reason) / cancelled, its log tail the job's output and its run summary the ``finished`` event
rank 0 published."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from controlplane.common.models import JobState
from controlplane.common.redis import redis_client
from controlplane.jobs.models import JobNode, TrainingJob
from controlplane.jobs.services.events import job_event
from controlplane.jobs.services.launchers import EXTERNAL, SUBMIT_GRACE, TITLE, backend_for, job_name
from controlplane.jobs.services.nodes import node_finished, node_started
from controlplane.jobs.services.outcomes import job_fail
from controlplane.live.models import StreamEvent
from controlplane.live.services import publish
from workers.deploy import launchers as vocab
from workers.deploy.launchers import ExternalState, SchedulerError
from workers.events import parse_entries, stream_key

log = logging.getLogger(__name__)

SUMMARY_SCAN = 1000
"""Newest events of the job's stream searched for rank 0's ``finished`` event (after it come at most the
final energy figures and the control plane's own few)."""


def follow_external_jobs(*, now=None) -> list[int]:
    """One round: ask the scheduler about every active externally launched job and move it along. Returns
    the ids of the jobs that ended in this round."""
    now = now or timezone.now()
    ended = []
    backends: dict[str, object] = {}
    jobs = TrainingJob.objects.filter(state__in=TrainingJob.ACTIVE_STATES, launcher__in=EXTERNAL)
    for job in jobs:
        try:
            if job.launcher not in backends:
                backends[job.launcher] = backend_for(job.launcher)
            if follow(job, backends[job.launcher], now=now):
                ended.append(job.pk)
        except SchedulerError as exc:  # asked again at the next round
            log.warning("job %s: %s does not answer: %s", job.pk, TITLE[job.launcher], exc)
    return ended


def follow(job: TrainingJob, backend, *, now) -> bool:
    """Move one job along what its scheduler says; True when it ended."""

    title = TITLE[job.launcher]
    if not job.external_id:
        if job.heartbeat_at is not None and now - job.heartbeat_at > SUBMIT_GRACE:
            job_fail(
                job_id=job.pk,
                human=(
                    f"The submission to {title} was never recorded (the worker that submitted it stopped?); if "
                    f"{title} runs a job named {job_name(job, job.attempts)}, cancel it there. Relaunch to run it again."
                ),
            )
            return True
        return False
    if job.cancel_requested:
        backend.cancel(job)
    state = backend.state(job)
    if state.state == vocab.UNKNOWN:
        log.warning(
            "job %s: %s job %s is in a state this code does not know: %s",
            job.pk,
            title,
            job.external_id,
            state.detail,
        )
        return False
    detail = state.detail[:200]
    TrainingJob.objects.filter(pk=job.pk, attempts=job.attempts).update(
        heartbeat_at=now, external_state=detail
    )
    if detail != job.external_state and not state.finished and state.state != vocab.GONE:
        with transaction.atomic():
            job_event(
                job,
                {"attempt": job.attempts, "external_state": detail, "message": f"{title}: {detail}."},
            )
    if state.state == vocab.RUNNING:
        _started(job)
    if lines := backend.new_log_lines(job, state, final=state.finished):
        publish(job.stream, "event", {"log": lines, "node": 0, "attempt": job.attempts})
    if state.state == vocab.GONE and not job.cancel_requested:
        job_fail(
            job_id=job.pk,
            human=f"{state.detail}: its outcome was not seen. Relaunch to run it again.",
            error=f"{title} job {job.external_id}: {state.detail}",
        )
        return True
    if state.finished or state.state == vocab.GONE:
        _finished(job, backend, state)
        return True
    return False


def _started(job: TrainingJob) -> None:
    """The scheduler runs the job: its nodes are running (the local path's ``node_started``: the job's
    "running" event)."""

    for node in JobNode.objects.filter(job=job, attempt=job.attempts, state=JobState.QUEUED):
        node_started(node=node, pid=None)


def run_summary(job: TrainingJob, attempt: int) -> dict | None:
    """Rank 0's run summary: the figures of its ``finished`` event of this attempt (the local launcher reads
    the same figures from the file rank 0 writes), from Redis, else from the stored events."""

    def summary_of(values: dict) -> dict | None:
        if values.get("state") == "finished" and values.get("attempt") == attempt:
            return {k: v for k, v in values.items() if k not in ("state", "attempt")}
        return None

    try:
        for event in parse_entries(redis_client().xrevrange(stream_key(job.stream), count=SUMMARY_SCAN)):
            if event.get("kind") == "event" and (found := summary_of(event.get("values") or {})):
                return found
    except Exception:  # noqa: BLE001 - Redis away: the relay stored what it had read
        log.warning("job %s: run summary not read from Redis", job.pk, exc_info=True)
    for values in (
        StreamEvent.objects.filter(stream=job.stream, kind="event")
        .order_by("-seq")
        .values_list("values", flat=True)[:SUMMARY_SCAN]
    ):
        if found := summary_of(values or {}):
            return found
    return None


def _finished(job: TrainingJob, backend, state: ExternalState) -> None:
    """The scheduler's job ended: every node of the attempt finished (the local path's ``node_finished``,
    the last settling the attempt), then the scheduler's reason goes into what a failed job says."""

    title = TITLE[job.launcher]
    cancelled = state.state in (vocab.CANCELLED, vocab.GONE)
    succeeded = state.state == vocab.SUCCEEDED
    try:
        log_tail = backend.log_tail(job, state)
    except SchedulerError as exc:
        log_tail = f"({title} did not give the job's log: {exc})"
    summary = run_summary(job, job.attempts) if succeeded else None
    exit_code = state.exit_code if state.exit_code is not None else (0 if succeeded else 1)
    with transaction.atomic():
        for node in JobNode.objects.filter(job=job, attempt=job.attempts).exclude(
            state__in=TrainingJob.TERMINAL_STATES
        ):
            node_finished(
                node=node, exit_code=exit_code, cancelled=cancelled, log_tail=log_tail, summary=summary
            )
        settled = TrainingJob.objects.get(pk=job.pk)
        said = f"{title} job {job.external_id} ended {state.detail}"
        if settled.state == JobState.FAILED:
            settled.human_readable_error = f"{said}, exit code {exit_code}. " + settled.human_readable_error
            settled.save(update_fields=["human_readable_error", "updated_at"])
        elif settled.state == JobState.CANCELLED and not settled.cancel_requested:
            settled.human_readable_error = f"Cancelled outside cann-train: {said}."
            settled.save(update_fields=["human_readable_error", "updated_at"])
