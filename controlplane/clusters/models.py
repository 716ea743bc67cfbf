"""Hardware profiles and cluster topologies (``contracts/cluster.json``)."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import TeamOwned


class HardwareProfile(TeamOwned):
    """An accelerator's figures, each with its source, plus the planner's calibrated efficiency constants.

    ``spec`` has the shape of a profile in ``workers/planner/data/hardware_profiles.json``: peak_tflops,
    memory_GiB, memory_bandwidth_GBps, tdp_watts, sources {field: citation}, efficiency {name: {value,
    source}}. Every value is editable: published figures for some devices (Ascend 910B) disagree.
    """

    class Confidence(models.TextChoices):
        PUBLISHED = "published"
        SECONDARY = "secondary"
        SOFT = "soft"
        MEASURED = "measured"
        TRANSFERRED = "transferred"

    name = models.CharField(max_length=100)
    confidence = models.CharField(max_length=16, choices=Confidence.choices, default=Confidence.PUBLISHED)
    spec = models.JSONField(default=dict)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_profile_name_per_team")]

    def __str__(self) -> str:
        return self.name


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

    @property
    def device_name(self) -> str:
        return str((self.spec.get("device") or {}).get("name", ""))
