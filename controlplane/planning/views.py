"""Pages: the planner (new search, searches, knowledge base), a search's visualizer, a plan, a plan diff.

Views only gather data: the documents the visualizer draws are built here and handed to the template as
one JSON object (``data``, rendered with ``json_script``)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from controlplane.accounts.selectors import scoped, teams_of
from controlplane.clusters.models import Cluster
from controlplane.planning.apis import plan_visuals_or_none
from controlplane.planning.models import ModelSpec, Plan, StrategySearch
from controlplane.planning.seed import seed_knowledge_base
from controlplane.planning.selectors import plan_document


@login_required
def search_list(request):
    user = request.user
    context = {
        "searches": scoped(StrategySearch.objects.all(), user).select_related(
            "team", "cluster", "model_spec"
        )[:100],
        "clusters": scoped(Cluster.objects.all(), user).select_related("team"),
        "models": scoped(ModelSpec.objects.all(), user).select_related("team"),
        "measured_plans": scoped(Plan.objects.filter(measured__isnull=False), user).order_by("-updated_at")[
            :50
        ],
        "teams": teams_of(user),
    }
    return render(request, "planning/searches.html", context)


@login_required
@require_POST
def seed_view(request):
    team = teams_of(request.user).filter(slug=request.POST.get("team", "")).first()
    if team is None:
        messages.error(request, "Pick one of your teams to load the examples into.")
    else:
        counts = seed_knowledge_base(team=team)
        messages.success(
            request, "Loaded " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()) + "."
        )
    return redirect("search-list")


def _documents(plan: Plan) -> dict:
    return {"model": plan.model_doc, "cluster": plan.cluster_doc, "training": plan.training}


@login_required
def search_detail(request, pk: int):
    search = get_object_or_404(scoped(StrategySearch.objects.all(), request.user), pk=pk)
    plans = list(search.plans.order_by("rank", "-predicted__tokens_per_s"))
    best = next((p for p in plans if p.rank == 1), None)
    parent_best = search.parent.best_plan if search.parent_id else None
    req = search.request
    data = {
        "search": {
            "id": search.pk,
            "state": search.state,
            "progress": search.progress,
            "stats": search.stats,
            "human_readable_error": search.human_readable_error,
            "stream": search.stream,
            "what_if": search.what_if,
            "parent_id": search.parent_id,
        },
        "model": req.get("model"),
        "cluster": req.get("cluster"),
        "training": req.get("training"),
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
        "visuals": plan_visuals_or_none(req, best.to_contract()) if best else None,
        "urls": {
            "evaluate": "/api/plans/evaluate/",
            "what_if": f"/api/searches/{search.pk}/what-if/",
            "plan_page": "/planning/plans/{id}/",
            "diff": "/planning/plans/diff/?a={a}&b={b}",
            "launch": "/api/jobs/",
            "cancel": f"/api/searches/{search.pk}/cancel/",
        },
    }
    return render(request, "planning/search_detail.html", {"search": search, "data": data})


@login_required
def plan_detail(request, pk: int):
    plan = get_object_or_404(scoped(Plan.objects.all(), request.user), pk=pk)
    runner_up = None
    if plan.search_id:
        others = plan.search.plans.exclude(pk=plan.pk).filter(rank__isnull=False).order_by("rank")
        runner_up = others.first()
    data = {
        "plan": plan_document(plan),
        **_documents(plan),
        "visuals": plan_visuals_or_none(_documents(plan), plan.to_contract()) if plan.feasible else None,
        "runner_up": plan_document(runner_up) if runner_up else None,
        "jobs": [
            {"id": j.pk, "state": j.state, "measured": j.measured}
            for j in plan.jobs.order_by("-created_at")[:10]
        ],
        "urls": {
            "launch": "/api/jobs/",
            "evaluate": "/api/plans/evaluate/",
            "diff": "/planning/plans/diff/?a={a}&b={b}",
            "job_page": "/jobs/{id}/",
        },
    }
    return render(request, "planning/plan_detail.html", {"plan": plan, "data": data})


@login_required
def plan_diff(request):
    try:
        a_id, b_id = int(request.GET.get("a", "")), int(request.GET.get("b", ""))
    except ValueError:
        return HttpResponseBadRequest("Give two plan ids: /planning/plans/diff/?a=<id>&b=<id>")
    plans = scoped(Plan.objects.all(), request.user)
    a, b = get_object_or_404(plans, pk=a_id), get_object_or_404(plans, pk=b_id)
    data = {"a": {**plan_document(a), **_documents(a)}, "b": {**plan_document(b), **_documents(b)}}
    return render(request, "planning/plan_diff.html", {"a": a, "b": b, "data": data})
