"""Jobs launched through a cluster scheduler (``settings.JOB_LAUNCHER``: ``slurm`` or ``kubernetes``; ``local``,
a Celery worker's torchrun, stays the default): launch an attempt, cancel it, and the schedulers' backends.

- :func:`launch_attempt` (``job_fan_out`` calls it for a queued attempt): lays the job's runtime config out as
  a :class:`~workers.deploy.launchers.JobDeployment` (with ``job_id``, ``redis_url`` and ``attempt``: its ranks
  publish their events on the job's stream, as the local launcher's do), renders it
  (``workers.deploy.render``) and submits it; the job is then ``launching``, with one ``JobNode`` row per
  node and the scheduler's id in ``external_id``.
- :func:`cancel_external` (``job_cancel`` calls it after its commit; the follower repeats it until the
  scheduler says the job ended): ``scancel`` / delete the PyTorchJob.
- Following the scheduler's job while it runs is ``follow`` (the relay runs it periodically).

The reaper (``reap_orphans``) leaves these jobs alone: their liveness is the scheduler's, not a heartbeat.
"""

from __future__ import annotations

import logging
import shlex
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.common.models import JobState
from controlplane.common.redis import redis_client
from controlplane.jobs.models import JobNode, TrainingJob
from controlplane.jobs.paths import job_dir
from controlplane.jobs.selectors import restarts_left
from controlplane.jobs.services.events import job_event
from controlplane.jobs.services.outcomes import job_fail
from controlplane.live import credentials
from workers.deploy.launchers import ExternalState, SchedulerError

log = logging.getLogger(__name__)

EXTERNAL = ("slurm", "kubernetes")

TITLE = {"slurm": "Slurm", "kubernetes": "Kubernetes"}

SUBMIT_GRACE = timedelta(minutes=5)
"""A launching job with no scheduler id this long after its launch lost its submission (the worker died
between its commit and sbatch's answer): it is failed, relaunchable. sbatch answers within seconds."""

LOG_OFFSET_KEY = "cann:external-log:{job}:{attempt}"
"""Redis key: how far into the attempt's output file the live log has been published (a relay restart
goes on from there)."""


def job_name(job: TrainingJob, attempt: int) -> str:
    """The scheduler's name for an attempt (a DNS label: Kubernetes names its pods' services after it)."""
    return f"cann-train-job{job.pk}-a{attempt}"


class _Slurm:
    title = "Slurm"

    def submit(self, dep, job: TrainingJob, attempt: int) -> str:
        from workers.deploy import slurm
        from workers.deploy.render import render_slurm

        return slurm.submit(
            render_slurm(dep),
            workdir=slurm_workdir(job, attempt),
            name=dep.name,
            partition=settings.SLURM_PARTITION,
            extra_args=shlex.split(settings.SLURM_SBATCH_ARGS),
        )

    def state(self, job: TrainingJob) -> ExternalState:
        from workers.deploy import slurm

        return slurm.state(job.external_id)

    def cancel(self, job: TrainingJob) -> None:
        from workers.deploy import slurm

        slurm.cancel(job.external_id)

    def log_tail(self, job: TrainingJob, state: ExternalState) -> str:
        from workers.deploy import slurm

        return slurm.output_tail(state.log_path)

    def new_log_lines(self, job: TrainingJob, state: ExternalState, *, final: bool = False) -> list[str]:
        """The output file's lines since the last call (torchrun's noise left out), for the live log."""
        if not state.log_path:
            return []
        from workers.training.supervision.supervisor import LogFollower

        key = LOG_OFFSET_KEY.format(job=job.pk, attempt=job.attempts)
        follower = _FOLLOWERS.get(key)
        r = redis_client()
        if follower is None:
            follower = _FOLLOWERS[key] = LogFollower(Path(state.log_path), int(r.get(key) or 0))
        lines = follower.read_new(final=final)
        r.set(key, follower.offset, ex=7 * 24 * 3600)
        if final:
            _FOLLOWERS.pop(key, None)
        return lines


class _Kubernetes:
    title = "Kubernetes"

    def __init__(self):
        from workers.deploy.kubernetes import PyTorchJobs

        self.jobs = PyTorchJobs(settings.K8S_NAMESPACE)

    def submit(self, dep, job: TrainingJob, attempt: int) -> str:
        from workers.deploy.render import render_kubernetes

        return self.jobs.submit(render_kubernetes(dep))

    def state(self, job: TrainingJob) -> ExternalState:
        return self.jobs.state(job.external_id)

    def cancel(self, job: TrainingJob) -> None:
        self.jobs.cancel(job.external_id)

    def log_tail(self, job: TrainingJob, state: ExternalState) -> str:
        return self.jobs.log_tail(job.external_id)

    def new_log_lines(self, job: TrainingJob, state: ExternalState, *, final: bool = False) -> list[str]:
        return []  # the pod log is read at the end (log_tail)


_FOLLOWERS: dict = {}  # the live log's readers of this process, by LOG_OFFSET_KEY


def backend_for(launcher: str):
    """The scheduler behind ``launcher``; :class:`SchedulerError` when it cannot be reached at all."""
    if launcher == "slurm":
        return _Slurm()
    if launcher == "kubernetes":
        return _Kubernetes()
    raise SchedulerError(f"{launcher!r} is not an external launcher (one of {', '.join(EXTERNAL)})")


def slurm_workdir(job: TrainingJob, attempt: int) -> Path:
    """Where an attempt is submitted from: its batch script, the job config the script writes and the job's
    output. ``SLURM_WORKDIR`` (a directory the compute nodes see), else the job's own directory."""

    if settings.SLURM_WORKDIR:
        path = Path(settings.SLURM_WORKDIR) / f"job{job.pk}-{job.files_stamp}" / f"attempt-{attempt}"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return job_dir(job, attempt)


