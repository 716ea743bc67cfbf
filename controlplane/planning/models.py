"""Model specs, strategy searches and plans: the knowledge base."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import LongRunningJob, TeamOwned


class StoredModelSpec(TeamOwned):
    """A transformer (dense or MoE) as ``contracts/model.json`` describes it."""

    name = models.CharField(max_length=200)
    spec = models.JSONField(help_text="the model.json document")
    params_billion = models.FloatField(default=0.0, help_text="total parameters, for similarity search")

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_model_name_per_team")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_moe(self) -> bool:
        return bool(self.spec.get("moe"))


class StrategySearch(LongRunningJob):
    """One strategy search: what was asked, how far it got, and how it ended."""

    STREAM_KIND = "search"

    cluster = models.ForeignKey(
        "clusters.Cluster", null=True, on_delete=models.SET_NULL, related_name="searches"
    )
    model_spec = models.ForeignKey(
        StoredModelSpec, null=True, on_delete=models.SET_NULL, related_name="searches"
    )
    request = models.JSONField(
        default=dict, help_text="model, cluster, training, fixed strategy fields, top_k"
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="what_ifs"
    )
    what_if = models.JSONField(null=True, blank=True, help_text='e.g. {"lose_nodes": 16}')
    stats = models.JSONField(
        default=dict, blank=True, help_text="evaluated, feasible, rejected, seconds, tightest…"
    )
    candidates = models.JSONField(
        default=list, blank=True, help_text="compact feasible candidates for the scatter"
    )
    similar_plans = models.JSONField(default=list, blank=True, help_text="warm start: nearest stored plans")
    cancel_requested = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"search {self.pk} ({self.state})"

    @property
    def best_plan(self):
        return self.plans.filter(rank=1).first()


class StoredPlan(TeamOwned):
    """A strategy with its predicted figures (``plan.json``) and, once it ran, the measured ones."""

    class Source(models.TextChoices):
        SEARCH = "search"
        IMPORTED = "imported"
        MEASURED = "measured"

    name = models.CharField(max_length=200, blank=True, default="")
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.SEARCH)
    search = models.ForeignKey(
        StrategySearch, null=True, blank=True, on_delete=models.CASCADE, related_name="plans"
    )
    rank = models.PositiveIntegerField(null=True, blank=True, help_text="1 = best of its search")
    in_pareto = models.BooleanField(default=False)
    cluster = models.ForeignKey(
        "clusters.Cluster", null=True, blank=True, on_delete=models.SET_NULL, related_name="plans"
    )
    model_spec = models.ForeignKey(
        StoredModelSpec, null=True, blank=True, on_delete=models.SET_NULL, related_name="plans"
    )
    # documents as they were when planned (the cluster/model rows may change later)
    model_doc = models.JSONField(default=dict)
    cluster_doc = models.JSONField(default=dict)
    training = models.JSONField(default=dict)
    strategy = models.JSONField()
    feasible = models.BooleanField(default=True)
    reason = models.TextField(blank=True, default="")
    predicted = models.JSONField(default=dict)
    measured = models.JSONField(
        null=True, blank=True, help_text="figures from a real run (job or publication)"
    )
    measured_source = models.TextField(
        blank=True, default="", help_text="job id or citation of the measurement"
    )
    # denormalised for the similar-plans lookup
    device_name = models.CharField(max_length=100, blank=True, default="", db_index=True)
    device_count = models.PositiveIntegerField(default=0)
    params_billion = models.FloatField(default=0.0)

    class Meta:
        ordering = ["search_id", "rank", "-created_at"]
        indexes = [models.Index(fields=["team", "device_name", "device_count"], name="plan_similarity")]

    def __str__(self) -> str:
        from workers.planner.specs import strategy_short_name

        return self.name or strategy_short_name(self.strategy)

    def to_contract(self) -> dict:
        """The plan.json document."""
        return {
            "strategy": self.strategy,
            "feasible": self.feasible,
            "reason": self.reason,
            "predicted": self.predicted,
        }
