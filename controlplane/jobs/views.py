"""Pages: job list (with a launch form), job detail (live charts), compare; the failure-pattern knowledge base
(list with an incident-list import, one page per pattern)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse

from controlplane.accounts.selectors import teams_of
from controlplane.common.models import JobState
from controlplane.jobs import selectors, services
from controlplane.jobs.forms import CompareForm
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

    from controlplane.jobs.scheduling import slots_of

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


# --- the failure-pattern knowledge base -------------------------------------------------------------------
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def rate_text(rate: float | None) -> str:
    """A small rate as a person reads it: 0.00134 -> ``1.3×10⁻³``."""
    if rate is None:
        return "—"
    if rate == 0:
        return "0"
    mantissa, exponent = f"{rate:.1e}".split("e")
    return f"{mantissa}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def _lead(precursor: dict | None) -> str:
    from workers.reliability.risk.patterns import lead_text

    if not precursor or not precursor["share"] or not precursor["signals"]:
        return ""
    return lead_text(precursor["lead_min_s"], precursor["lead_max_s"])


def _percent(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:.1f}%"


def _pattern_page_values(pattern: dict) -> dict:
    published, precursor, observed = pattern["published"], pattern["precursor"], pattern["observed"]
    return {
        **pattern,
        "share_text": _percent(published["share"] if published else None),
        "rate_text": rate_text(published["rate_per_node_day"] if published else None),
        "precursor_share_text": f"{100 * precursor['share']:.0f}%" if precursor else "—",
        "observed_share_text": _percent(observed["share"] if observed else None),
        "lead": _lead(precursor),
        "more_nodes": observed["node_count"] - len(observed["nodes"]) if observed else 0,
    }


def _pattern_sources() -> dict:
    from workers.reliability.risk.patterns import PRECURSOR_SOURCE
    from workers.reliability.risk.simulator import (
        LLAMA3_RATE_SOURCE,
        LLAMA3_TABLE5_NOTE,
        LLAMA3_TABLE5_SOURCE,
    )

    return {
        "table5": LLAMA3_TABLE5_SOURCE,
        "table5_note": LLAMA3_TABLE5_NOTE,
        "rate": LLAMA3_RATE_SOURCE,
        "precursors": PRECURSOR_SOURCE,
    }


@login_required
def failure_pattern_list(request):
    patterns = [_pattern_page_values(p) for p in selectors.failure_patterns_of(request.user)]
    incidents = selectors.incidents_of(request.user)
    return render(
        request,
        "jobs/failure_patterns.html",
        {
            "patterns": patterns,
            "sources": _pattern_sources(),
            "incident_count": incidents.count(),
            "incident_lists": list(
                incidents.order_by("source").values("source", "team__name").annotate(n=Count("id"))
            ),
            "teams": list(teams_of(request.user)),
            "page": {
                "api": reverse("api:failure-incident-list"),
                "max_chars": services.MAX_INCIDENT_CSV_CHARS,
            },
        },
    )


@login_required
def failure_pattern_detail(request, key: str):
    pattern = selectors.failure_pattern_of(request.user, key)
    if pattern is None:
        raise Http404(
            f"No failure pattern {key!r}: neither a published kind nor a kind your teams' incidents name."
        )
    if pattern["key"] != key:  # a kind as written (GPU HBM3 Memory): the pattern's own address
        return redirect("failure-pattern-detail", key=pattern["key"])
    return render(
        request,
        "jobs/failure_pattern_detail.html",
        {
            "pattern": _pattern_page_values(pattern),
            "sources": _pattern_sources(),
            "incidents": selectors.pattern_incidents(request.user, pattern),
        },
    )
