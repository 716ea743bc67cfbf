"""What a job's nodes report: started, heartbeats, finished; an attempt settled from its nodes; the measured
figures, and the progress kept from the job's train events."""

from __future__ import annotations

import os
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.common.models import JobState
from controlplane.jobs.models import WITHOUT_THE_NODE, JobNode, TrainingJob
from controlplane.jobs.selectors import restarts_left
from controlplane.jobs.services.events import job_event
from controlplane.jobs.services.faults import record_node_lost, settle_worker_lost, store_elastic_report
from controlplane.jobs.services.outcomes import cancelled_message
from controlplane.jobs.services.user_code import user_code_outcome
from controlplane.jobs.slots import next_slot, slots_of, utc_text
from controlplane.planning.services import plan_record_measurement
from workers.training.entrypoint import is_user_run

# a supervisor that has not written a heartbeat for this long is presumed dead
HEARTBEAT_TIMEOUT = timedelta(seconds=float(os.environ.get("CANN_TRAIN_HEARTBEAT_TIMEOUT_S", "20")))


def node_started(*, node: JobNode, pid: int) -> None:
    now = timezone.now()
    with transaction.atomic():
        JobNode.objects.filter(pk=node.pk).update(
            state=JobState.RUNNING, pid=pid, started_at=now, heartbeat_at=now
        )
        job = TrainingJob.objects.select_for_update().get(pk=node.job_id)
        if job.state in (JobState.QUEUED, JobState.LAUNCHING):
            job.state = JobState.RUNNING
            job.started_at = job.started_at or now
            job.heartbeat_at = now
            job.save()
            nodes = job.nodes.filter(attempt=job.attempts).count() if job.elastic else job.nnodes
            job_event(
                job,
                {
                    "state": "running",
                    "attempt": job.attempts,
                    "nodes": nodes,
                    "ranks": nodes * job.nproc_per_node,
                },
            )


def heartbeat(*, node: JobNode) -> bool:
    """Record a sign of life; returns True when the node's run should stop: the job wants to be cancelled,
    or (elastic) the control plane already gave this node up as lost (``reap_lost_nodes``: its heartbeats
    stopped for a while; the group went on without it, so its agent must not linger in it)."""
    now = timezone.now()
    JobNode.objects.filter(pk=node.pk).update(heartbeat_at=now)
    TrainingJob.objects.filter(pk=node.job_id).update(heartbeat_at=now)
    if TrainingJob.objects.filter(pk=node.job_id, cancel_requested=True).exists():
        return True
    return JobNode.objects.filter(
        pk=node.pk, state=JobState.FAILED, job__min_nodes__lt=F("job__nnodes")
    ).exists()


def node_finished(
    *,
    node: JobNode,
    exit_code: int,
    cancelled: bool,
    log_tail: str,
    summary: dict | None,
    elastic: dict | None = None,
) -> None:
    """Store a node's outcome; the last node to finish settles the job. ``elastic`` is the recovery
    engine's report of the node (``ElasticWatch.report()``): its snapshots and goodput are kept. A node of
    an elastic job that fails while other nodes of its attempt go on is a ``node-lost`` fault, not the end
    of the job (``record_node_lost``). A node of an earlier attempt settles nothing."""
    now = timezone.now()
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=node.job_id)
        state = (
            JobState.CANCELLED if cancelled else (JobState.SUCCEEDED if exit_code == 0 else JobState.FAILED)
        )
        given_up = JobNode.objects.filter(pk=node.pk, state=JobState.FAILED).exists()
        if job.elastic and given_up:  # recorded lost before it reported: it stays so (it was stopped for it)
            state = JobState.FAILED
        JobNode.objects.filter(pk=node.pk).update(state=state, exit_code=exit_code, finished_at=now)
        job.exit_codes = [
            *job.exit_codes,
            {"attempt": node.attempt, "node_rank": node.node_rank, "code": exit_code},
        ]
        if node.node_rank == 0 or not job.log_tail:
            job.log_tail = log_tail
        if summary is not None:
            job.measured = summary
        goodput = None
        # a node the elastic job gave up (lost, drained) reports the ranks stopped for that: no fault of the
        # job's, which goes on without it, and no goodput of the job's either
        dropped = job.elastic and given_up
        if (
            elastic
            and not dropped
            and node.attempt == job.attempts
            and (node.node_rank == 0 or job.goodput is None)
        ):
            goodput = store_elastic_report(job=job, attempt=node.attempt, report=elastic)
        elif job.goodput and summary is not None:  # another node's summary: the goodput stays in it
            job.measured = {**job.measured, "goodput": job.goodput}
        nodes = list(job.nodes.filter(attempt=node.attempt))
        current = node.attempt == job.attempts and not job.is_finished
        if current and job.elastic and state == JobState.FAILED and not given_up and not job.cancel_requested:
            going_on = [n for n in nodes if n.pk != node.pk and node_alive(n, now)]
            if going_on:
                record_node_lost(
                    job=job,
                    node=next(n for n in nodes if n.pk == node.pk),
                    message=(
                        f"torchrun on node {node.node_rank} exited with code {exit_code}; the job goes on on "
                        f"{len(going_on)} node(s)"
                    ),
                )
        if not current or any(n.state not in TrainingJob.TERMINAL_STATES for n in nodes):
            job.save()
            if goodput is not None:
                job_event(job, {"goodput": goodput, "attempt": node.attempt})
            return
        settle_attempt(job=job, nodes=nodes, log_tail=log_tail, now=now)


