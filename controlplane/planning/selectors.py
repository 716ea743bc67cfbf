"""Reads of the knowledge base: the searches and plans a user may see, nearest stored plans (warm start),
plan documents, the data each planner page draws (rendered into the page and served by the API alike),
and the what-if costing of one strategy."""

from __future__ import annotations

import math
from collections.abc import Mapping

from django.conf import settings
from django.db.models import Q, QuerySet
from rest_framework.exceptions import ValidationError

from controlplane.accounts.selectors import scoped, teams_of
from controlplane.clusters.models import Cluster
from controlplane.common.models import JobState
from controlplane.planning import ports
from controlplane.planning.models import StoredModelSpec, StoredPlan, StrategySearch
from controlplane.planning.planner_adapters import evaluated
from workers import planner
from workers.planner.warmstart import MeasuredRun

# GET parameters of the plan list (/api/plans/?device=…) and the StoredPlan lookups they filter on
PLAN_FILTERS = {
    "search": "search_id",
    "cluster": "cluster_id",
    "model": "model_spec_id",
    "device": "device_name",
    "source": "source",
}


def searches_of(user) -> QuerySet[StrategySearch]:
    return scoped(StrategySearch.objects.all(), user).select_related("team")


def search_of(user, pk: int) -> StrategySearch | None:
    """The search when it belongs to one of the user's teams; None for another team's search or none."""
    return searches_of(user).filter(pk=pk).first()


def plans_of(user, filters: Mapping[str, str] | None = None) -> QuerySet[StoredPlan]:
    """The plans of the user's teams, narrowed by ``PLAN_FILTERS`` and ``measured=1``."""
    qs = scoped(StoredPlan.objects.all(), user).select_related("team")
    filters = filters or {}
    for param, lookup in PLAN_FILTERS.items():
        if value := filters.get(param):
            qs = qs.filter(**{lookup: value})
    if filters.get("measured") in {"1", "true"}:
        qs = qs.filter(measured__isnull=False)
    return qs


def plan_of(user, pk: int) -> StoredPlan | None:
    return plans_of(user).filter(pk=pk).first()


def planner_overview(user) -> dict:
    """The planner's front page: recent searches, the knowledge base, measured plans, the user's teams."""
    return {
        "searches": searches_of(user).select_related("cluster", "model_spec")[:100],
        "clusters": scoped(Cluster.objects.all(), user).select_related("team"),
        "models": scoped(StoredModelSpec.objects.all(), user).select_related("team"),
        "measured_plans": plans_of(user, {"measured": "1"}).order_by("-updated_at")[:50],
        "teams": teams_of(user),
    }


def similar_plans(
    *, team, device_name: str, device_count: int, params_billion: float, exclude_search=None, limit: int = 5
) -> list[StoredPlan]:
    """Stored plans of the team for the same device, with model size and device count within 4× — nearest
    first (distance = |log params ratio| + |log device ratio|), measured plans ahead of equal ones."""
    if device_count <= 0 or params_billion <= 0:
        return []
    qs = StoredPlan.objects.filter(
        team=team,
        device_name=device_name,
        feasible=True,
        device_count__gte=device_count / 4,
        device_count__lte=device_count * 4,
        params_billion__gte=params_billion / 4,
        params_billion__lte=params_billion * 4,
    ).filter(
        Q(rank=1)
        | Q(source__in=[StoredPlan.Source.MEASURED, StoredPlan.Source.IMPORTED])
        | Q(measured__isnull=False)
    )
    if exclude_search is not None:
        qs = qs.exclude(search=exclude_search)

    def distance(p: StoredPlan) -> tuple[float, int]:
        d = abs(math.log(p.params_billion / params_billion)) + abs(math.log(p.device_count / device_count))
        return (round(d, 6), 0 if p.measured else 1)

    return sorted(qs[:500], key=distance)[:limit]


def plan_document(plan: StoredPlan) -> dict:
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