def unsupported(job: TrainingJob, launcher: str) -> str:
    """Why ``launcher`` cannot run this job ("" when it can), in words a person can act on."""
    how = f"CANN_TRAIN_LAUNCHER={launcher}"
    if job.elastic:
        return (
            f"An elastic node range ({job.min_nodes}-{job.nnodes} nodes) needs the local launcher: its nodes "
            f"re-form through the control plane's node workers. With {how}, set min_nodes = max_nodes."
        )
    if (job.config or {}).get("inject"):
        return (
            f"Injected faults (inject) are fired by the local launcher's supervisor; with {how} the scheduler "
            "runs the job. Leave inject out, or run it where CANN_TRAIN_LAUNCHER=local."
        )
    if launcher == "kubernetes" and job.snapshots_enabled:
        return (
            "The Kubernetes launcher mounts no shared volume for snapshots (the PyTorchJob's pods would write "
            "them to their own disks, lost with them): set snapshot_every to 0, or use the slurm or local launcher."
        )
    return ""


def deployment_for(job: TrainingJob, attempt: int, launcher: str):
    """The attempt as the scheduler runs it: ``nnodes`` x ``nproc_per_node`` ranks of the job's device (a
    ``device=auto`` job: ``EXTERNAL_DEVICE``), torchrun restarting the ranks within the scheduler's job as
    often as the job has restarts left when it snapshots (they resume from its newest snapshot)."""
    from workers.deploy.launchers import job_deployment

    config = dict(job.config or {})
    device = config.get("device") or "auto"
    # the ranks publish with the job's own credential (its stream alone), as a local job's do (node_run): a
    # user's code runs there, and the rendered config sits in a directory the scheduler's nodes read
    redis_url, why_not = credentials.publisher_url(job.stream, settings.EXTERNAL_REDIS_URL or None)
    if why_not:
        log.warning("job %s: %s", job.pk, why_not)
    return job_deployment(
        config,
        name=job_name(job, attempt),
        job_id=job.pk,
        attempt=attempt,
        redis_url=redis_url,
        nnodes=job.nnodes,
        nproc_per_node=job.nproc_per_node,
        device=settings.EXTERNAL_DEVICE if device == "auto" else device,
        python=settings.SLURM_PYTHON if launcher == "slurm" else settings.K8S_PYTHON,
        image=settings.K8S_IMAGE,
        max_restarts=restarts_left(job) if job.snapshots_enabled else 0,
    )


def launch_attempt(*, job_id: int, attempt: int, launcher: str | None = None) -> str:
    """Submit a queued attempt to the scheduler (``launcher``, default ``settings.JOB_LAUNCHER``)."""
    from workers.deploy.render import describe
    from workers.training.config import ConfigError

    launcher = launcher or settings.JOB_LAUNCHER
    job = TrainingJob.objects.get(pk=job_id)
    if job.attempts != attempt or job.state != JobState.QUEUED:
        return "skipped"
    title = TITLE[launcher]
    if problem := unsupported(job, launcher):
        job_fail(job_id=job.pk, human=problem)
        return "failed"
    try:
        dep = deployment_for(job, attempt, launcher)
        backend = backend_for(launcher)
    except ConfigError as exc:
        job_fail(job_id=job.pk, human=f"The job cannot be laid out for {title}: {exc}")
        return "failed"
    except SchedulerError as exc:
        job_fail(job_id=job.pk, human=f"{title} cannot be reached: {exc}. Fix it and relaunch.")
        return "failed"
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.QUEUED or job.attempts != attempt:  # cancelled meanwhile
            return "skipped"
        job.state = JobState.LAUNCHING
        job.launcher, job.external_id, job.external_state = launcher, "", ""
        job.heartbeat_at = timezone.now()
        job.save()
        for rank in range(job.nnodes):
            JobNode.objects.create(job=job, attempt=attempt, node_rank=rank)
        job_event(
            job,
            {
                "state": "launching",
                "attempt": attempt,
                "launcher": launcher,
                "message": f"Submitting to {title}: {describe(dep)}.",
            },
        )
    try:
        external_id = backend.submit(dep, job, attempt)
    except SchedulerError as exc:
        job_fail(job_id=job.pk, human=f"{title} did not take the job: {exc}. Fix it and relaunch.")
        return "failed"
    with transaction.atomic():
        TrainingJob.objects.filter(pk=job.pk, attempts=attempt).update(
            external_id=external_id, external_state="submitted"
        )
        what = (
            f"job {external_id}"
            if launcher == "slurm"
            else f"PyTorchJob {settings.K8S_NAMESPACE}/{external_id}"
        )
        job_event(
            job,
            {
                "attempt": attempt,
                "launcher": launcher,
                "external_id": external_id,
                "message": f"Submitted to {title} as {what}.",
            },
        )
    log.info("job %s attempt %s: submitted to %s as %s", job.pk, attempt, title, external_id)
    return f"submitted to {title} as {external_id}"


def cancel_external(*, job_id: int) -> None:
    """Tell the scheduler to stop the job's current attempt (the follower settles it when it has)."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or job.launcher not in EXTERNAL or not job.external_id or job.is_finished:
        return
    try:
        backend_for(job.launcher).cancel(job)
    except SchedulerError as exc:  # the follower asks again at its next round
        log.warning("job %s: could not cancel %s: %s", job.pk, job.external_id, exc)