def node_alive(node: JobNode, now, stale_after: timedelta | None = None) -> bool:
    """The node's supervisor runs (picked up, its heartbeats fresh: ``stale_after``, default
    ``HEARTBEAT_TIMEOUT``), or its run ended well."""
    if node.state == JobState.SUCCEEDED:
        return True
    return (
        node.state not in TrainingJob.TERMINAL_STATES
        and node.heartbeat_at is not None
        and node.heartbeat_at >= now - (stale_after or HEARTBEAT_TIMEOUT)
    )


def settle_attempt(*, job: TrainingJob, nodes: list[JobNode], log_tail: str, now) -> None:
    """Every node of the job's current attempt has ended: the job ends (inside the caller's transaction,
    ``job`` locked). An elastic job leaves out the nodes it lost (``node-lost`` faults): it succeeded when
    the nodes that went on to the end did."""
    if job.elastic:
        lost = set(
            job.faults.filter(attempt=job.attempts, kind__in=WITHOUT_THE_NODE).values_list(
                "node_rank", flat=True
            )
        )
        nodes = [n for n in nodes if n.node_rank not in lost] or nodes
    states = {n.state for n in nodes}
    paused = job.pause_requested and states != {JobState.SUCCEEDED}
    if paused:  # stopped at the end of its carbon-aware slot: it waits for the next one
        job.state = JobState.SCHEDULED
        job.cancel_requested = job.pause_requested = False
        job.human_readable_error = job.error = ""
        upcoming = next_slot(slots_of(job.green_schedule), now) if job.green_schedule_id else None
        job.save()
        job_event(
            job,
            {
                "state": "scheduled",
                "attempt": job.attempts,
                "exit_codes": [n.exit_code for n in nodes],
                "message": "Paused between carbon-aware slots"
                + (f": continues from its newest snapshot at {utc_text(upcoming[0])}." if upcoming else "."),
            },
        )
        return
    if job.cancel_requested or JobState.CANCELLED in states:
        job.state = JobState.CANCELLED
        # a clean end: who asked for it, not the traceback torchrun prints when it is stopped
        job.human_readable_error, job.error = cancelled_message(job), ""
    elif states == {JobState.SUCCEEDED}:
        job.state = JobState.SUCCEEDED
        job.progress = 1.0
        if is_user_run(job.config):  # a script that never reported, or lost work to a fault: said so
            job.human_readable_error = user_code_outcome(job, None)
    else:
        job.state = JobState.FAILED
        bad = [n for n in nodes if n.state == JobState.FAILED]
        job.human_readable_error = (
            user_code_outcome(job, bad[0])
            if is_user_run(job.config)
            else f"torchrun on node {bad[0].node_rank} exited with code {bad[0].exit_code}; the log tail below says "
            "why. Fix the cause and relaunch."
        )
        if job.faults.filter(attempt=job.attempts).exists() and restarts_left(job) == 0:
            job.human_readable_error += (
                f" It was not recovered again: it had used its {job.max_restarts} automatic recoveries "
                "(max_restarts)"
                + (
                    ", and a relaunch resumes from its newest good snapshot."
                    if job.snapshots_enabled
                    else "."
                )
            )
        job.error = log_tail[-2000:]
    job.finished_at = now
    job.save()
    values = {"state": job.state, "attempt": job.attempts, "exit_codes": [n.exit_code for n in nodes]}
    if job.state == JobState.CANCELLED or (is_user_run(job.config) and job.human_readable_error):
        values["message"] = job.human_readable_error
    if job.measured:
        values["measured"] = {k: job.measured.get(k) for k in ("step_time_s", "tokens_per_s", "loss_last")}
    if job.goodput:
        values["goodput"] = job.goodput
    job_event(job, values)
    # (an elastic job that ended on fewer nodes than its plan's measured another layout than the plan's)
    if (
        job.state == JobState.SUCCEEDED
        and job.source_plan_id
        and job.measured
        and job.measured.get("world_size") in (None, job.world_size)
    ):
        record_measurement(job=job)


# the run summary's figures that sit beside a plan's prediction
MEASURED_KEYS = (
    "step_time_s",
    "tokens_per_s",
    "loss_first",
    "loss_last",
    "world_size",
    "device",
    "steps",
    "tokens_per_step",
    "strategy",
)


def record_measurement(*, job: TrainingJob) -> None:
    """The knowledge base learns: the measured figures go beside the source plan's prediction."""
    measured = {k: job.measured[k] for k in MEASURED_KEYS if k in job.measured}
    plan_record_measurement(plan=job.source_plan, measured=measured, source=f"job/{job.pk}")


def job_progress_from_events(stream: str, events: list[dict]) -> None:
    """A running job's progress is its newest trained step over the steps it was asked for (the relay
    calls this with every stored batch)."""
    kind, _, pk = stream.partition("/")
    steps = [e["step"] for e in events if e.get("kind") == "train" and isinstance(e.get("step"), int)]
    if kind != "job" or not steps or not pk.isdigit():
        return
    settle_worker_lost(job_id=int(pk), events=events)
    job = TrainingJob.objects.filter(pk=int(pk), state__in=TrainingJob.ACTIVE_STATES).only("config").first()
    total = int((job.config or {}).get("steps") or 0) if job else 0
    if total > 0:
        TrainingJob.objects.filter(pk=job.pk, state__in=TrainingJob.ACTIVE_STATES).update(
            progress=round(min(1.0, max(steps) / total), 4)
        )
