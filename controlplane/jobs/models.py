"""Training jobs: what to run, on how many nodes, and what happened."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.common.models import JobState, LongRunningJob

# restart policy defaults: torchrun's own elastic agent restarts a worker group up to --max-restarts times
# (default 0); 3 rides out the interruption rate Meta reports for Llama 3 (419 in 54 days on 16K GPUs,
# Dubey et al. 2024 §3.3.4: one every ~3 h) over a few-hour job with room to spare
DEFAULT_MAX_RESTARTS = 3
MAX_RESTARTS_LIMIT = 100
# a rank that commits no step for 60 s is hung: PyTorch's default collective timeout (30 min,
# torch.distributed.constants.default_pg_timeout) is far too long to wait; 5 s is about the slowest step
# of this machine's examples, 1 h the slowest step plus snapshot of a very large model
DEFAULT_HANG_TIMEOUT_S = 60.0
HANG_TIMEOUT_RANGE_S = (5.0, 3600.0)


class TrainingJob(LongRunningJob):
    """A training run launched from a plan (or a strategy + model).

    State machine: [scheduled →] queued → launching → running → succeeded | failed | cancelled, and
    running ⇄ recovering
    while a fault (a killed or hung rank, a lost worker) is being recovered from the newest good snapshot.
    A job with a green schedule waits in scheduled for its window; an interruptible one goes running →
    scheduled at the end of each slot but the last (``controlplane.jobs.services.scheduling``).
    A failed or cancelled job can be relaunched (``attempts`` counts launches); a job that snapshots
    resumes. ``measured`` holds the run summary beside the plan's ``predicted`` figures, so the knowledge
    base learns from every run.
    """

    STREAM_KIND = "job"
    ACTIVE_STATES = (JobState.LAUNCHING, JobState.RUNNING, JobState.RECOVERING)

    name = models.CharField(max_length=200)
    config = models.JSONField(
        default=dict, help_text="the runtime's JobConfig: model, strategy, training, steps…"
    )
    plan = models.JSONField(null=True, blank=True, help_text="the plan.json it was launched from, if any")
    source_plan = models.ForeignKey(
        "planning.StoredPlan",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        help_text="the stored plan it was launched from; its measured figures land there when the job succeeds",
    )
    nnodes = models.PositiveIntegerField(
        default=1,
        help_text="the most nodes it runs on (max_nodes in the API); the world size divides over them",
    )
    min_nodes = models.PositiveIntegerField(
        default=None,
        validators=[MinValueValidator(1)],
        help_text="the fewest nodes it goes on with (elastic when fewer than nnodes); default: nnodes",
    )
    nproc_per_node = models.PositiveIntegerField(default=1)
    attempts = models.PositiveIntegerField(default=0)
    exit_codes = models.JSONField(
        default=list, blank=True, help_text="per launch: {attempt, node_rank, code}"
    )
    log_tail = models.TextField(blank=True, default="")
    measured = models.JSONField(null=True, blank=True, help_text="run summary written by rank 0")
    cancel_requested = models.BooleanField(default=False)
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="last sign of life of a supervisor")
    cancelled_by = models.ForeignKey(
        "auth.User",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="who asked to cancel the current attempt (its page says 'cancelled by <user>')",
    )
    tags = models.JSONField(
        default=list, blank=True, help_text="short labels (at most 20, 1-40 characters each)"
    )
    notes = models.TextField(
        blank=True, default="", help_text="free text about the run (at most 10,000 characters)"
    )
    max_restarts = models.PositiveIntegerField(
        default=DEFAULT_MAX_RESTARTS,
        validators=[MinValueValidator(0), MaxValueValidator(MAX_RESTARTS_LIMIT)],
        help_text="automatic recoveries (faults) allowed from the latest launch by a person on (0-100)",
    )
    hang_timeout_s = models.FloatField(
        default=DEFAULT_HANG_TIMEOUT_S,
        validators=[MinValueValidator(HANG_TIMEOUT_RANGE_S[0]), MaxValueValidator(HANG_TIMEOUT_RANGE_S[1])],
        help_text="a rank that commits no step for this long is hung: it is stopped and the job recovers",
    )
    restart_budget_from = models.PositiveIntegerField(
        default=1,
        help_text="the attempt launched by a person last: the faults from it on count against max_restarts",
    )
    goodput = models.JSONField(
        null=True,
        blank=True,
        help_text="productive vs wall time of the latest attempt: wall_s productive_s goodput badput{...}",
    )
    green_schedule = models.OneToOneField(
        "green.GreenSchedule",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="job",
        help_text="the carbon-aware schedule it runs under: it starts when a slot opens (and an interruptible "
        "job pauses between slots)",
    )
    slot_end_at = models.DateTimeField(
        null=True, blank=True, help_text="the end of the schedule slot the current attempt was launched in"
    )
    pause_requested = models.BooleanField(
        default=False, help_text="stopped at the end of its slot: it goes back to scheduled, not cancelled"
    )
    # the launcher of the current attempt (controlplane.jobs.services.launchers, .follow): local = a Celery worker's torchrun,
    # supervised and reaped by heartbeat; slurm / kubernetes = the scheduler's job, followed by its state
    launcher = models.CharField(
        max_length=16,
        choices=[("local", "local"), ("slurm", "slurm"), ("kubernetes", "kubernetes")],
        default="local",
        help_text="what launched the current attempt: a Celery worker's torchrun, or Slurm / Kubernetes",
    )
    external_id = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="the scheduler's id of the current attempt: Slurm's job id, or the PyTorchJob's name",
    )
    external_state = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="what the scheduler last said, e.g. PENDING (Resources)",
    )

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"

    def save(self, *args, **kwargs):
        if self.min_nodes is None:  # not elastic unless asked for
            self.min_nodes = self.nnodes
        super().save(*args, **kwargs)

    @property
    def max_nodes(self) -> int:
        """The API's name for ``nnodes``: the most nodes the job runs on."""
        return self.nnodes

    @property
    def elastic(self) -> bool:
        """An elastic node range (``min_nodes`` < ``nnodes``): a node lost for good does not end the job, the
        nodes left go on (torchrun ``--nnodes MIN:MAX``), and a node that comes back joins again."""
        return self.min_nodes is not None and self.min_nodes < self.nnodes

    @property
    def files_stamp(self) -> str:
        """Its creation time to the microsecond: with its id, it names the job's files under VAR_DIR (another
        database on the same VAR_DIR, or one reset, reuses ids: never id and stamp together)."""
        return self.created_at.strftime("%Y%m%dT%H%M%S%f")

    @property
    def snapshots_enabled(self) -> bool:
        """The job snapshots its training state (``snapshot_every`` > 0 into a ``snapshot_dir``)."""
        config = self.config or {}
        return int(config.get("snapshot_every") or 0) > 0 and bool(config.get("snapshot_dir"))

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def predicted_step_time_s(self) -> float | None:
        return ((self.plan or {}).get("predicted") or {}).get("step_time_s")


