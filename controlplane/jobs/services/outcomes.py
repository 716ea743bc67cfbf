"""How a job ends when it does not succeed: failed (``job_fail``, the one way to fail a job: its state, its
attempt's nodes and the event) and what a cancelled job says. The floor that launching (``lifecycle``), the
external launchers and the node bookkeeping share."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from controlplane.common.models import JobState
from controlplane.jobs.models import TrainingJob
from controlplane.jobs.services.events import job_event


def cancelled_message(job: TrainingJob) -> str:
    """What a cancelled job says instead of an error: who asked for it."""
    return f"Cancelled by {job.cancelled_by.get_username()}." if job.cancelled_by_id else "Cancelled."


def job_fail(*, job_id: int, human: str, error: str = "") -> None:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.is_finished:
            return
        job.state = JobState.FAILED
        job.human_readable_error = human
        job.error = error
        job.finished_at = timezone.now()
        job.save()
        job.nodes.filter(attempt=job.attempts).exclude(state__in=TrainingJob.TERMINAL_STATES).update(
            state=JobState.FAILED, finished_at=job.finished_at
        )
        job_event(job, {"state": "failed", "message": human, "attempt": job.attempts})
