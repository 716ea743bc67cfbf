"""Services of communication comparisons: train a job's model once per gradient-communication method on
the emulated two-tier network and keep the result.

Creating a comparison validates the request and queues a ``training`` task; the task trains the model
once per method with the real runtime (``workers.training.comm.compare.compare_methods``). On the job's
stream (kind ``progress``, values ``{"comm_compare": {...}}``, so the job's own timeline stays the job's)
it reports which method runs, its step k of n and the ETA (at most once a second), each method's row as
it finishes, and the end. Cancel stops the running method's processes and tears the network down; the
rows measured before are kept. The result carries the engine's recommendation (``compare.recommend``), stored
with the job and, when the job came from a stored plan, with that plan."""

from __future__ import annotations

import logging
import time
import traceback
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from controlplane.common.api import TooMuchQueuedWork
from controlplane.common.models import JobState
from controlplane.jobs.models import CommComparison, TrainingJob
from controlplane.jobs.tasks import compare_comm
from controlplane.live.services import enqueue_after_commit, note_deferred, publish, publish_after_commit
from workers.training.comm_methods import COMPARE_METHODS

log = logging.getLogger(__name__)

# CPU ranks this machine gives one comparison (nodes x ranks_per_node), like a job's CPU-rank cap
MAX_COMPARE_RANKS = 4
# at most this often a step-progress event (a method's start and last step always)
PROGRESS_EVERY_S = 1.0
# how often the running task looks at the cancel flag
CANCEL_POLL_S = 1.0


def comparison_create(
    *,
    job: TrainingJob,
    methods: list[str],
    steps: int,
    nodes: int,
    ranks_per_node: int,
    inter_node_gbit: float,
    created_by=None,
) -> CommComparison:
    from workers.training.comm import netem

    active = CommComparison.objects.filter(
        team_id=job.team_id, state__in=(JobState.QUEUED, JobState.RUNNING)
    ).count()
    if active >= MAX_ACTIVE_COMPARISONS_PER_TEAM:
        raise TooMuchQueuedWork(
            f"Your team has {active} communication comparisons queued or running, the most one team may have "
            f"at once ({MAX_ACTIVE_COMPARISONS_PER_TEAM}): each takes the worker's cores for minutes. Wait for "
            "one to finish, or cancel one."
        )

    unknown = [m for m in methods if m not in COMPARE_METHODS]
    if unknown or not methods:
        raise ValidationError(
            {"methods": [f"choose from {', '.join(COMPARE_METHODS)}; got {', '.join(unknown) or 'none'}"]}
        )
    if nodes * ranks_per_node > MAX_COMPARE_RANKS:
        raise ValidationError(
            {"ranks_per_node": [f"nodes × ranks_per_node may be at most {MAX_COMPARE_RANKS} here"]}
        )
    if reason := netem.unavailable_reason():
        raise ValidationError(
            {"non_field_errors": [f"The emulated network cannot be built on this worker: {reason}."]}
        )
    with transaction.atomic():
        comparison = CommComparison.objects.create(
            team=job.team,
            job=job,
            plan=job.source_plan,
            created_by=created_by,
            request={
                "methods": methods,
                "steps": steps,
                "nodes": nodes,
                "ranks_per_node": ranks_per_node,
                "inter_node_gbit": inter_node_gbit,
            },
        )
        enqueue_after_commit(
            compare_comm, (comparison.pk,), queue="training", on_deferred=note_deferred(comparison)
        )
    return comparison


def comparison_cancel(*, comparison: CommComparison, user=None) -> CommComparison:
    """Ask a comparison to stop: a queued one ends at once; a running one stops its method's processes
    within a second or two (the task polls the flag) and keeps the rows measured before."""
    who = f" by {user.get_username()}" if user is not None else ""
    with transaction.atomic():
        comparison = CommComparison.objects.select_for_update().get(pk=comparison.pk)
        if comparison.is_finished:
            raise ValidationError({"state": [f"the comparison already ended ({comparison.state})"]})
        comparison.cancel_requested = True
        comparison.human_readable_error = f"Cancelled{who}."
        if comparison.state == JobState.QUEUED:
            comparison.state = JobState.CANCELLED
            comparison.finished_at = timezone.now()
            values = {"id": comparison.pk, "state": "cancelled", "message": comparison.human_readable_error}
            publish_after_commit(comparison.stream, "progress", {"comm_compare": values})
        comparison.save()
    return comparison


def _event(comparison: CommComparison, values: dict) -> None:
    publish(comparison.stream, "progress", {"comm_compare": {"id": comparison.pk, **values}})


# comparisons one team may have queued or running (each trains the model once per method, for minutes)
MAX_ACTIVE_COMPARISONS_PER_TEAM = 2
# a running comparison touches its row every CANCEL_POLL_S; one silent this long lost its worker
COMPARISON_HEARTBEAT_TIMEOUT_S = 60.0


