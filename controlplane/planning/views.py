"""Pages: the planner (new search, searches, knowledge base), a search's visualizer, a plan, a plan diff.

Views only gather and render: every read is a selector (``planning.selectors``), and what the visualizer
draws arrives as one JSON object (``data``, rendered with ``json_script``). The search page refreshes
that object from ``GET /api/searches/<id>/page-data/``, built by the same selector."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane.accounts.selectors import teams_of
from controlplane.planning import selectors
from controlplane.planning.seed import seed_knowledge_base


@login_required
def search_list(request):
    return render(request, "planning/searches.html", selectors.planner_overview(request.user))


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


@login_required
def search_detail(request, pk: int):
    search = selectors.search_of(request.user, pk)
    if search is None:  # another team's search looks exactly like no search
        raise Http404("No such search among your teams' searches.")
    return render(request, "planning/search_detail.html", {"data": selectors.search_page_data(search)})


@login_required
def plan_detail(request, pk: int):
    plan = selectors.plan_of(request.user, pk)
    if plan is None:
        raise Http404("No such plan among your teams' plans.")
    return render(
        request,
        "planning/plan_detail.html",
        {
            "data": selectors.plan_page_data(plan),
            "comm_comparisons": selectors.plan_comm_comparisons(plan),
        },
    )


@login_required
def plan_diff(request):
    try:
        a_id, b_id = int(request.GET.get("a", "")), int(request.GET.get("b", ""))
    except ValueError:
        return HttpResponseBadRequest("Give two plan ids: /planning/plans/diff/?a=<id>&b=<id>")
    a, b = selectors.plan_of(request.user, a_id), selectors.plan_of(request.user, b_id)
    if a is None or b is None:
        raise Http404("No such plan among your teams' plans.")
    return render(request, "planning/plan_diff.html", {"data": selectors.plan_diff_data(a, b)})
