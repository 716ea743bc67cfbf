"""The pages that read several apps: the dashboard (health, *Plan a run*, the user's teams, jobs and searches,
the live panel) and the Green page (the teams' job energy beside green's schedules and reports)."""

from __future__ import annotations

import os

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse

from controlplane.accounts.selectors import teams_of
from controlplane.dashboard.selectors import dashboard_overview
from controlplane.green import selectors as green_selectors
from controlplane.green.apis import MAX_HOURS, ScheduleRowSerializer
from controlplane.green.certificate_apis import CertificateRowSerializer
from controlplane.green.certificates import certificates_of
from controlplane.green.zones import zone_choices
from controlplane.jobs.selectors import jobs_of
from workers.green.history import SOURCE as HISTORY_SOURCE

LISTED = 50  # the newest schedules on the page (the API lists them all)


@login_required
def dashboard(request):
    return render(request, "dashboard.html", dashboard_overview(request.user))


@login_required
def green_page(request):
    """The Green page: the teams' energy and carbon totals (over their jobs), carbon-aware scheduling (a form
    that posts to /api/green/schedules/, the result charted) and the knowledge base of green schedules; energy
    reports below."""
    default_zone = settings.GREEN_DEFAULT_ZONE
    live = green_selectors.live_intensity_providers(os.environ)
    zones = zone_choices(default_zone=default_zone, live=bool(live["providers"]))
    schedules = list(green_selectors.schedules_of(request.user)[:LISTED])
    reports = CertificateRowSerializer(certificates_of(request.user)[:LISTED], many=True).data
    return render(
        request,
        "green/index.html",
        {
            "energy": green_selectors.team_energy(jobs_of(request.user)),
            "teams": list(teams_of(request.user)),
            "zones": zones,
            "default_zone": default_zone,
            "history_source": HISTORY_SOURCE,
            "live": live,
            "max_hours": MAX_HOURS,
            "schedules": schedules,
            "reports": reports,
            "listed": LISTED,
            "page": {
                "api": reverse("api:green-schedule-list"),
                "schedules": ScheduleRowSerializer(schedules, many=True).data,
            },
        },
    )
