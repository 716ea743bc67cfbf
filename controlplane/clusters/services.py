"""Writes of the clusters app that the pages make (the API's serializers create and edit a cluster)."""

from __future__ import annotations

from django.db import transaction

from controlplane.clusters.models import Cluster


@transaction.atomic
def delete_cluster(cluster: Cluster) -> int:
    """Delete ``cluster``; returns how many plans referred to it. Those plans keep the document they were
    planned on (``StoredPlan.cluster_doc``) and lose only their link to the row."""
    used = cluster.plans.count()
    cluster.delete()
    return used
