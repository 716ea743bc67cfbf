"""Cluster topologies (``contracts/cluster.json``)."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import TeamOwned


class Cluster(TeamOwned):
    """A cluster topology as the planner reads it. ``spec`` is the contract document, unchanged."""

    name = models.CharField(max_length=200)
    spec = models.JSONField(help_text="the cluster.json document")

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_cluster_name_per_team")]

    def __str__(self) -> str:
        return self.name

    @property
    def device_count(self) -> int:
        return int(self.spec.get("num_nodes", 0)) * int(self.spec.get("devices_per_node", 0))
