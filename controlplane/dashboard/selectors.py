"""Reads for the dashboard: the user's recent jobs and searches, teams, clusters and models."""

from __future__ import annotations

from controlplane.accounts.selectors import scoped, teams_of
from controlplane.clusters.models import Cluster
from controlplane.jobs.models import TrainingJob
from controlplane.planning.models import StoredModelSpec, StrategySearch

RECENT = 20


def dashboard_overview(user) -> dict:
    return {
        "jobs": scoped(TrainingJob.objects.all(), user).select_related("team")[:RECENT],
        "searches": scoped(StrategySearch.objects.all(), user).select_related("team")[:RECENT],
        "teams": teams_of(user),
        "clusters": scoped(Cluster.objects.all(), user),
        "models": scoped(StoredModelSpec.objects.all(), user),
    }
