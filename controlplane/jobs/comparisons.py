"""Services of communication comparisons: train a job's model once per gradient-communication method on
the emulated two-tier network and keep the result.

Creating a comparison validates the request and queues a ``training`` task; the task trains the model
once per method with the real runtime (``workers.training.comm.compare.compare_methods``) and streams each
method's row on the job's stream as it finishes. The result is stored with the job and, when the job
came from a stored plan, with that plan."""

from __future__ import annotations

import logging
import traceback

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from controlplane.common.models import JobState
from controlplane.jobs.models import CommComparison, TrainingJob
from controlplane.jobs.tasks import compare_comm
from controlplane.live.services import publish
from workers.training.comm_methods import COMPARE_METHODS

log = logging.getLogger(__name__)

# CPU ranks this machine gives one comparison (nodes x ranks_per_node), like a job's CPU-rank cap
MAX_COMPARE_RANKS = 4


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
        transaction.on_commit(lambda: compare_comm.apply_async((comparison.pk,), queue="training"))
    return comparison


def _event(comparison: CommComparison, values: dict) -> None:
    publish(comparison.stream, "event", {"comm_compare": {"id": comparison.pk, **values}})


def comparison_run(*, comparison_id: int) -> str:
    from workers.training.comm.compare import compare_methods

    comparison = CommComparison.objects.select_related("job").get(pk=comparison_id)
    if comparison.state != JobState.QUEUED:
        return "skipped"
    comparison.state = JobState.RUNNING
    comparison.started_at = timezone.now()
    comparison.save(update_fields=["state", "started_at", "updated_at"])
    _event(comparison, {"state": "running", "methods": comparison.request["methods"]})
    req = comparison.request
    done: list[str] = []

    def progress(method: str, row: dict) -> None:
        done.append(method)
        CommComparison.objects.filter(pk=comparison.pk).update(progress=len(done) / len(req["methods"]))
        _event(comparison, {"method": method, "row": row})

    try:
        result = compare_methods(
            comparison.job.config["model"],
            nodes=req["nodes"],
            ranks_per_node=req["ranks_per_node"],
            inter_node_gbit=req["inter_node_gbit"],
            methods=tuple(req["methods"]),
            steps=req["steps"],
            progress=progress,
        ).to_dict()
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
