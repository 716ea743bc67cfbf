"""Adapters between the planner engine and the API (DRF): a contract document parsed by the planner, with
its ``SpecError`` as a field-level 400; one strategy costed, a broken rule as a 400; a costed plan as the
``StoredPlan`` row's columns. The planner's validators are the one source of truth for what a valid document is."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError

from controlplane.common.documents import checked
from workers import planner
from workers.planner.search import checked_ranking as search_ranking


def checked_ranking(objective, constraints, cluster=None) -> tuple[str, dict[str, float]]:
    """A search's objective and constraints checked by the planner; a SpecError becomes a 400 naming the
    field (``objective``, ``constraints.max_bubble_fraction``). With ``cluster`` (a ClusterSpec),
    ``energy`` also needs the device's power."""
    try:
        return search_ranking(objective, constraints, cluster)
    except planner.SpecError as exc:
        raise ValidationError(exc.errors) from exc


def params_billion(model_doc: dict) -> float:
    """Total parameters (billions) of a model.json, by the planner's own count."""
    return float(checked("model", model_doc).parameter_count()["total"]) / 1e9


def evaluated(model, cluster, training, strategy_doc, expert_load=None) -> planner.Plan:
    """Cost one complete strategy with the planner; a broken rule is a 400 on ``strategy.<field>``.
    ``expert_load``: the MoE expert load measured by past runs (``selectors.measured_expert_load``)."""
    try:
        return planner.evaluate(
            model,
            cluster,
            training,
            planner.Strategy.from_dict(strategy_doc, partial=False),
            expert_load=expert_load,
        )
    except planner.SpecError as exc:
        raise ValidationError(
            {k if k.startswith("strategy") else f"strategy.{k}": v for k, v in exc.errors.items()}
        ) from exc


def plan_row_fields(plan: planner.Plan, model: planner.ModelSpec, cluster: planner.ClusterSpec) -> dict:
    """The ``StoredPlan`` columns a costed plan fills: what the planner said, and the scenario keys the
    similar-plans lookup filters on (device, device count, model size). ``device_count`` is the devices the
    plan takes: fewer than the cluster's when its ``predicted`` says the rest stay idle (``devices_used``)."""
    return {
        "strategy": plan.strategy.to_dict(),
        "feasible": plan.feasible,
        "reason": plan.reason,
        "predicted": plan.predicted,
        "device_name": cluster.device.name,
        "device_count": plan.predicted.get("devices_used", cluster.num_devices),
        "params_billion": model.parameter_count()["total"] / 1e9,
    }
