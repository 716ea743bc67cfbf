"""Writes for training jobs: create, launch, cancel, relaunch, and settle what the nodes report."""

from __future__ import annotations

import os
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from controlplane.common.models import JobState
from controlplane.jobs.models import JobNode, TrainingJob
from controlplane.live.services import publish

# CPU ranks one machine may run per node (torchrun --nproc-per-node); GPUs/NPUs are bounded by the device count
MAX_CPU_RANKS_PER_NODE = int(os.environ.get("CANN_TRAIN_MAX_CPU_RANKS", "4"))
# a supervisor that has not written a heartbeat for this long is presumed dead
HEARTBEAT_TIMEOUT = timedelta(seconds=float(os.environ.get("CANN_TRAIN_HEARTBEAT_TIMEOUT_S", "20")))


def validated_config(config: dict) -> dict:
    """The runtime's own validation (one source of truth), as field-level 400s."""
    from workers.training.config import ConfigError, JobConfig

    try:
        return JobConfig.from_dict(config).validate().to_dict()
    except ConfigError as exc:
        raise ValidationError(exc.errors) from exc


def publish_after_commit(job: TrainingJob, values: dict) -> None:
    transaction.on_commit(lambda: publish(job.stream, "event", values))


def check_fits_this_machine(config: dict, nproc_per_node: int) -> None:
    """A CPU job must fit in this machine's memory: weights, gradients and Adam's two moments in fp32
    (16 bytes per parameter, Rajbhandari et al. 2020 §3) per replica, times the ranks of one node."""
    if config.get("device", "auto") not in {"auto", "cpu"}:
        return
    import psutil

    from workers.planner import ModelSpec, SpecError

    try:
        params = ModelSpec.from_dict(config["model"]).parameter_count()["total"]
    except SpecError as exc:
        raise ValidationError({f"model.{k}": v for k, v in exc.errors.items()}) from exc
    need = params * 16 * nproc_per_node
    have = psutil.virtual_memory().total
    if need > 0.8 * have:
        name = config["model"].get("name", "this model")
        raise ValidationError(
            {
                "model": [
                    f"{name} has {params / 1e9:.3g} B parameters: training it on {nproc_per_node} CPU rank(s) needs about "
                    f"{need / 2**30:,.0f} GiB, this machine has {have / 2**30:,.0f} GiB. "
                    "Launch it on a GPU/NPU cluster, or use a smaller model here."
                ]
            }
        )


def job_create(
    *,
    team,
    name: str,
    config: dict,
    plan: dict | None = None,
    nnodes: int = 1,
    created_by=None,
    launch: bool = True,
    source_plan=None,
) -> TrainingJob:
    config = validated_config(config)
    world = 1
    for key in ("tp", "pp", "dp", "cp"):
        world *= int(config["strategy"].get(key, 1))
    if nnodes < 1 or world % nnodes:
        raise ValidationError({"nnodes": [f"must divide the world size tp*pp*dp*cp = {world}, got {nnodes}"]})
    nproc = world // nnodes
    if config.get("device", "auto") in {"auto", "cpu"} and nproc > MAX_CPU_RANKS_PER_NODE:
        raise ValidationError(
            {
                "nnodes": [
                    f"{world} ranks on {nnodes} node(s) is {nproc} CPU ranks per node; at most {MAX_CPU_RANKS_PER_NODE} "
                    "fit one node here (CANN_TRAIN_MAX_CPU_RANKS). Use more nodes or a smaller strategy."
                ]
            }
        )
    check_fits_this_machine(config, nproc)
    with transaction.atomic():
        job = TrainingJob.objects.create(
            team=team,
            name=name,
            config=config,
            plan=plan,
            nnodes=nnodes,
            nproc_per_node=nproc,
            created_by=created_by,
            source_plan=source_plan,
        )
        if launch:
            job_launch(job=job)
    return job


def job_launch(*, job: TrainingJob) -> TrainingJob:
    """Queue a (re)launch. Only a new job, or a failed / cancelled one, can be launched."""
    from workers.tasks.training import launch_job

    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if job.attempts and job.state not in (JobState.FAILED, JobState.CANCELLED):
            raise ValidationError({"state": [f"a {job.state} job cannot be launched again; cancel it first"]})
        job.attempts += 1
        job.state = JobState.QUEUED
        job.cancel_requested = False
        job.error = job.human_readable_error = ""
        job.progress = 0.0
        job.started_at = job.finished_at = job.heartbeat_at = None
        job.save()
        attempt = job.attempts
        # on_commit callbacks run in order: the "queued" event goes out before any worker can answer
        publish_after_commit(job, {"state": "queued", "attempt": attempt})
        transaction.on_commit(lambda: launch_job.apply_async((job.pk, attempt), queue="training"))
    return job


def job_cancel(*, job: TrainingJob) -> TrainingJob:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if job.is_finished:
            raise ValidationError({"state": [f"the job already ended ({job.state})"]})
        job.cancel_requested = True
        if job.state == JobState.QUEUED:  # nothing started: no supervisor to tell
            job.state = JobState.CANCELLED
            job.finished_at = timezone.now()
            job.nodes.filter(attempt=job.attempts, state=JobState.QUEUED).update(state=JobState.CANCELLED)
            publish_after_commit(job, {"state": "cancelled"})
        job.save()
    return job


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
        publish_after_commit(job, {"state": "failed", "message": human})


