"""Pages: searches, plans and the strategy visualizer."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.accounts.selectors import scoped
from controlplane.planning.models import StrategySearch


@login_required
def search_list(request):
    searches = scoped(StrategySearch.objects.all(), request.user).select_related("team")[:200]
    return render(request, "planning/searches.html", {"searches": searches})
