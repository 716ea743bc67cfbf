"""Automatic recovery beyond a node's own torchrun restarts: the resume of a job whose Celery worker was lost
(the reaper), an elastic job's node range (a node lost for good or drained for its risk, a node worker that
comes back and joins the running attempt), and restoring a job from a snapshot of its choice. What the
engine reports is kept by ``faults``; this module launches (``lifecycle``) and settles nodes (``nodes``)."""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F
from django.utils import timezone
from rest_framework.exceptions import APIException, ValidationError

from controlplane.common.models import JobState
from controlplane.jobs.models import FaultKind, JobNode, TrainingJob
from controlplane.jobs.selectors import (
    NODE_QUEUE_PREFIX,
    fault_values,
    online_node_queues,
    restarts_left,
    snapshot_rows,
)
from controlplane.jobs.services.events import job_event
from controlplane.jobs.services.faults import MESSAGE_CHARS, fault_at_last_step, record_node_lost
from controlplane.jobs.services.lifecycle import job_launch
from controlplane.jobs.services.nodes import HEARTBEAT_TIMEOUT, node_alive, settle_attempt
from controlplane.jobs.services.outcomes import job_fail
from controlplane.jobs.tasks import run_node
from controlplane.live.services import enqueue_after_commit
from workers.training.config import JobConfig

log = logging.getLogger(__name__)


class JobStillActive(APIException):
    status_code = 409
    default_code = "job_still_active"


def resume_after_worker_lost(*, job_id: int, cause: str) -> str:
    """The reaper found the job's supervising worker dead. A job that snapshots and has restarts left
    records a ``worker-lost`` fault and is queued again, resuming from its newest good snapshot: returns
    "". Otherwise returns why it was not resumed (the caller fails it, saying so)."""

    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.state not in TrainingJob.ACTIVE_STATES:
            return f"it is {job.state}"
        if not job.snapshots_enabled:
            return (
                "it takes no snapshots (snapshot_every is 0), so it would start again from step 0. "
                "Relaunch to run it again."
            )
        left = restarts_left(job)
        if left <= 0:
            return (
                f"it has used its {job.max_restarts} automatic recoveries (max_restarts). Relaunch it to "
                "resume from its newest good snapshot."
            )
        now = timezone.now()
        fault = fault_at_last_step(
            job, attempt=job.attempts, kind=FaultKind.WORKER_LOST, message=cause, detected_at=now
        )
        job.nodes.filter(attempt=job.attempts).exclude(state__in=TrainingJob.TERMINAL_STATES).update(
            state=JobState.FAILED, finished_at=now
        )
        job.state = JobState.RECOVERING
        job.save(update_fields=["state", "updated_at"])
        job_event(job, {"state": "recovering", "attempt": job.attempts, "fault": fault_values(fault)})
        job_launch(
            job=job,
            automatic=True,
            why=f"Its worker was lost; resumed automatically ({left - 1} automatic recoveries left).",
        )
    return ""


def node_drain(*, job_id: int, attempt: int, node_name: str, reason: str) -> dict:
    """The fault-risk loop's drain (``workers.reliability.risk_watch``): take node ``node_name`` out of the
    elastic job's running attempt so that the others go on without it (their agents re-form the group on
    the nodes left, resharded from the newest snapshot). The node is failed with a ``node-drained`` fault;
    its next heartbeat tells its supervisor to stop its ranks (as for a node called lost), and it is not
    offered back to this attempt. Refused, saying why, where it cannot work: a job that is not elastic, node
    0 (it hosts the rendezvous store), or too few nodes left for ``min_nodes``. Returns ``{"status": "done"
    | "refused", "note"}``."""

    now = timezone.now()
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.attempts != attempt or job.state not in TrainingJob.ACTIVE_STATES:
            return {"status": "refused", "note": f"the job's attempt {attempt} is not running any more"}
        if not job.elastic:
            return {
                "status": "refused",
                "note": f"the job is not elastic (min_nodes = nnodes = {job.nnodes}): it cannot go on without a node",
            }
        nodes = list(job.nodes.filter(attempt=attempt))
        node = next(
            (n for n in nodes if n.node_name == node_name and n.state not in TrainingJob.TERMINAL_STATES),
            None,
        )
        if node is None:
            return {"status": "refused", "note": f"no running node {node_name!r} in attempt {attempt}"}
        if node.node_rank == 0:
            return {
                "status": "refused",
                "note": "node 0 hosts the rendezvous store: the others cannot go on without it",
            }
        going_on = [n for n in nodes if n.pk != node.pk and node_alive(n, now)]
        if len(going_on) < job.min_nodes:
            return {
                "status": "refused",
                "note": f"{len(going_on)} node(s) would be left, fewer than min_nodes = {job.min_nodes}",
            }
        JobNode.objects.filter(pk=node.pk).update(state=JobState.FAILED, finished_at=now)
        fault = fault_at_last_step(
            job,
            attempt=attempt,
            kind=FaultKind.NODE_DRAINED,
            message=f"drained by the fault-risk loop ({reason})"[:MESSAGE_CHARS],
            detected_at=now,
            recovered_at=now,
            node_rank=node.node_rank,
            node_name=node.node_name,
        )
        note = f"node {node.node_name} (node rank {node.node_rank}) drained: the job goes on on {len(going_on)} node(s)"
        job_event(job, {"fault": fault_values(fault), "attempt": attempt, "message": f"{note}."})
    return {"status": "done", "note": note, "node_rank": node.node_rank, "nodes_left": len(going_on)}


