"""Server-rendered pages of the shell: dashboard and API tokens."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from controlplane.accounts.models import ApiToken
from controlplane.accounts.selectors import scoped, teams_of
from controlplane.accounts.services import token_issue, token_revoke
from controlplane.clusters.models import Cluster
from controlplane.jobs.models import TrainingJob
from controlplane.planning.models import ModelSpec, StrategySearch


@login_required
def dashboard(request):
    jobs = scoped(TrainingJob.objects.all(), request.user).select_related("team")[:20]
    searches = scoped(StrategySearch.objects.all(), request.user).select_related("team")[:20]
    context = {
        "jobs": jobs,
        "searches": searches,
        "teams": teams_of(request.user),
        "clusters": scoped(Cluster.objects.all(), request.user),
        "models": scoped(ModelSpec.objects.all(), request.user),
    }
    return render(request, "dashboard.html", context)


@login_required
def tokens(request):
    if request.method == "POST":
        name = request.POST.get("name", "").strip()
        if not name or len(name) > 100:
            messages.error(request, "Give the token a name of 1 to 100 characters (what it is for).")
        else:
            _token, raw = token_issue(user=request.user, name=name)
            messages.success(request, "Token created. Copy it now: it is not shown again.")
            request.session["new_token"] = raw
        return redirect("tokens")
    new_token = request.session.pop("new_token", None)
    return render(
        request, "tokens.html", {"tokens": ApiToken.objects.filter(user=request.user), "new_token": new_token}
    )


@login_required
@require_POST
def token_revoke_view(request, pk: int):
    token_revoke(token=get_object_or_404(ApiToken, pk=pk, user=request.user))
    messages.success(request, "Token revoked.")
    return redirect("tokens")
