"""Reads of the knowledge base: nearest stored plans (warm start), plan documents."""

from __future__ import annotations

import math

from django.db.models import Q

from controlplane.planning.models import Plan


def similar_plans(
    *, team, device_name: str, device_count: int, params_billion: float, exclude_search=None, limit: int = 5
) -> list[Plan]:
    """Stored plans of the team for the same device, with model size and device count within 4× — nearest
    first (distance = |log params ratio| + |log device ratio|), measured plans ahead of equal ones."""
    if device_count <= 0 or params_billion <= 0:
        return []
    qs = Plan.objects.filter(
        team=team,
        device_name=device_name,
        feasible=True,
        device_count__gte=device_count / 4,
        device_count__lte=device_count * 4,
        params_billion__gte=params_billion / 4,
        params_billion__lte=params_billion * 4,
    ).filter(
        Q(rank=1) | Q(source__in=[Plan.Source.MEASURED, Plan.Source.IMPORTED]) | Q(measured__isnull=False)
    )
    if exclude_search is not None:
        qs = qs.exclude(search=exclude_search)

    def distance(p: Plan) -> tuple[float, int]:
        d = abs(math.log(p.params_billion / params_billion)) + abs(math.log(p.device_count / device_count))
        return (round(d, 6), 0 if p.measured else 1)

    return sorted(qs[:500], key=distance)[:limit]


def plan_document(plan: Plan) -> dict:
    """A plan for pages and the API: plan.json plus where it came from, what was measured and the memory /
    step-time breakdowns the charts stack (computed here, so no page re-derives them)."""
    from workers.planner.visual import plan_breakdown

    capacity = (plan.cluster_doc.get("device") or {}).get("memory_GiB")
    return {
        "id": plan.pk,
        "name": str(plan),
        "source": plan.source,
        "rank": plan.rank,
        "in_pareto": plan.in_pareto,
        "search_id": plan.search_id,
        "strategy": plan.strategy,
        "feasible": plan.feasible,
        "reason": plan.reason,
        "predicted": plan.predicted,
        "measured": plan.measured,
        "measured_source": plan.measured_source,
        "model_name": plan.model_doc.get("name", ""),
        "cluster_name": plan.cluster_doc.get("name", ""),
        "device_name": plan.device_name,
        "device_count": plan.device_count,
        "breakdown": plan_breakdown(
            plan.predicted, capacity if isinstance(capacity, int | float) and capacity > 0 else None
        ),
    }
