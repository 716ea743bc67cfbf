"""Pages: the planner (new search, searches, knowledge base), a search's visualizer, a plan, a plan diff, and
the model knowledge base (/models/: the list, a model's page, one form to create, edit or copy, delete).

Views only gather and render: every read is a selector (``planning.selectors``), and what the visualizer
draws arrives as one JSON object (``data``, rendered with ``json_script``), except on the search page,
whose HTML carries only its header's and which fetches the rest from ``GET /api/searches/<id>/page-data/``
once it has painted (and again when the search ends)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane.accounts.selectors import teams_of
from controlplane.common.formats import document_download
from controlplane.planning import ports, selectors, services
from controlplane.planning.seed import seed_knowledge_base
from workers.planner.specs.model import ACTIVATIONS


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
    # the header only: the views' data comes from page-data once the page has painted (issue 35)
    return render(request, "planning/search_detail.html", {"data": selectors.search_page_header(search)})


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
            # the Launch form's options (the job API's, from the jobs app above: planning's port)
            "launch_form": ports.launch_form(user=request.user, plan=plan),
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


# --- the model knowledge base: /models/ ---------------------------------------------------------------
def _model_or_404(user, pk: int):
    model = selectors.model_of(user, pk)
    if model is None:  # another team's model looks exactly like no model
        raise Http404("No such model among your teams' models.")
    return model


@login_required
def model_list(request):
    from workers.planner import ModelSpec, SpecError
    from workers.planner.model_summary import model_figures

    rows = []
    for model in selectors.models_of(request.user):
        try:
            figures = model_figures(ModelSpec.from_dict(model.spec))
        except SpecError:
            figures = None
        rows.append({"model": model, "figures": figures})
    return render(request, "planning/model_list.html", {"rows": rows})


@login_required
def model_detail(request, pk: int):
    return render(
        request, "planning/model_detail.html", selectors.model_page_data(_model_or_404(request.user, pk))
    )


MODEL_FIELDS = [
    ("num_layers", "Layers"),
    ("hidden_size", "Hidden size"),
    ("num_attention_heads", "Attention heads"),
    ("num_kv_heads", "Key/value heads"),
    ("ffn_hidden_size", "FFN hidden size"),
    ("vocab_size", "Vocabulary"),
    ("seq_length", "Sequence length"),
]
MOE_FIELDS = [
    ("moe.num_experts", "Experts"),
    ("moe.top_k", "Experts per token (top-k)"),
    ("moe.expert_ffn_hidden_size", "Expert FFN hidden size"),
    ("moe.num_shared_experts", "Shared experts"),
    ("moe.first_dense_layers", "Leading dense layers"),
    ("moe.layer_frequency", "Every n-th layer MoE"),
    ("moe.capacity_factor", "Capacity factor (empty: dropless)"),
]


def _model_form(request, *, document: dict, model=None, copy_of=None):
    return render(
        request,
        "planning/model_form.html",
        {
            "model": model,
            "copy_of": copy_of,
            "fields": MODEL_FIELDS,
            "moe_fields": MOE_FIELDS,
            "activations": ACTIVATIONS,
            "form_data": {
                "document": document,
                "id": model.pk if model else None,
                "teams": [{"slug": t.slug, "name": t.name} for t in teams_of(request.user)],
            },
        },
    )


@login_required
def model_new(request):
    return _model_form(request, document={})


@login_required
def model_edit(request, pk: int):
    model = _model_or_404(request.user, pk)
    return _model_form(request, document=model.spec, model=model)


@login_required
def model_copy(request, pk: int):
    model = _model_or_404(request.user, pk)
    return _model_form(request, document={**model.spec, "name": model.copy_name()}, copy_of=model)


@login_required
@require_POST
def model_delete(request, pk: int):
    model = _model_or_404(request.user, pk)
    if request.POST.get("confirm") != "1":
        messages.error(request, "Tick “I mean it” to delete the model.")
        return redirect("model-detail", pk=pk)
    name, used = model.name, services.model_delete(model)
    kept = f" {used} plan(s) planned on it keep the document they were planned on." if used else ""
    messages.success(request, f"Deleted model {name}.{kept}")
    return redirect("model-list")


@login_required
def model_document(request, pk: str, fmt: str):
    """The model.json document (or YAML), as a download."""
    return document_download(_model_or_404(request.user, int(pk)).spec, f"model-{pk}", fmt)


@login_required
def plan_list(request):
    """Every plan of the user's teams (searched, imported, measured), newest first, filtered by cluster,
    model, device and source; 50 a page."""
    from django.core.paginator import Paginator

    filters, problems = {}, []
    for key in ("cluster", "model", "search"):
        if value := request.GET.get(key, "").strip():
            if value.isdigit() and len(value) <= 18:
                filters[key] = value
            else:
                problems.append(f"{key} must be an id (a whole number); {value[:40]!r} was left out")
    for key in ("device", "source"):
        if value := request.GET.get(key, "").strip():
            filters[key] = value[:100]
    plans = (
        selectors.plans_of(request.user, filters)
        .select_related("cluster", "model_spec")
        .order_by("-created_at", "rank")
    )
    page = Paginator(plans, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "planning/plan_list.html",
        {
            "page": page,
            "filters": filters,
            "problems": problems,
            **selectors.plan_filter_choices(request.user),
        },
    )
