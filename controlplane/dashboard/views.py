"""The dashboard page: health, *Plan a run*, the user's teams, jobs and searches, and the live panel."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.dashboard.selectors import dashboard_overview


@login_required
def dashboard(request):
    return render(request, "dashboard.html", dashboard_overview(request.user))
