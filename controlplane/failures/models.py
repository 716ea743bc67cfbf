"""The failure-pattern knowledge base's own records: the incidents a team imports."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import TeamOwned


class FailureIncident(TeamOwned):
    """One failure of one node from an incident list a team imported (``POST /api/failure-patterns/incidents/``):
    the failure-pattern knowledge base (``workers.reliability.risk.patterns``) counts them per kind. ``kind``
    is kept as written; the pattern it belongs to is matched when the patterns are read."""

    node = models.CharField(max_length=200)
    occurred_at = models.DateTimeField()
    kind = models.CharField(max_length=200, help_text="as the incident list wrote it")
    source = models.CharField(max_length=200, help_text="the incident list's file name")
    line = models.PositiveIntegerField(help_text="its line in that file")
    created_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        db_table = "jobs_failureincident"  # the table it had in the jobs app, kept (moved in state only)
        ordering = ["-occurred_at", "pk"]
        constraints = [
            # an incident list imported twice counts its incidents once
            models.UniqueConstraint(
                fields=["team", "node", "occurred_at", "kind"], name="unique_team_incident"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} on {self.node} at {self.occurred_at:%Y-%m-%d %H:%M}"