def plan_visuals_or_none(documents: Mapping, plan: dict) -> dict | None:
    """The visualizer's breakdowns (pipeline schedule, placement, memory, step time) of a plan.json dict;
    ``documents`` holds its ``model``, ``cluster`` and ``training`` (documents or planner specs)."""
    from workers.planner.visual import plan_visuals

    if not plan.get("feasible", True) and not plan.get("predicted"):
        return None
    return plan_visuals(documents["model"], documents["cluster"], documents["training"], plan)


def measured_expert_load(*, teams, model_doc: dict | None) -> planner.MeasuredExpertLoad | None:
    """The per-expert load the teams' past runs of this MoE model measured, for the planner's measured
    routing; None when none did (the planner then assumes uniform routing). The runs are the jobs app's
    (:mod:`controlplane.planning.ports`)."""
    return ports.measured_expert_load(teams=teams, model_doc=model_doc)


def measured_runs(*, team, profile: str) -> list[MeasuredRun]:
    """What the team's runs of stored plans on ``profile`` measured beside what their plan predicted (the
    search's correction factors); the runs are the jobs app's (:mod:`controlplane.planning.ports`)."""
    return ports.measured_runs(team=team, profile=profile)


def strategy_evaluation(
    *,
    model: planner.ModelSpec,
    cluster: planner.ClusterSpec,
    training: planner.TrainingConfig,
    strategy: dict,
    expert_load: planner.MeasuredExpertLoad | None = None,
) -> dict:
    """What-if: cost one complete strategy on a scenario. ``{"plan": plan.json + breakdown, "visuals"}``;
    a strategy the scenario cannot take is a 400 on ``strategy.<field>``. ``expert_load``: see
    :func:`measured_expert_load`."""
    from workers.planner.visual import plan_breakdown

    plan = evaluated(model, cluster, training, strategy, expert_load=expert_load).to_dict()
    plan["breakdown"] = plan_breakdown(plan.get("predicted"), cluster.device.memory_GiB)
    scenario = {"model": model, "cluster": cluster, "training": training}
    return {"plan": plan, "visuals": plan_visuals_or_none(scenario, plan)}


def _scenario(plan: StoredPlan) -> dict:
    return {"model": plan.model_doc, "cluster": plan.cluster_doc, "training": plan.training}


def search_page_header(search: StrategySearch) -> dict:
    """What the search page's HTML is rendered with: its header (the scenario, the state, the limits) and
    the URLs its script uses. The views' data (:func:`search_page_data`: the candidates, the plans, the
    visuals; 1.8 MB for the seed search, 0.4-0.8 s to build) the page fetches from ``page-data`` once it
    has painted (issue 35)."""
    req = search.request
    return {
        "search": {
            "id": search.pk,
            "state": search.state,
            "progress": search.progress,
            "stats": search.stats,
            "human_readable_error": search.human_readable_error,
            "stream": search.stream,
            "what_if": search.what_if,
            "parent_id": search.parent_id,
            # the knowledge-base rows it ran on (their pages), when they still exist
            "cluster_id": search.cluster_id,
            "model_id": search.model_spec_id,
            # what the ranking followed and the limits plans kept (older searches: throughput, none)
            "objective": req.get("objective", "throughput"),
            "constraints": req.get("constraints") or {},
        },
        "model": req.get("model"),
        "cluster": req.get("cluster"),
        "training": req.get("training"),
        "best_plan_id": search.plans.filter(rank=1).values_list("pk", flat=True).first(),
        "urls": {
            "page_data": f"/api/searches/{search.pk}/page-data/",
            "search": f"/api/searches/{search.pk}/",
            "evaluate": "/api/plans/evaluate/",
            "what_if": f"/api/searches/{search.pk}/what-if/",
            "plan_page": "/planning/plans/{id}/",
            "diff": "/planning/plans/diff/?a={a}&b={b}",
            "launch": "/api/jobs/",
            "cancel": f"/api/searches/{search.pk}/cancel/",
            "save_plan": f"/api/searches/{search.pk}/save-plan/",
            "job_page": "/jobs/{id}/",
        },
    }