def reap_lost_nodes(*, now=None, stale_after=None) -> list[int]:
    """Elastic jobs whose attempt goes on while one of its nodes went silent (its worker died: no heartbeat
    for ``stale_after``, default ``HEARTBEAT_TIMEOUT``): that node is failed with a ``node-lost`` fault and
    the others go on (the job ends when they do, ``settle_attempt``). Node 0 hosts the rendezvous store: the
    nodes left cannot re-form the group without it, so losing it resumes the job as a new attempt, as a lost
    worker does (``resume_after_worker_lost``). A job all of whose nodes went silent is the job-level
    reaper's (``reap_orphans``). The nodes lost are then offered to node workers that are online
    (``grow_elastic_jobs``). Returns the ids of the jobs that lost a node."""

    now = now or timezone.now()
    stale_after = stale_after or HEARTBEAT_TIMEOUT
    elastic = TrainingJob.objects.filter(state__in=TrainingJob.ACTIVE_STATES, min_nodes__lt=F("nnodes"))
    lost, store_lost = [], []
    for job_id in elastic.values_list("pk", flat=True):
        with transaction.atomic():
            job = TrainingJob.objects.select_for_update().get(pk=job_id)
            if job.state not in TrainingJob.ACTIVE_STATES:
                continue
            nodes = list(job.nodes.filter(attempt=job.attempts))
            silent = [
                n
                for n in nodes
                if n.state not in TrainingJob.TERMINAL_STATES
                and n.heartbeat_at is not None
                and n.heartbeat_at < now - stale_after
            ]
            going_on = [n for n in nodes if n not in silent and node_alive(n, now, stale_after)]
            if not silent or not going_on:
                continue
            if any(n.node_rank == 0 for n in silent):
                store_lost.append(job.pk)
                continue
            for n in silent:
                JobNode.objects.filter(pk=n.pk).update(state=JobState.FAILED, finished_at=now)
                n.state = JobState.FAILED
                record_node_lost(
                    job=job,
                    node=n,
                    message=(
                        f"the worker of node {n.node_rank} stopped answering (last heartbeat "
                        f"{n.heartbeat_at:%H:%M:%S} UTC); the job goes on on {len(going_on)} node(s)"
                    ),
                )
            if all(n.state in TrainingJob.TERMINAL_STATES for n in nodes):
                settle_attempt(job=job, nodes=nodes, log_tail=job.log_tail, now=now)
            lost.append(job.pk)
    for job_id in store_lost:
        cause = (
            "Node 0, which hosts the job's rendezvous store, stopped answering: the nodes left cannot re-form "
            "the group without it."
        )
        why_not = resume_after_worker_lost(job_id=job_id, cause=cause)
        if why_not:
            job_fail(job_id=job_id, human=f"{cause} It was not resumed: {why_not}", error="node 0 lost")
    if lost:
        try:
            grow_elastic_jobs()
        except Exception:  # noqa: BLE001 - the broker may be away; a node worker that starts offers itself
            log.warning("elastic jobs: could not look for node workers to grow onto", exc_info=True)
    return lost + store_lost