def node_started(*, node: JobNode, pid: int) -> None:
    now = timezone.now()
    with transaction.atomic():
        JobNode.objects.filter(pk=node.pk).update(
            state=JobState.RUNNING, pid=pid, started_at=now, heartbeat_at=now
        )
        job = TrainingJob.objects.select_for_update().get(pk=node.job_id)
        if job.state in (JobState.QUEUED, JobState.LAUNCHING):
            job.state = JobState.RUNNING
            job.started_at = job.started_at or now
            job.heartbeat_at = now
            job.save()
            publish_after_commit(
                job,
                {"state": "running", "attempt": job.attempts, "nodes": job.nnodes, "ranks": job.world_size},
            )


def heartbeat(*, node: JobNode) -> bool:
    """Record a sign of life; returns True when the job wants to be cancelled."""
    now = timezone.now()
    JobNode.objects.filter(pk=node.pk).update(heartbeat_at=now)
    TrainingJob.objects.filter(pk=node.job_id).update(heartbeat_at=now)
    return TrainingJob.objects.filter(pk=node.job_id, cancel_requested=True).exists()


def node_finished(
    *, node: JobNode, exit_code: int, cancelled: bool, log_tail: str, summary: dict | None
) -> None:
    """Store a node's outcome; the last node to finish settles the job."""
    now = timezone.now()
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=node.job_id)
        state = (
            JobState.CANCELLED if cancelled else (JobState.SUCCEEDED if exit_code == 0 else JobState.FAILED)
        )
        JobNode.objects.filter(pk=node.pk).update(state=state, exit_code=exit_code, finished_at=now)
        job.exit_codes = [
            *job.exit_codes,
            {"attempt": node.attempt, "node_rank": node.node_rank, "code": exit_code},
        ]
        if node.node_rank == 0 or not job.log_tail:
            job.log_tail = log_tail
        if summary is not None:
            job.measured = summary
        nodes = list(job.nodes.filter(attempt=node.attempt))
        if job.is_finished or any(n.state not in TrainingJob.TERMINAL_STATES for n in nodes):
            job.save()
            return
        states = {n.state for n in nodes}
        if job.cancel_requested or JobState.CANCELLED in states:
            job.state = JobState.CANCELLED
        elif states == {JobState.SUCCEEDED}:
            job.state = JobState.SUCCEEDED
            job.progress = 1.0
        else:
            job.state = JobState.FAILED
            bad = [n for n in nodes if n.state == JobState.FAILED]
            job.human_readable_error = (
                f"torchrun on node {bad[0].node_rank} exited with code {bad[0].exit_code}; the log tail below says why. "
                "Fix the cause and relaunch."
            )
            job.error = log_tail[-2000:]
        job.finished_at = now
        job.save()
        values = {"state": job.state, "exit_codes": [n.exit_code for n in nodes]}
        if job.measured:
            values["measured"] = {
                k: job.measured.get(k) for k in ("step_time_s", "tokens_per_s", "loss_last")
            }
        publish_after_commit(job, values)
        if job.state == JobState.SUCCEEDED and job.source_plan_id and job.measured:
            record_measurement(job=job)


# the run summary's figures that sit beside a plan's prediction
MEASURED_KEYS = (
    "step_time_s",
    "tokens_per_s",
    "loss_first",
    "loss_last",
    "world_size",
    "device",
    "steps",
    "tokens_per_step",
    "strategy",
)


def record_measurement(*, job: TrainingJob) -> None:
    """The knowledge base learns: the measured figures go beside the source plan's prediction."""
    from controlplane.planning.services import plan_record_measurement

    measured = {k: job.measured[k] for k in MEASURED_KEYS if k in job.measured}
    plan_record_measurement(plan=job.source_plan, measured=measured, source=f"job/{job.pk}")


def reap_orphans(
    *, now=None, stale_after: timedelta | None = None, node_name: str | None = None, human: str | None = None
) -> list[int]:
    """Fail jobs whose supervising worker stopped sending heartbeats (it died or was stopped): they stay
    visible and can be relaunched, instead of sitting "running" forever. ``node_name`` limits it to jobs
    with a running node of that name (``make run`` stopping its own worker); ``stale_after`` defaults to
    ``HEARTBEAT_TIMEOUT``. Returns the ids it failed."""
    now = now or timezone.now()
    stale = TrainingJob.objects.filter(
        state__in=TrainingJob.ACTIVE_STATES, heartbeat_at__lt=now - (stale_after or HEARTBEAT_TIMEOUT)
    )
    if node_name is not None:
        stale = _with_running_node(stale, node_name)
    failed = []
    for job in stale:
        job_fail(
            job_id=job.pk,
            human=human
            or (
                f"The Celery worker supervising this job stopped answering (last heartbeat "
                f"{job.heartbeat_at:%H:%M:%S} UTC); its training processes were stopped with it. Relaunch to run it again."
            ),
            error="heartbeat timeout",
        )
        failed.append(job.pk)
    return failed


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
