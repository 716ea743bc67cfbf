"""Strategy searches and the knowledge base of plans."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import LongRunningJob


class StrategySearch(LongRunningJob):
    """One strategy search: what was asked, how far it got, and how it ended."""

    STREAM_KIND = "search"

    request = models.JSONField(default=dict, help_text="model, cluster, training and fixed strategy fields")

    def __str__(self) -> str:
        return f"search {self.pk} ({self.state})"
