"""Pages of the cluster knowledge base: the list, one page per cluster (its totals, its topology drawn, its
device's figures with their sources, the plans and jobs that used it), a form to create, edit or copy one
(live validation by the planner through ``POST /api/clusters/validate/``) and delete.

Editing a cluster never changes a plan: each plan keeps the cluster document it was planned on
(``StoredPlan.cluster_doc``, a copy taken when it was planned), and its page re-evaluates from that copy;
the cluster page marks the plans planned on an earlier version of it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane.accounts.selectors import teams_of
from controlplane.clusters import selectors, services
from controlplane.clusters.models import HardwareProfile
from controlplane.common.formats import document_download


def _cluster_or_404(user, pk: int):
    cluster = selectors.cluster_of(user, pk)
    if cluster is None:  # another team's cluster looks exactly like no cluster
        raise Http404("No such cluster among your teams' clusters.")
    return cluster


@login_required
def cluster_list(request):
    from workers.planner import ClusterSpec, SpecError
    from workers.planner.topology import cluster_figures

    rows = []
    for cluster in selectors.clusters_of(request.user):
        try:
            figures = cluster_figures(ClusterSpec.from_dict(cluster.spec))
        except SpecError:
            figures = None
        rows.append({"cluster": cluster, "figures": figures})
    return render(request, "clusters/cluster_list.html", {"rows": rows})


@login_required
def cluster_detail(request, pk: int):
    return render(
        request,
        "clusters/cluster_detail.html",
        selectors.cluster_page_data(_cluster_or_404(request.user, pk)),
    )


def _form(request, *, document: dict, cluster=None, copy_of=None):
    from workers.planner.examples import this_machine_cluster

    profiles = HardwareProfile.objects.filter(team__in=teams_of(request.user)).order_by("name")
    machine, origin = this_machine_cluster()
    return render(
        request,
        "clusters/cluster_form.html",
        {
            "cluster": cluster,
            "copy_of": copy_of,
            "links": [("intra_node", "Inside a node"), ("inter_node", "Between nodes")],
            "form_data": {
                "document": document,
                "id": cluster.pk if cluster else None,
                "teams": [{"slug": t.slug, "name": t.name} for t in teams_of(request.user)],
                "profiles": [{"name": p.name, "spec": p.spec} for p in profiles],
                "this_machine": {"document": machine, "origin": origin},
            },
        },
    )


@login_required
def cluster_new(request):
    return _form(request, document={})


@login_required
def cluster_edit(request, pk: int):
    cluster = _cluster_or_404(request.user, pk)
    return _form(request, document=cluster.spec, cluster=cluster)


@login_required
def cluster_copy(request, pk: int):
    cluster = _cluster_or_404(request.user, pk)
    return _form(request, document={**cluster.spec, "name": cluster.copy_name()}, copy_of=cluster)


@login_required
@require_POST
def cluster_delete(request, pk: int):
    cluster = _cluster_or_404(request.user, pk)
    if request.POST.get("confirm") != "1":
        messages.error(request, "Tick “I mean it” to delete the cluster.")
        return redirect("cluster-detail", pk=pk)
    name = cluster.name
    used = services.delete_cluster(cluster)
    kept = f" {used} plan(s) planned on it keep the document they were planned on." if used else ""
    messages.success(request, f"Deleted cluster {name}.{kept}")
    return redirect("cluster-list")


@login_required
def cluster_document(request, pk: str, fmt: str):
    """The cluster.json document (or YAML), as a download."""
    return document_download(_cluster_or_404(request.user, int(pk)).spec, f"cluster-{pk}", fmt)


# --- hardware profiles: /hardware/ --------------------------------------------------------------------
def _profile_or_404(user, pk: int):
    profile = selectors.profile_of(user, pk)
    if profile is None:
        raise Http404("No such hardware profile among your teams' profiles.")
    return profile


@login_required
def hardware_list(request):
    profiles = list(selectors.profiles_of(request.user))
    return render(
        request, "clusters/hardware_list.html", {"rows": [(p, selectors.profile_rows(p)) for p in profiles]}
    )


@login_required
def hardware_detail(request, pk: int):
    profile = _profile_or_404(request.user, pk)
    others = selectors.profiles_of(request.user).exclude(pk=pk)
    return render(
        request, "clusters/hardware_detail.html", {**selectors.profile_page_data(profile), "others": others}
    )


@login_required
def hardware_compare(request):
    try:
        a_id, b_id = int(request.GET.get("a", "")), int(request.GET.get("b", ""))
    except ValueError:
        return HttpResponseBadRequest("Give two profile ids: /hardware/compare/?a=<id>&b=<id>")
    a, b = _profile_or_404(request.user, a_id), _profile_or_404(request.user, b_id)
    return render(
        request,
        "clusters/hardware_compare.html",
        {"a": a, "b": b, "rows": selectors.profile_comparison(a, b)},
    )
