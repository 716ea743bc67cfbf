"""Abstract models shared by every domain app."""

from __future__ import annotations

from django.db import models


class TeamOwned(models.Model):
    """Every domain object belongs to exactly one team; queries are scoped through it."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True

    def copy_name(self) -> str:
        """A free name in the team for a copy of this named object: ``<name> (copy)``, then ``(copy 2)``, …
        (the knowledge-base pages' "copy to edit a variant")."""
        taken = set(type(self).objects.filter(team_id=self.team_id).values_list("name", flat=True))
        name, n = f"{self.name} (copy)", 2
        while name in taken:
            name, n = f"{self.name} (copy {n})", n + 1
        return name[:200]


class JobState(models.TextChoices):
    # a training job waiting for its carbon-aware window (``controlplane.jobs.services.scheduling``): it holds
    # no worker slot; the relay launches it when a slot of its green schedule opens, and an interruptible job
    # comes back here between slots (paused, continuing from its newest snapshot at the next one)
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    LAUNCHING = "launching"
    RUNNING = "running"
    # a training job that lost a rank, a hung rank or its supervising worker and is continuing from its
    # newest good snapshot (``controlplane.jobs``); still active, like running
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class LongRunningJob(TeamOwned):
    """A generic long-running job row (the shape of Baserow's ``core.jobs.Job``).

    Subclasses add what they compute; this row is what a page polls, what a websocket stream is named
    after (``<kind>/<id>``) and where a failure is kept, with a message a person can act on.
    """

    STREAM_KIND = ""  # "job" or "search": the live stream of this object is f"{STREAM_KIND}/{pk}"
    TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED, db_index=True)
    progress = models.FloatField(default=0.0, help_text="0..1")
    error = models.TextField(blank=True, default="", help_text="technical detail (traceback, exit code)")
    human_readable_error = models.TextField(blank=True, default="", help_text="what went wrong, for a person")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    @property
    def stream(self) -> str:
        return f"{self.STREAM_KIND}/{self.pk}"

    @property
    def is_finished(self) -> bool:
        return self.state in self.TERMINAL_STATES