# the job states in which a node may join a running elastic attempt
GROWABLE_STATES = (JobState.RUNNING, JobState.RECOVERING)


def grow_elastic_jobs(*, node_queues: list[str] | None = None) -> list[int]:
    """Grow back: elastic jobs whose attempt runs on fewer nodes than ``max_nodes`` get the node workers of
    ``node_queues`` (``node.<name>``; None: those online, ``online_node_queues``) that run no node of it:
    a new ``JobNode`` of the running attempt each, whose agent joins the rendezvous, and the group re-forms
    with it (the runtime lays the job out for the larger world, ``JobConfig.rescale``). Returns the ids of
    the jobs that got a node."""

    short = [
        job.pk
        for job in TrainingJob.objects.filter(state__in=GROWABLE_STATES, min_nodes__lt=F("nnodes"))
        if job.nodes.filter(attempt=job.attempts).exclude(state__in=TrainingJob.TERMINAL_STATES).count()
        < job.nnodes
    ]
    if not short:
        return []
    if node_queues is None:
        node_queues = online_node_queues()
    return [job_id for job_id in short if node_queues and _grow(job_id, node_queues)]


def _grow(job_id: int, node_queues: list[str]) -> list[str]:

    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.state not in GROWABLE_STATES or not job.elastic:
            return []
        nodes = list(job.nodes.filter(attempt=job.attempts))
        live = [n for n in nodes if n.state not in TrainingJob.TERMINAL_STATES]
        # a node drained for its risk is not taken back into the attempt it was drained from
        drained = set(
            job.faults.filter(attempt=job.attempts, kind=FaultKind.NODE_DRAINED).values_list(
                "node_name", flat=True
            )
        )
        busy = {n.node_name for n in live} | drained
        free = [q for q in node_queues if q.removeprefix(NODE_QUEUE_PREFIX) not in busy]
        joining = free[: job.nnodes - len(live)]
        rank = max((n.node_rank for n in nodes), default=-1) + 1
        attempt = job.attempts
        for queue in joining:
            JobNode.objects.create(
                job=job, attempt=attempt, node_rank=rank, node_name=queue.removeprefix(NODE_QUEUE_PREFIX)
            )
            enqueue_after_commit(run_node, (job_id, attempt, rank), queue=queue)
            rank += 1
        if joining:
            names = [q.removeprefix(NODE_QUEUE_PREFIX) for q in joining]
            job_event(
                job,
                {
                    "attempt": attempt,
                    "nodes_joining": names,
                    "message": (
                        f"Node worker(s) {', '.join(names)} online: joining the running attempt "
                        f"({len(live) + len(joining)} of its {job.nnodes} nodes)."
                    ),
                },
            )
    return joining


def job_restore(*, job: TrainingJob, snapshot: str) -> TrainingJob:
    """A new attempt that continues from exactly ``snapshot`` (``resume_from``; the newer snapshots are
    set aside). The job must have ended; the snapshot must be one of its own that verified and is still
    on disk."""

    job = TrainingJob.objects.get(pk=job.pk)
    if not job.is_finished:
        raise JobStillActive(
            f"Job {job.pk} is {job.state}: cancel it (or wait for it to end), then restore it from a snapshot."
        )
    if "resume_from" not in JobConfig.__dataclass_fields__:
        raise ValidationError({"snapshot": ["this runtime cannot resume from a chosen snapshot yet"]})
    rows = {row["name"]: row for row in snapshot_rows(job)}
    row = rows.get(snapshot)
    if row is None:
        known = ", ".join(list(rows)[:10]) or "none yet"
        hint = (
            "" if job.snapshots_enabled else " (it takes no snapshots: launch jobs with snapshot_every > 0)"
        )
        raise ValidationError(
            {"snapshot": [f"job {job.pk} has no snapshot {snapshot!r}{hint}; its snapshots: {known}"]}
        )
    if not row["verified"]:
        raise ValidationError(
            {"snapshot": [f"snapshot {snapshot} did not verify when it was written: pick another one"]}
        )
    if row["on_disk"] not in ("present", None):
        reason = (
            "removed by retention (snapshot_keep)"
            if row["on_disk"] == "removed"
            else f"set aside as {row['on_disk']}"
        )
        raise ValidationError({"snapshot": [f"snapshot {snapshot} is no longer available: {reason}"]})
    return job_launch(job=job, resume_from=snapshot)
