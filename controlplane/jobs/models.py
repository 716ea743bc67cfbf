"""Training jobs: what to run, on how many nodes, and what happened."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import JobState, LongRunningJob


class TrainingJob(LongRunningJob):
    """A training run launched from a plan (or a strategy + model).

    State machine: queued → launching → running → succeeded | failed | cancelled. A failed or cancelled
    job can be relaunched (``attempts`` counts launches). ``measured`` holds the run summary beside the
    plan's ``predicted`` figures, so the knowledge base learns from every run.
    """

    STREAM_KIND = "job"
    ACTIVE_STATES = (JobState.LAUNCHING, JobState.RUNNING)

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
    nnodes = models.PositiveIntegerField(default=1)
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

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"

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
