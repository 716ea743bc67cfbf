"""Training jobs."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import LongRunningJob


class TrainingJob(LongRunningJob):
    """A training run launched from a plan (or a strategy + model)."""

    STREAM_KIND = "job"

    name = models.CharField(max_length=200)
    config = models.JSONField(default=dict, help_text="strategy, model, training and run settings")

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"
