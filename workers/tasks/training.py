"""Training tasks: thin wrappers around ``controlplane.jobs`` (load by id, call the service).

``launch_job`` runs on the ``training`` queue and fans out one ``run_node`` per node: to any training
worker for a one-node job, or to the node queues (``node.<name>``, one per host's worker) for a
multi-node one. Both are ``acks_late`` + ``reject_on_worker_lost``: a worker that dies does not drop the
message silently, and a repeated delivery is recognised and skipped (the job row says what happened).
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.tasks.training.launch_job", acks_late=True, reject_on_worker_lost=True)
def launch_job(job_id: int, attempt: int) -> str:
    from controlplane.jobs.launch import fan_out

    return fan_out(job_id, attempt)


@shared_task(name="workers.tasks.training.run_node", acks_late=True, reject_on_worker_lost=True)
def run_node(job_id: int, attempt: int, node_rank: int) -> str:
    from controlplane.jobs.supervisor import run_node as supervise

    return supervise(job_id, attempt, node_rank)


@shared_task(name="workers.tasks.training.compare_comm", acks_late=True, reject_on_worker_lost=True)
def compare_comm(comparison_id: int) -> str:
    from controlplane.jobs.comm import comparison_run

    return comparison_run(comparison_id)
