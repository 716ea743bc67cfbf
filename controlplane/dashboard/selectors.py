"""Reads for the dashboard: the user's recent jobs (the job list's rows) and searches, teams, clusters and
models."""

from __future__ import annotations

from django.db.models import Max

from controlplane.accounts.selectors import scoped, teams_of
from controlplane.clusters.models import Cluster
from controlplane.green.selectors import team_energy
from controlplane.jobs.selectors import job_rows, jobs_of
from controlplane.live.models import StreamEvent
from controlplane.planning.models import StoredModelSpec, StrategySearch

RECENT = 20


def search_rows(user, limit: int = RECENT) -> list[dict]:
    """The newest searches with what the dashboard's table shows and follows live: state, progress and
    the newest stored seq of each stream (the page subscribes from there)."""
    searches = list(scoped(StrategySearch.objects.all(), user).select_related("team")[:limit])
    newest = dict(
        StreamEvent.objects.filter(stream__in=[s.stream for s in searches])
        .values("stream")
        .annotate(seq=Max("seq"))
        .values_list("stream", "seq")
    )
    return [
        {
            "id": s.pk,
            "team": s.team.name,
            "state": s.state,
            "progress": s.progress,
            "stream": s.stream,
            "last_seq": newest.get(s.stream, 0),
            "url": f"/planning/searches/{s.pk}/",
        }
        for s in searches
    ]


def dashboard_overview(user) -> dict:
    jobs = job_rows(user, limit=RECENT)
    searches = search_rows(user)
    return {
        "jobs": jobs,
        "searches": searches,
        "lists": {"jobs": [row.as_dict() for row in jobs], "searches": searches, "recent": RECENT},
        "teams": teams_of(user),
        # energy and carbon of every job of the user's teams (summed from their energy events)
        "green": team_energy(jobs_of(user)),
        "clusters": scoped(Cluster.objects.all(), user),
        "models": scoped(StoredModelSpec.objects.all(), user),
    }
