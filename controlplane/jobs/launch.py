"""Fan a job attempt out to its nodes."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from controlplane.common.models import JobState
from controlplane.jobs import services
from controlplane.jobs.models import JobNode, TrainingJob

log = logging.getLogger(__name__)

NODE_QUEUE_PREFIX = "node."


def online_node_queues(timeout: float = 1.5) -> list[str]:
    """The ``node.<name>`` queues that live Celery workers consume, one per node, sorted."""
    from workers.celery import app

    replies = app.control.inspect(timeout=timeout).active_queues() or {}
    names = {
        q["name"] for queues in replies.values() for q in queues if q["name"].startswith(NODE_QUEUE_PREFIX)
    }
    return sorted(names)


def fan_out(job_id: int, attempt: int) -> str:
    from workers.tasks.training import run_node

    job = TrainingJob.objects.get(pk=job_id)
    if job.attempts != attempt or job.state != JobState.QUEUED:
        return "skipped"
    if job.nnodes == 1:
        queues = ["training"]
    else:
        online = online_node_queues()
        if len(online) < job.nnodes:
            services.job_fail(
                job_id=job.pk,
                human=(
                    f"This job needs {job.nnodes} nodes but {len(online)} node worker(s) are online "
                    f"({', '.join(online) or 'none'}). Start a worker per node with "
                    "CANN_TRAIN_NODE=<name> celery -A workers.celery worker -Q training,node.<name>, then relaunch."
                ),
            )
            return "failed"
        queues = online[: job.nnodes]
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.QUEUED:  # cancelled meanwhile
            return "skipped"
        job.state = JobState.LAUNCHING
        job.heartbeat_at = timezone.now()
        job.save()
        for rank in range(job.nnodes):
            JobNode.objects.create(
                job=job,
                attempt=attempt,
                node_rank=rank,
                node_name=queues[rank].removeprefix(NODE_QUEUE_PREFIX) if job.nnodes > 1 else "",
            )
        services.publish_after_commit(job, {"state": "launching", "attempt": attempt, "nodes": queues})
        for rank, queue in enumerate(queues):
            transaction.on_commit(lambda r=rank, q=queue: run_node.apply_async((job_id, attempt, r), queue=q))
    return f"launched on {', '.join(queues)}"
