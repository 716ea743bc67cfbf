"""Pages of accounts: the user's API tokens (create, copy once, revoke)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane.accounts.selectors import token_of, tokens_of
from controlplane.accounts.services import token_issue, token_revoke


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
    return render(request, "tokens.html", {"tokens": tokens_of(request.user), "new_token": new_token})


@login_required
@require_POST
def token_revoke_view(request, pk: int):
    token = token_of(request.user, pk)
    if token is None:
        raise Http404("No such token among yours.")
    token_revoke(token=token)
    messages.success(request, "Token revoked.")
    return redirect("tokens")