def reap_stalled_comparisons(*, now=None) -> list[int]:
    """Fail the comparisons whose worker died mid-run (the relay calls this every few seconds): the rows
    measured so far stay, and the message says to start it again. Returns their ids."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=COMPARISON_HEARTBEAT_TIMEOUT_S)
    failed = []
    for comparison in CommComparison.objects.filter(state=JobState.RUNNING, updated_at__lt=stale):
        done = CommComparison.objects.filter(
            pk=comparison.pk, state=JobState.RUNNING, updated_at__lt=stale
        ).update(
            state=JobState.FAILED,
            finished_at=now,
            human_readable_error=(
                "The worker running this comparison stopped answering; the methods measured before are kept. "
                "Start the comparison again."
            ),
        )
        if done:
            _event(comparison, {"state": "failed", "message": "its worker stopped answering"})
            failed.append(comparison.pk)
    return failed


def comparison_run(*, comparison_id: int) -> str:
    from workers.training.comm.compare import ComparisonCancelled, compare_methods

    comparison = CommComparison.objects.select_related("job").get(pk=comparison_id)
    if comparison.state != JobState.QUEUED:
        return "skipped"
    comparison.state = JobState.RUNNING
    comparison.started_at = timezone.now()
    comparison.save(update_fields=["state", "started_at", "updated_at"])
    req = comparison.request
    _event(comparison, {"state": "running", "methods": req["methods"], "steps": req["steps"]})
    rows: dict[str, dict] = {}
    last = {"t": 0.0, "poll": 0.0, "stop": False}

    def progress(method: str, row: dict) -> None:
        rows[method] = row
        # the rows so far are kept at once: a page opened meanwhile (or a cancel) shows them
        CommComparison.objects.filter(pk=comparison.pk).update(result={"methods": rows, "partial": True})
        _event(comparison, {"method": method, "row": row})

    def step_progress(state: dict) -> None:
        now = time.monotonic()
        edge = state["step"] in (0, state["steps"])
        if not edge and now - last["t"] < PROGRESS_EVERY_S:
            return
        last["t"] = now
        CommComparison.objects.filter(pk=comparison.pk).update(progress=state["fraction"])
        _event(comparison, {"state": "running", "progress": state})

    def should_stop() -> bool:
        now = time.monotonic()
        if now - last["poll"] >= CANCEL_POLL_S:
            last["poll"] = now
            last["stop"] = CommComparison.objects.filter(pk=comparison.pk, cancel_requested=True).exists()
            # updated_at is the comparison's heartbeat (reap_stalled_comparisons)
            CommComparison.objects.filter(pk=comparison.pk).update(updated_at=timezone.now())
        return last["stop"]

    try:
        result = compare_methods(
            comparison.job.config["model"],
            nodes=req["nodes"],
            ranks_per_node=req["ranks_per_node"],
            inter_node_gbit=req["inter_node_gbit"],
            methods=tuple(req["methods"]),
            steps=req["steps"],
            progress=progress,
            step_progress=step_progress,
            should_stop=should_stop,
        ).to_dict()
    except ComparisonCancelled as exc:
        partial = exc.partial.to_dict() if exc.partial is not None else {"methods": rows}
        who = CommComparison.objects.get(pk=comparison.pk).human_readable_error or "Cancelled."
        done = ", ".join(partial["methods"]) or "none"
        message = (
            f"{who.rstrip('.')} while {exc.method} ran: its processes were stopped and the emulated network "
            f"removed. Methods measured before: {done}."
        )
        CommComparison.objects.filter(pk=comparison.pk).update(
            state=JobState.CANCELLED,
            finished_at=timezone.now(),
            result=partial if partial["methods"] else None,
            human_readable_error=message,
        )
        _event(comparison, {"state": "cancelled", "message": message, "result": partial})
        return "cancelled"
    except Exception as exc:  # noqa: BLE001 - kept for the user, never lost
        log.exception("comm comparison %s failed", comparison_id)
        CommComparison.objects.filter(pk=comparison.pk).update(
            state=JobState.FAILED,
            finished_at=timezone.now(),
            error=traceback.format_exc()[-4000:],
            human_readable_error=f"The comparison failed: {type(exc).__name__}: {str(exc)[:500]}",
        )
        _event(comparison, {"state": "failed", "message": str(exc)[:500]})
        return "failed"
    CommComparison.objects.filter(pk=comparison.pk).update(
        state=JobState.SUCCEEDED, finished_at=timezone.now(), progress=1.0, result=result
    )
    _event(comparison, {"state": "succeeded", "result": result})
    return "succeeded"
