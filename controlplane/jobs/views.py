"""Pages: job list and job detail."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.accounts.selectors import scoped
from controlplane.jobs.models import TrainingJob


@login_required
def job_list(request):
    jobs = scoped(TrainingJob.objects.all(), request.user).select_related("team")[:200]
    return render(request, "jobs/list.html", {"jobs": jobs})
