"""Training tasks: load by id, call the service (``controlplane.jobs``).

``launch_job`` runs on the ``training`` queue and fans out one ``run_node`` per node: to any training
worker for a one-node job, or to the node queues (``node.<name>``, one per host's worker) for a
multi-node one. All are ``acks_late`` + ``reject_on_worker_lost``: a worker that dies does not drop the
message silently, and a repeated delivery is recognised and skipped (the job row says what happened).
The services enqueue these after their commit; each task imports its service when it runs, so the
modules do not import each other at import time.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=True, reject_on_worker_lost=True)
def launch_job(job_id: int, attempt: int) -> str:
    from controlplane.jobs.services import job_fan_out

    return job_fan_out(job_id=job_id, attempt=attempt)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def run_node(job_id: int, attempt: int, node_rank: int) -> str:
    from controlplane.jobs.services import node_run

    return node_run(job_id=job_id, attempt=attempt, node_rank=node_rank)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def compare_comm(comparison_id: int) -> str:
    from controlplane.jobs.comparisons import comparison_run

    return comparison_run(comparison_id=comparison_id)
