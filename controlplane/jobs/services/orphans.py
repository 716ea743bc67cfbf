"""Jobs whose supervising worker died: found by their heartbeats and failed (the relay runs this)."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from controlplane.common.models import JobState
from controlplane.jobs.models import TrainingJob
from controlplane.jobs.services.nodes import HEARTBEAT_TIMEOUT
from controlplane.jobs.services.outcomes import job_fail
from controlplane.jobs.services.recovery import reap_lost_nodes, resume_after_worker_lost


def reap_orphans(
    *, now=None, stale_after: timedelta | None = None, node_name: str | None = None, human: str | None = None
) -> list[int]:
    """Settle jobs whose supervising worker stopped sending heartbeats (it died or was stopped), instead of
    leaving them "running" forever. A job that snapshots and has restarts left (``max_restarts``) records a
    ``worker-lost`` fault and resumes from its newest good snapshot as a new attempt; any other is failed,
    saying why it was not resumed, and can be relaunched. A job no supervisor has picked up yet (its node
    tasks wait for a free worker slot) has sent no heartbeat and is left alone. ``node_name`` limits it to
    jobs with a running node of that name (``make run`` stopping its own worker: ``human`` is then its
    reason, and those jobs are failed, not resumed); ``stale_after`` defaults to ``HEARTBEAT_TIMEOUT``.
    Returns the ids it settled. First, without ``node_name``: the elastic jobs that lost one node while
    others go on (``reap_lost_nodes``: not settled, they go on)."""
    now = now or timezone.now()
    if node_name is None:
        reap_lost_nodes(now=now, stale_after=stale_after)
    stale = TrainingJob.objects.filter(
        state__in=TrainingJob.ACTIVE_STATES,
        # a job Slurm / Kubernetes runs lives as long as the scheduler says (services.launchers, .follow)
        launcher="local",
        heartbeat_at__lt=now - (stale_after or HEARTBEAT_TIMEOUT),
        # only jobs a supervisor picked up: one whose nodes wait in the queue for a worker slot is queued
        nodes__attempt=F("attempts"),
        nodes__heartbeat_at__isnull=False,
    ).distinct()
    if node_name is not None:
        stale = _with_running_node(stale, node_name)
    settled = []
    for job in stale:
        cause = (
            f"The Celery worker supervising this job stopped answering (last heartbeat "
            f"{job.heartbeat_at:%H:%M:%S} UTC); its training processes were stopped with it."
        )
        why_not = ""
        if human is None:  # (a worker stopped on purpose, with its reason, fails its jobs: no resume)
            why_not = resume_after_worker_lost(job_id=job.pk, cause=cause)
            if not why_not:
                settled.append(job.pk)
                continue
        job_fail(
            job_id=job.pk,
            human=human or f"{cause} It was not resumed: {why_not}",
            error="heartbeat timeout",
        )
        settled.append(job.pk)
    return settled


def running_on_node(node_name: str) -> bool:
    """Whether a job still has a running node of that name (its supervisor may be alive or just gone)."""
    return _with_running_node(
        TrainingJob.objects.filter(state__in=TrainingJob.ACTIVE_STATES), node_name
    ).exists()


def _with_running_node(jobs, node_name: str):
    """The jobs whose current attempt has a running node called ``node_name``."""
    return jobs.filter(
        nodes__attempt=F("attempts"), nodes__node_name=node_name, nodes__state=JobState.RUNNING
    ).distinct()


def keep_job_credentials() -> int:
    """The Redis credentials of this deployment's jobs (``controlplane.live.credentials``; the relay runs this
    every few seconds): each job that may run has its own (made again after a Redis restart lost them:
    ACL users are not in its data), and an ended job's is removed, so a credential left in its files opens
    nothing. Returns how many were removed."""
    from controlplane.live import credentials

    # jobs whose ranks may be running (a queued job's node makes its credential when it starts them)
    running = list(
        TrainingJob.objects.filter(state__in=TrainingJob.ACTIVE_STATES).values_list("pk", flat=True)
    )
    credentials.keep(f"{TrainingJob.STREAM_KIND}/{pk}" for pk in running)
    queued = TrainingJob.objects.filter(state=JobState.QUEUED).values_list("pk", flat=True)
    return credentials.revoke_ended({*running, *queued})
