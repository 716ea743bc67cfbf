"""Pages: job list (with a launch form), job detail (live charts), compare."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from controlplane.accounts.selectors import teams_of
from controlplane.common.models import JobState
from controlplane.jobs import selectors
from controlplane.jobs.forms import CompareForm
from controlplane.jobs.slots import slots_of
from workers.planner.plan import predicted_overlap_ratio
from workers.training.comm_methods import COMPARE_METHODS, WEB_DEFAULT_METHODS


@login_required
def job_list(request):
    rows = selectors.job_rows(request.user)
    return render(
        request,
        "jobs/list.html",
        {
            "rows": rows,
            "rows_data": [row.as_dict() for row in rows],
            "limit": selectors.LIST_LIMIT,
            "states": [state.value for state in JobState],
            "teams": list(teams_of(request.user)),
            "examples": selectors.launch_examples(),
            "max_compared": selectors.MAX_COMPARED,
        },
    )


def schedule_slot_labels(job) -> list[str]:
    """The job's carbon-aware slots as 'YYYY-MM-DD HH:MM → HH:MM' (UTC; the end's date when it differs)."""
    if job.green_schedule is None:
        return []
    from datetime import UTC

    labels = []
    for a, b in slots_of(job.green_schedule):
        a, b = a.astimezone(UTC), b.astimezone(UTC)
        labels.append(
            f"{a:%Y-%m-%d %H:%M} → {b:%H:%M}"
            if a.date() == b.date()
            else f"{a:%Y-%m-%d %H:%M} → {b:%Y-%m-%d %H:%M}"
        )
    return labels


@login_required
def job_detail(request, pk: int):
    job = selectors.job_of(request.user, pk)
    if job is None:  # another team's job looks exactly like no job
        raise Http404("No such job among your teams' jobs.")
    history = selectors.job_history(job)
    # the figures the job list shows for it (a stopped job's page shows the same, not its own mean)
    row = selectors.job_rows(request.user, ids=[job.pk])[0]
    return render(
        request,
        "jobs/detail.html",
        {
            "job": job,
            "queue_position": selectors.queue_position(job),
            "strategy": selectors.strategy_short((job.config or {}).get("strategy")),
            "policy": selectors.restart_policy(job),
            "elastic_index": selectors.elastic_index(job),
            "source": selectors.model_source(job),
            "certificate": getattr(job, "certificate", None),
            "schedule_slots": schedule_slot_labels(job),
            # "uncalibrated: run `cann-train calibrate`" when the plan's prediction used the cpu placeholder
            "prediction_caveat": (
                ((job.plan or {}).get("predicted") or {}).get("efficiency_profile") or {}
            ).get("note", ""),
            "page": {
                "id": job.pk,
                "stream": job.stream,
                "state": job.state,
                "finished": job.is_finished,
                "attempts": job.attempts,
                "nnodes": job.nnodes,
                "created_at": job.created_at.isoformat(),
                "plan_predicted": (job.plan or {}).get("predicted") or {},
                "predicted_overlap_ratio": predicted_overlap_ratio((job.plan or {}).get("predicted") or {}),
                "measured": job.measured,
                "figures": {
                    "step_time_s": row.measured_step_time_s,
                    "tokens_per_s": row.tokens_per_s,
                    "final": row.measured_is_final,
                },
                "rows_api": f"/api/jobs/rows/?ids={job.pk}",
                "moe": bool(((job.config or {}).get("model") or {}).get("moe")),
                # a validation split: the loss chart's validation traces have a legend entry
                "validation": bool((job.config or {}).get("val_fraction")),
                "history": history,
                "history_complete": len(history) < selectors.HISTORY_PAGE,
                "api": f"/api/jobs/{job.pk}/",
                # elastic recovery: fault markers, the snapshots table, goodput (live events update them)
                "faults": [selectors.fault_values(f) for f in job.faults.all()],
                "snapshots": selectors.snapshot_rows(job),
                "goodput": job.goodput,
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
def job_eti_panel(request, pk: int):
    """The job page's Elastic Training Index panel alone (the page swaps it in when a goodput event, or the
    job's end, changes what it shows): the same template and selector as the page, so both say the same."""
    job = selectors.job_of(request.user, pk)
    if job is None:
        raise Http404("No such job among your teams' jobs.")
    return render(
        request, "jobs/_eti_panel.html", {"job": job, "elastic_index": selectors.elastic_index(job)}
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