def search_page_data(search: StrategySearch) -> dict:
    """Everything the search page draws (docs/visualizer.md, "Data contracts"): :func:`search_page_header`
    and the views' data, served by ``GET /api/searches/<id>/page-data/``, which the page fetches once it
    has painted and again when the search ends."""
    plans = list(search.plans.order_by("rank", "-predicted__tokens_per_s"))
    best = next((p for p in plans if p.rank == 1), None)
    parent_best = search.parent.best_plan if search.parent_id else None
    return {
        **search_page_header(search),
        "candidates": search.candidates,
        "plans": [plan_document(p) for p in plans],
        "best_plan_id": best.pk if best else None,
        "similar_plans": search.similar_plans,
        "parent_best": plan_document(parent_best) if parent_best else None,
        "what_ifs": [
            {
                "id": child.pk,
                "url": f"/planning/searches/{child.pk}/",
                "lose_nodes": (child.what_if or {}).get("lose_nodes"),
                "state": child.state,
                "best": plan_document(child.best_plan) if child.best_plan else None,
            }
            for child in search.what_ifs.order_by("created_at")
        ],
        "visuals": plan_visuals_or_none(search.request, best.to_contract()) if best else None,
    }


def runs_here(plan: StoredPlan) -> tuple[bool, str]:
    """Whether the job API would run this plan on this machine's CPU ranks, and why not: its device count
    against ``CANN_TRAIN_MAX_CPU_RANKS``, its ranks against this machine's memory (the planner's memory-fit rule, the job API's too)."""
    from workers.planner.fits import memory_problem

    most = settings.MAX_CPU_RANKS_PER_NODE
    if plan.device_count > most:
        return False, (
            f"it needs {plan.device_count:,} devices; this machine runs at most {most} CPU "
            "ranks per job (CANN_TRAIN_MAX_CPU_RANKS)"
        )
    try:
        specs = (
            planner.ModelSpec.from_dict(plan.model_doc),
            planner.TrainingConfig.from_dict(plan.training),
            planner.Strategy.from_dict(plan.strategy),
        )
    except planner.SpecError as exc:
        return False, f"its documents do not parse: {exc}"
    if problem := memory_problem(
        *specs, max(1, plan.device_count), device_kind="cpu", device_memory_GiB=None
    ):
        return False, problem
    return True, ""


def scale_down_preview(scaled, original: StoredPlan) -> dict:
    """What "launch a scaled-down version" would run, for a page or the API: the original and the scaled
    layout, every change with its reason (``workers.planner.scale.Change``) and the scaled plan's prediction
    on this machine."""
    from workers.planner.visual import plan_breakdown

    plan = scaled.plan.to_dict()
    return {
        "label": f"scaled-down from plan #{original.pk}",
        "original": {
            "id": original.pk,
            "name": str(original),
            "short_name": planner.strategy_short_name(original.strategy),
            "strategy": original.strategy,
            "devices": original.device_count,
            "model": original.model_doc.get("name", ""),
            "cluster": original.cluster_doc.get("name", ""),
        },
        "scaled": {
            **plan,
            "name": scaled.strategy.short_name(),
            "devices": scaled.devices,
            "model": scaled.model.to_dict(),
            "training": scaled.training.to_dict(),
            "cluster": scaled.cluster.to_dict(),
            "params": scaled.model.parameter_count()["total"],
            "breakdown": plan_breakdown(plan.get("predicted"), scaled.cluster.device.memory_GiB),
        },
        "kept": scaled.kept,
        "dropped": scaled.dropped,
        "changes": [c.to_dict() for c in scaled.changes],
    }


