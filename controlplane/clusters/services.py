"""Writes of the clusters app that the pages make (the API's serializers create and edit a cluster)."""

from __future__ import annotations

from django.db import transaction

from controlplane.clusters.models import Cluster


def copy_name(cluster: Cluster) -> str:
    """A free name for a copy of ``cluster`` in its team: ``<name> (copy)``, then ``(copy 2)``, …"""
    taken = set(Cluster.objects.filter(team_id=cluster.team_id).values_list("name", flat=True))
    name, n = f"{cluster.name} (copy)", 2
    while name in taken:
        name, n = f"{cluster.name} (copy {n})", n + 1
    return name[:200]


@transaction.atomic
def delete_cluster(cluster: Cluster) -> int:
    """Delete ``cluster``; returns how many plans referred to it. Those plans keep the document they were
    planned on (``StoredPlan.cluster_doc``) and lose only their link to the row."""
    used = cluster.plans.count()
    cluster.delete()
    return used