class JobNode(models.Model):
    """One node's torchrun agent of a job attempt, supervised by the Celery worker of that node."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="nodes")
    attempt = models.PositiveIntegerField()
    node_rank = models.PositiveIntegerField()
    node_name = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "attempt", "node_rank"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "node_rank"], name="unique_job_node")
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} node {self.node_rank} ({self.state})"


class CommComparison(LongRunningJob):
    """ "Compare communication methods" for a job's model: each method trains it on the emulated two-tier
    network (``workers.training.comm.compare``); the result is kept with the job and its plan."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="comm_comparisons")
    plan = models.ForeignKey(
        "planning.StoredPlan",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="comm_comparisons",
    )
    request = models.JSONField(
        default=dict, help_text="methods, steps, nodes, ranks_per_node, inter_node_gbit"
    )
    result = models.JSONField(
        null=True, blank=True, help_text="network, model, setup, methods{name: figures}"
    )
    cancel_requested = models.BooleanField(
        default=False,
        help_text="asked to stop: the running method's processes are stopped, the network torn down",
    )

    def __str__(self) -> str:
        return f"comm comparison {self.pk} of job {self.job_id} ({self.state})"

    @property
    def stream(self) -> str:  # progress goes to the job's own stream
        return self.job.stream


class FaultKind(models.TextChoices):
    RANK_KILLED = "rank-killed"
    RANK_HUNG = "rank-hung"
    RANK_FAILED = "rank-failed"
    WORKER_LOST = "worker-lost"
    NODE_LOST = "node-lost"  # one node of an elastic job ended or went silent; the others went on
    NODE_DRAINED = (
        "node-drained"  # the fault-risk loop took a risky node out of an elastic job; the others went on
    )
    # train events rank 0 published that were never stored: a Redis that lost its data (restarted without its
    # AOF) before the relay had read them; counted once the job ended (services/delivery.py); no restart
    EVENTS_LOST = "events-lost"