def plan_page_data(plan: StoredPlan) -> dict:
    """What the plan page draws: the plan against its search's runner-up, the jobs that ran it, and, for a
    plan this machine cannot run, what its scaled-down version would change."""
    from controlplane.planning.services import plan_scaled_down

    runner_up = None
    if plan.search_id:
        others = plan.search.plans.exclude(pk=plan.pk).filter(rank__isnull=False).order_by("rank")
        runner_up = others.first()
    here, why_not = runs_here(plan)
    scale_down = None
    if not here:
        try:
            scale_down = scale_down_preview(plan_scaled_down(plan=plan), plan)
        except ValidationError as exc:  # a document the planner no longer reads: say so, keep the page
            scale_down = {"error": "; ".join(str(m) for m in exc.detail.get("plan", [exc.detail]))}
    return {
        "runs_here": here,
        "why_not_here": why_not,
        "scale_down": scale_down,
        "plan": plan_document(plan),
        **_scenario(plan),
        "visuals": plan_visuals_or_none(_scenario(plan), plan.to_contract()) if plan.feasible else None,
        "runner_up": plan_document(runner_up) if runner_up else None,
        "powercap": plan_powercap(plan),
        "cluster_row": plan_cluster_link(plan),
        "model_row": plan_model_link(plan),
        "reproduced": plan_reproduction(plan),
        "jobs": [
            {"id": j.pk, "state": j.state, "measured": j.measured}
            for j in plan.jobs.order_by("-created_at")[:10]
        ],
        "urls": {
            "launch": "/api/jobs/",
            "evaluate": "/api/plans/evaluate/",
            "diff": "/planning/plans/diff/?a={a}&b={b}",
            "job_page": "/jobs/{id}/",
            "scale_down": f"/api/plans/{plan.pk}/scale-down/",
        },
    }


def plan_cluster_link(plan: StoredPlan) -> dict | None:
    """The cluster row the plan was planned on (its page), and whether it changed since: the plan keeps the
    document it was planned on (``cluster_doc``), so an edit of the cluster never moves the plan."""
    cluster = plan.cluster
    if cluster is None or cluster.team_id != plan.team_id:
        return None
    return {"id": cluster.pk, "name": cluster.name, "changed_since": cluster.spec != plan.cluster_doc}


def plan_model_link(plan: StoredPlan) -> dict | None:
    """The model row the plan was planned for, as :func:`plan_cluster_link`."""
    model = plan.model_spec
    if model is None or model.team_id != plan.team_id:
        return None
    return {"id": model.pk, "name": model.name, "changed_since": model.spec != plan.model_doc}


def plan_reproduction(plan: StoredPlan) -> dict | None:
    """The plan costed again now from the documents it keeps (model, cluster, training, strategy) beside its
    stored step time: ``{"step_time_s", "stored_step_time_s", "relative_difference", "error"}``. The same
    figures show the plan reproduces whatever happened to the rows since; an MoE plan whose search used the
    expert load measured then is costed with the load measured now."""
    stored = plan.predicted.get("step_time_s")
    if not plan.feasible or not stored:
        return None
    try:
        model = planner.ModelSpec.from_dict(plan.model_doc)
        cluster = planner.ClusterSpec.from_dict(plan.cluster_doc)
        training = planner.TrainingConfig.from_dict(plan.training)
        expert_load = measured_expert_load(teams=[plan.team], model_doc=plan.model_doc)
        again = evaluated(model, cluster, training, plan.strategy, expert_load=expert_load)
    except (planner.SpecError, ValidationError, ValueError, TypeError, KeyError) as exc:
        return {"error": f"the plan's documents no longer cost: {exc}", "stored_step_time_s": stored}
    now = again.predicted.get("step_time_s")
    difference = (now - stored) / stored if now else None
    return {
        "step_time_s": now,
        "stored_step_time_s": stored,
        "relative_difference": difference,
        "difference_text": "the same"
        if difference == 0
        else f"{100 * difference:+.2f}%"
        if difference
        else "",
    }


