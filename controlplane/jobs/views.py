"""Pages: job list (with a launch form), job detail (live charts), compare."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from controlplane.accounts.selectors import teams_of
from controlplane.jobs import selectors
from controlplane.jobs.forms import CompareForm
from workers.training.comm_methods import COMPARE_METHODS, WEB_DEFAULT_METHODS


@login_required
def job_list(request):
    return render(
        request,
        "jobs/list.html",
        {
            "rows": selectors.job_rows(request.user),
            "teams": list(teams_of(request.user)),
            "examples": selectors.launch_examples(),
            "max_compared": selectors.MAX_COMPARED,
        },
    )


@login_required
def job_detail(request, pk: int):
    job = selectors.job_of(request.user, pk)
    if job is None:  # another team's job looks exactly like no job
        raise Http404("No such job among your teams' jobs.")
    history = selectors.job_history(job)
    return render(
        request,
        "jobs/detail.html",
        {
            "job": job,
            "strategy": selectors.strategy_short((job.config or {}).get("strategy")),
            "page": {
                "id": job.pk,
                "stream": job.stream,
                "state": job.state,
                "finished": job.is_finished,
                "plan_predicted": (job.plan or {}).get("predicted") or {},
                "measured": job.measured,
                "moe": bool(((job.config or {}).get("model") or {}).get("moe")),
                "history": history,
                "history_complete": len(history) < selectors.HISTORY_PAGE,
                "api": f"/api/jobs/{job.pk}/",
            },
            "comm_methods": COMPARE_METHODS,
            "comm_default": WEB_DEFAULT_METHODS,
            "comm_page": {
                "api": f"/api/jobs/{job.pk}/comm-compare/",
                "stream": job.stream,
                "last_seq": history[-1]["seq"] if history else 0,
                "comparisons": selectors.comm_comparisons(job),
            },
        },
    )


@login_required
def job_compare(request):
    form = CompareForm(request.GET or None, user=request.user)
    if not form.is_valid():
        status = 400 if request.GET else 200
        return render(request, "jobs/compare.html", {"form": form}, status=status)
    jobs = form.jobs()
    return render(
        request,
        "jobs/compare.html",
        {"form": form, "jobs": jobs, "series": selectors.compared_series(jobs)},
    )
