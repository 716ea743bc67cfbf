"""Training tasks: load by id, call the service (``controlplane.jobs``).

``launch_job`` runs on the ``training`` queue and fans out one ``run_node`` per node: to any training
worker for a one-node job, or to the node queues (``node.<name>``, one per host's worker) for a
multi-node one. The short ones are ``acks_late`` + ``reject_on_worker_lost``: a worker that dies does not
drop the message silently, and a repeated delivery is recognised and skipped (the job row says what
happened); ``run_node`` is acknowledged when it starts (see there).
The services enqueue these after their commit, so they import this module; each task imports its service
when it runs (HackSoft's styleguide does the same), the one exception to the jobs app's floors
(``.importlinter``: the tasks sit on the floor, their bodies call up).
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready

log = logging.getLogger(__name__)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def launch_job(job_id: int, attempt: int) -> str:
    from controlplane.jobs.services.lifecycle import job_fan_out

    return job_fan_out(job_id=job_id, attempt=attempt)


# Acknowledged when it starts, not when it ends: it runs as long as the training does (hours), and a
# message left unacknowledged that long is redelivered by the Redis transport after its visibility timeout
# and, on a broker outage, makes kombu's restore of unacked messages crash the worker. From its start on,
# the job's own rows (node state, heartbeats) and the reaper keep track of it.
@shared_task(acks_late=False)
def run_node(job_id: int, attempt: int, node_rank: int) -> str:
    from controlplane.jobs.services.node_run import node_run

    return node_run(job_id=job_id, attempt=attempt, node_rank=node_rank)


# Acknowledged when it starts, like run_node: a comparison runs for minutes; its row's heartbeat and the
# relay's reap_stalled_comparisons settle one whose worker died.
@shared_task(acks_late=False)
def compare_comm(comparison_id: int) -> str:
    from controlplane.jobs.comparisons import comparison_run

    return comparison_run(comparison_id=comparison_id)


@worker_ready.connect
def offer_this_node(sender=None, **kwargs) -> None:
    """A node worker (``-Q ...,node.<name>``) that comes online offers itself to the elastic jobs running on
    fewer nodes than their ``max_nodes`` (grow back: ``grow_elastic_jobs``)."""
    from workers.training.supervision.supervisor import node_name

    queue = f"node.{node_name()}"
    if sender is None or queue not in sender.app.amqp.queues.consume_from:
        return
    try:
        from controlplane.jobs.services.recovery import grow_elastic_jobs

        grown = grow_elastic_jobs(node_queues=[queue])
    except Exception:  # noqa: BLE001 - the worker serves its queue all the same
        log.warning("%s: could not offer this node to elastic jobs", queue, exc_info=True)
        return
    if grown:
        log.info("%s joins the running elastic job(s) %s", queue, grown)