def plan_powercap(plan: StoredPlan) -> dict | None:
    """Power-cap advice for a plan that fits (``workers.green.powercap``: Zeus's energy-time cost on the
    plan's predicted step, a labelled model; never applied), or None. Worked out when the page is drawn, not
    stored with every plan (it is about 8 kB, and only this page shows it)."""
    if not plan.feasible or not plan.predicted.get("step_time_s"):
        return None
    from workers.green.powercap import plan_powercap_block
    from workers.planner.energy import device_power_profile
    from workers.planner.specs import ClusterSpec

    try:
        cluster = ClusterSpec.from_dict(plan.cluster_doc)
    except (ValueError, TypeError, KeyError) as exc:  # a document the planner no longer reads
        return {"method": "model", "unavailable": f"the plan's cluster cannot be read: {exc}"}
    devices = cluster.num_nodes * cluster.devices_per_node
    return plan_powercap_block(plan.predicted, devices, device_power_profile(cluster), cluster.device.name)


def plan_comm_comparisons(plan: StoredPlan) -> list:
    """The communication-method comparisons of jobs launched from this plan that measured something:
    finished ones, and cancelled ones with the methods measured before the cancel."""
    return [
        c
        for c in plan.comm_comparisons.order_by("-created_at")
        if c.result and c.result.get("methods") and c.state in ("succeeded", "cancelled")
    ]


def plan_diff_data(a: StoredPlan, b: StoredPlan) -> dict:
    return {"a": {**plan_document(a), **_scenario(a)}, "b": {**plan_document(b), **_scenario(b)}}


def search_durations_s() -> list[float]:
    """Seconds from start to end of every succeeded search, of every team (the operators' ``/metrics``)."""
    rows = StrategySearch.objects.filter(
        state=JobState.SUCCEEDED, started_at__isnull=False, finished_at__isnull=False
    ).values_list("started_at", "finished_at")
    return [max(0.0, (end - start).total_seconds()) for start, end in rows]


# --- the model knowledge base (/models/) ----------------------------------------------------------------
def models_of(user) -> QuerySet[StoredModelSpec]:
    return scoped(StoredModelSpec.objects.all(), user).select_related("team")


def model_of(user, pk: int) -> StoredModelSpec | None:
    """The model when it belongs to one of the user's teams; None for another team's or none."""
    return models_of(user).filter(pk=pk).first()


def model_page_data(model: StoredModelSpec) -> dict:
    """What a model's page shows: its architecture, parameters by part and FLOPs per token
    (``workers.planner.model_summary``), the plans and searches on it (each plan keeps the document it was
    planned on: ``planned_on_earlier`` when the model changed since) and the jobs run from those plans."""
    from controlplane.clusters.selectors import plans_and_jobs
    from workers.planner.model_summary import model_figures

    usage = {"model": model, **plans_and_jobs(model, "model_doc")}
    try:
        spec = planner.ModelSpec.from_dict(model.spec)
    except planner.SpecError as exc:
        return {**usage, "error": str(exc)}
    return {**usage, "spec": spec, "figures": model_figures(spec)}


def plan_filter_choices(user) -> dict:
    """What the plan list filters by: the team's clusters and models (id, name), the devices and sources its
    plans have."""
    plans = plans_of(user)
    return {
        "clusters": list(scoped(Cluster.objects.all(), user).values_list("pk", "name")),
        "models": list(models_of(user).values_list("pk", "name")),
        "devices": sorted(set(plans.exclude(device_name="").values_list("device_name", flat=True))),
        "sources": [s for s, _label in StoredPlan.Source.choices],
    }


def active_search_streams() -> list[str]:
    """The streams of searches not ended, every team's (the relay keeps their counters through a Redis loss)."""
    ids = StrategySearch.objects.exclude(state__in=StrategySearch.TERMINAL_STATES).values_list(
        "pk", flat=True
    )
    return [f"{StrategySearch.STREAM_KIND}/{pk}" for pk in ids]