WITHOUT_THE_NODE = (FaultKind.NODE_LOST, FaultKind.NODE_DRAINED)
NOT_RESTARTS = (*WITHOUT_THE_NODE, FaultKind.EVENTS_LOST)
"""Faults that cost no automatic recovery of the job's own (``restarts_left`` leaves them out)."""
"""Faults after which an elastic job goes on without one of its nodes (the attempt settles without it; the
recovery they cost is the torchrun restart of the nodes left, which their own watch records and counts)."""


class JobFault(models.Model):
    """One fault of a job attempt and how it was recovered: the recovery engine
    (``workers.reliability.elastic``) reports a killed, hung or failed rank; the reaper a lost worker; the
    control plane a node an elastic job lost (``node-lost``: the nodes left went on without it).
    ``recovered_at`` stays null until training continues (or for good when the job failed instead)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="faults")
    attempt = models.PositiveIntegerField()
    restart = models.PositiveIntegerField(default=0, help_text="torchrun restart within the attempt")
    kind = models.CharField(max_length=16, choices=FaultKind.choices)
    rank = models.IntegerField(null=True, blank=True)
    node_rank = models.IntegerField(null=True, blank=True, help_text="the node it hit (node-lost)")
    node_name = models.CharField(max_length=200, blank=True, default="", help_text="that node's name")
    step = models.IntegerField(null=True, blank=True, help_text="last committed step before the fault")
    message = models.TextField(blank=True, default="")
    detected_at = models.DateTimeField()
    recovered_at = models.DateTimeField(null=True, blank=True)
    resumed_from_step = models.IntegerField(
        null=True, blank=True, help_text="the step training continued from (0: from the start)"
    )
    snapshot = models.CharField(max_length=64, blank=True, default="", help_text="the snapshot resumed from")
    steps_lost = models.IntegerField(null=True, blank=True, help_text="steps trained again")
    rto_s = models.FloatField(null=True, blank=True, help_text="seconds from detection to training again")

    class Meta:
        ordering = ["job", "detected_at", "pk"]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}: {self.kind} at step {self.step}"


class SnapshotKind(models.TextChoices):
    FULL = "full"
    DELTA = "delta"
    LOG = "log"  # the gradients of the steps since its base, replayed on restore (snapshot_delta: log)


class JobSnapshot(models.Model):
    """A snapshot a job's ranks published (``workers.training.checkpoint``): the job page lists them and
    a job can be restored from one (``resume_from``)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="snapshots")
    name = models.CharField(max_length=64, help_text="its directory under the job's snapshot_dir")
    attempt = models.PositiveIntegerField(default=1)
    step = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=SnapshotKind.choices)
    bytes_written = models.BigIntegerField(default=0)
    raw_bytes = models.BigIntegerField(default=0)
    base = models.CharField(max_length=64, blank=True, default="", help_text="the full snapshot of a delta")
    created_at = models.DateTimeField()
    verified = models.BooleanField(default=False, help_text="its checksums verified when it was published")
    problem = models.TextField(blank=True, default="", help_text="why it did not verify")
    removed = models.BooleanField(
        default=False, help_text="retention (or a restore) took it away, as the supervisor saw it"
    )

    class Meta:
        ordering = ["job", "step", "name"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="unique_job_snapshot")]

    def __str__(self) -> str:
        return f"job {self.job_id} snapshot {self.name}"
