"""Writes for elastic recovery: the faults, recoveries, snapshots and goodput the recovery engine
(``workers.reliability.elastic.ElasticWatch``, run by a node's supervisor) reports; the automatic resume of
a job whose Celery worker was lost (the reaper); restoring a job from a snapshot of its choice.

The engine's callbacks run in the supervising thread, between polls of the ranks: ``watch_callbacks`` wraps
each write so that a database error is logged, never raised into the engine (the training goes on; the
end-of-run report fills in what a callback missed). Each write publishes its event on the job's stream
after its commit: ``{"fault": {...}}``, ``{"recovery": {...}}``, ``{"snapshot": {...}}``,
``{"goodput": {...}}`` (with ``"state"`` where the job's state changed)."""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import F
from django.utils import timezone
from rest_framework.exceptions import APIException, ValidationError

from controlplane.common.models import JobState
from controlplane.jobs.models import FaultKind, JobFault, JobSnapshot, SnapshotKind, TrainingJob
from controlplane.jobs.selectors import fault_values, restarts_left, snapshot_rows, snapshot_values
from controlplane.jobs.services.events import job_event

log = logging.getLogger(__name__)

# how many characters of an engine's message a fault row keeps
MESSAGE_CHARS = 2000
# a snapshot's name: its directory under the job's snapshot_dir (``workers.training.checkpoint.storage``'s
# ``snapshot_name``: step-<step, 8 digits or more>)
SNAPSHOT_NAME = re.compile(r"step-(\d{8,12})")


class JobStillActive(APIException):
    status_code = 409
    default_code = "job_still_active"


def _when(unix) -> datetime:
    """An engine's unix time as an aware datetime (now when it gave none)."""
    if isinstance(unix, int | float) and not isinstance(unix, bool) and unix > 0:
        return datetime.fromtimestamp(float(unix), tz=UTC)
    return timezone.now()


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _float_or_none(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# --- what the recovery engine reports -----------------------------------------------------------------


def _fault_key(payload: dict) -> dict:
    """What identifies a fault of an attempt in the engine's dicts: its kind, torchrun restart and rank."""
    kind = payload.get("kind") if payload.get("kind") in FaultKind.values else FaultKind.RANK_FAILED
    return {
        "kind": kind,
        "restart": max(0, _int_or_none(payload.get("restart")) or 0),
        "rank": _int_or_none(payload.get("rank")),
    }


def _new_fault(job: TrainingJob, attempt: int, payload: dict) -> JobFault:
    return JobFault(
        job=job,
        attempt=attempt,
        **_fault_key(payload),
        step=_int_or_none(payload.get("step")),
        message=str(payload.get("message") or "")[:MESSAGE_CHARS],
        detected_at=_when(payload.get("detected_unix")),
    )


def _apply_recovery(row: JobFault, recovery: dict) -> None:
    row.recovered_at = _when(recovery.get("recovered_unix"))
    if (step := _int_or_none(recovery.get("step"))) is not None:
        row.step = step  # the faulted group's last step, known once it is gone (ElasticWatch)
    row.resumed_from_step = _int_or_none(recovery.get("resumed_from_step"))
    row.snapshot = str(recovery.get("snapshot") or "")[:64]
    row.steps_lost = _int_or_none(recovery.get("steps_lost"))
    rto = _float_or_none(recovery.get("rto_s"))
    row.rto_s = rto if rto is not None else (row.recovered_at - row.detected_at).total_seconds()
    skipped = [s for s in recovery.get("skipped") or [] if isinstance(s, dict) and s.get("name")]
    if skipped:  # newer snapshots the resume found corrupt and set aside
        said = "; ".join(f"{s['name']} ({s.get('reason') or 'unusable'})" for s in skipped)
        row.message = f"{row.message} · the resume skipped {said}".strip(" ·")[:MESSAGE_CHARS]


def record_fault(*, job_id: int, attempt: int, fault: dict, node_rank: int | None = None) -> JobFault | None:
    """A rank was killed, hung or failed: keep it; the job is recovering when it has a restart left (its
    torchrun restarts the ranks from the newest good snapshot), else the fault ends the attempt. The ranks a
    cancel stops are no fault (None), nor what the watch of a node the job gave up reports (``node_rank``:
    the reporting node, lost or drained: the job goes on without it, and its ranks were stopped for that;
    where nodes share a progress directory it also sees the others' ranks re-form, which their own watch
    reports)."""
    from controlplane.jobs.models import JobNode

    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.cancel_requested:
            return None
        if (
            node_rank is not None
            and job.elastic
            and JobNode.objects.filter(
                job=job, attempt=attempt, node_rank=node_rank, state=JobState.FAILED
            ).exists()
        ):
            return None
        # torchrun was given the restarts left when the attempt started (``node_run``)
        recoverable = job.snapshots_enabled and restarts_left(job) > 0
        row = _new_fault(job, attempt, fault)
        row.save()
        values: dict = {"fault": fault_values(row), "attempt": attempt}
        if not recoverable:
            values["message"] = "not recovered: " + (
                "it takes no snapshots"
                if not job.snapshots_enabled
                else f"max_restarts ({job.max_restarts}) used"
            )
        elif attempt == job.attempts and job.state in (JobState.LAUNCHING, JobState.RUNNING):
            job.state = JobState.RECOVERING
            job.save(update_fields=["state", "updated_at"])
            values["state"] = JobState.RECOVERING.value
        job_event(job, values)
    return row


def record_recovery(*, job_id: int, attempt: int, recovery: dict) -> JobFault:
    """Training continues after a fault: how (which snapshot, steps lost, RTO); the job is running again
    once none of its attempt's faults is still open."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        open_faults = JobFault.objects.filter(job=job, attempt=attempt, recovered_at__isnull=True)
        row = open_faults.filter(**_fault_key(recovery)).order_by("-detected_at", "-pk").first()
        if row is None:  # its fault was never recorded (a database blip then): the recovery says it all
            row = _new_fault(job, attempt, recovery)
        _apply_recovery(row, recovery)
        row.save()
        values: dict = {"recovery": fault_values(row), "attempt": attempt}
        still_open = open_faults.exclude(pk=row.pk).exists()
        if attempt == job.attempts and job.state == JobState.RECOVERING and not still_open:
            job.state = JobState.RUNNING
            job.save(update_fields=["state", "updated_at"])
            values["state"] = JobState.RUNNING.value
        job_event(job, values)
    return row


def _snapshot_row(job: TrainingJob, attempt: int, snapshot: dict) -> JobSnapshot | None:
    """Upsert the row of a snapshot the watch reported: published (verified or not, with the problem), or
    ``{"name", "removed": True}`` when retention or a restore took it away."""
    name = str(snapshot.get("name") or "")[:64]
    match = SNAPSHOT_NAME.fullmatch(name)
    if match is None:
        return None
    if snapshot.get("removed"):
        JobSnapshot.objects.filter(job=job, name=name).update(removed=True)
        return JobSnapshot.objects.filter(job=job, name=name).first()
    step = _int_or_none(snapshot.get("step"))
    row, _ = JobSnapshot.objects.update_or_create(
        job=job,
        name=name,
        defaults={
            "attempt": attempt,
            "step": step if step is not None and step >= 0 else int(match[1]),
            "kind": snapshot.get("kind")
            if snapshot.get("kind") in SnapshotKind.values
            else SnapshotKind.FULL,
            "bytes_written": max(0, _int_or_none(snapshot.get("bytes_written")) or 0),
            "raw_bytes": max(0, _int_or_none(snapshot.get("raw_bytes")) or 0),
            "base": str(snapshot.get("base") or "")[:64],
            "created_at": _when(snapshot.get("created_unix")),
            "verified": snapshot.get("verified") is True,
            "problem": str(snapshot.get("problem") or "")[:MESSAGE_CHARS],
            "removed": False,
        },
    )
    return row


def record_snapshot(*, job_id: int, attempt: int, snapshot: dict) -> JobSnapshot | None:
    """A snapshot was published (a restore's new attempt writing the same step again replaces the row)."""
    with transaction.atomic():
        job = TrainingJob.objects.get(pk=job_id)
        row = _snapshot_row(job, attempt, snapshot)
        if row is not None:
            job_event(job, {"snapshot": snapshot_values(row), "attempt": attempt})
    return row


def clean_goodput(goodput) -> dict | None:
    """The engine's goodput (``wall_s productive_s goodput badput{...}``), numbers only."""
    if not isinstance(goodput, dict):
        return None
    out = {k: _float_or_none(goodput.get(k)) for k in ("wall_s", "productive_s", "goodput")}
    badput = goodput.get("badput") if isinstance(goodput.get("badput"), dict) else {}
    out["badput"] = {
        str(k)[:40]: _float_or_none(v) for k, v in badput.items() if _float_or_none(v) is not None
    }
    out["steps_kept"] = _int_or_none(goodput.get("steps_kept"))
    return out if out["goodput"] is not None else None


def _reconcile_fault(job: TrainingJob, attempt: int, fault: dict) -> None:
    """A fault of the report that no callback recorded (a database blip then) is recorded now, with its
    recovery when the report has one; a recorded one gets a recovery it missed."""
    row = (
        JobFault.objects.filter(job=job, attempt=attempt, **_fault_key(fault))
        .order_by("-detected_at", "-pk")
        .first()
    ) or _new_fault(job, attempt, fault)
    recovered = row.recovered_at is None and fault.get("recovered_unix")
    if recovered:
        _apply_recovery(row, fault)
    if row.pk is None or recovered:
        row.save()


def store_elastic_report(*, job: TrainingJob, attempt: int, report: dict) -> dict | None:
    """The engine's end-of-attempt report, inside the transaction that settles the node: its snapshots (a
    callback that missed one is made good), its goodput on the job and in ``measured``. Returns the goodput."""
    for snapshot in report.get("snapshots") or []:
        if isinstance(snapshot, dict):
            _snapshot_row(job, attempt, snapshot)
    for fault in report.get("faults") or [] if not job.cancel_requested else []:
        if isinstance(fault, dict):  # (the ranks a cancel stopped are no fault)
            _reconcile_fault(job, attempt, fault)
    goodput = clean_goodput(report.get("goodput"))
    if goodput is None:
        return None
    goodput["attempt"] = attempt
    goodput["restarts"] = _int_or_none(report.get("restarts"))
    job.goodput = goodput
    job.measured = {**(job.measured or {}), "goodput": goodput}
    return goodput


def watch_callbacks(
    job_id: int, attempt: int, node_rank: int | None = None
) -> dict[str, Callable[[dict], None]]:
    """``on_fault``, ``on_recovered``, ``on_snapshot`` for ``ElasticWatch`` (of node ``node_rank``): each one
    write that never raises into the engine."""

    def quietly(write, what: str):
        def call(payload: dict) -> None:
            try:
                close_old_connections()
                extra = {"node_rank": node_rank} if what == "fault" else {}
                write(job_id=job_id, attempt=attempt, **{what: payload}, **extra)
            except Exception:  # noqa: BLE001 - the engine must go on; the end-of-run report fills in
                log.warning("job %s attempt %s: %s not recorded", job_id, attempt, what, exc_info=True)

        return call

    return {
        "on_fault": quietly(record_fault, "fault"),
        "on_recovered": quietly(record_recovery, "recovery"),
        "on_snapshot": quietly(record_snapshot, "snapshot"),
    }


def _kill_this_worker() -> None:
    """``kill-worker`` fault injection: SIGKILL the process that supervises the ranks (this Celery worker)."""
    os.kill(os.getpid(), signal.SIGKILL)


def elastic_watch_for(job: TrainingJob, attempt: int, node_rank: int, workdir: Path):
    """The recovery engine's watch over this node's ranks, or None where the engine is not installed (the
    job then runs as before: no restarts, no fault records)."""
    try:
        from workers.reliability.elastic import ElasticWatch
        from workers.reliability.faults import FaultInjector
    except ImportError:
        log.warning("workers.reliability.elastic is missing: job %s runs without fault recovery", job.pk)
        return None
    config = job.config or {}
    snapshot_dir = Path(config["snapshot_dir"]) if config.get("snapshot_dir") else None
    injector = None
    if config.get("inject") and node_rank == 0:  # one node fires the job's faults (global rank numbers)
        injector = FaultInjector(
            config["inject"],
            world_size=job.world_size,
            snapshot_dir=snapshot_dir,
            # across attempts: a resumed attempt passing the same steps does not fire them again
            state_path=Path(settings.VAR_DIR) / "jobs" / str(job.pk) / f"faults-fired-{job.files_stamp}.json",
            kill_worker=_kill_this_worker,
        )
    return ElasticWatch(
        workdir,
        hang_timeout_s=float(job.hang_timeout_s),
        snapshot_dir=snapshot_dir,
        injector=injector,
        # an elastic job's nodes may share the attempt's directory (one machine, a shared filesystem) and
        # one may join while the others train: only node 0, started first, clears it; and its agents
        # restart a healthy group to let a node join, which is no fault
        fresh=not job.elastic or node_rank == 0,
        membership_changes=job.elastic,
        **watch_callbacks(job.pk, attempt, node_rank),
    )


def risk_watch_for(job: TrainingJob, attempt: int, node_rank: int, watch, *, local_ranks: int):
    """The fault-risk loop over this node (``workers.reliability.risk_watch``): telemetry and ``risk`` events
    on the job's stream, read from the same progress directory as the recovery ``watch``. Events go through
    ``publish_after_commit``, which keeps them in the database while Redis is away (nothing is lost)."""
    from controlplane.live.services import publish_after_commit
    from workers.reliability.risk.policy import PreventionPolicy
    from workers.reliability.risk_watch import NodeRiskWatch
    from workers.training.supervision.supervisor import node_name

    model, absent = failure_model()
    return NodeRiskWatch(
        watch.dir,
        node=node_name(),
        node_rank=node_rank,
        local_ranks=local_ranks,
        attempt=attempt,
        telemetry_every_s=settings.TELEMETRY_EVERY_S,
        failure_model=model,
        failure_model_absent=absent,
        prevention=PreventionPolicy(mode=(job.config or {}).get("risk_policy") or "act"),
        protected=job.snapshots_enabled,
        drain=lambda node, reason: node_drain(job_id=job.pk, attempt=attempt, node_name=node, reason=reason),
        publish=lambda kind, values, step: publish_after_commit(job.stream, kind, values, step=step),
    )


def failure_model():
    """(the failure model ``CANN_TRAIN_RISK_MODEL`` names, or None; why there is none)."""
    path = settings.RISK_MODEL_DIR
    if not path:
        return None, (
            "no failure model configured: train one with 'cann-train faults train --out DIR' and set "
            "CANN_TRAIN_RISK_MODEL=DIR"
        )
    from workers.reliability.risk.evaluate import load_model

    try:
        return load_model(path), ""
    except (OSError, ValueError, RuntimeError) as exc:
        log.warning("CANN_TRAIN_RISK_MODEL=%s does not load: %s", path, exc)
        return None, f"the failure model at CANN_TRAIN_RISK_MODEL={path} does not load: {exc}"


# --- resuming: a relaunch, a lost worker, a restore ---------------------------------------------------


def resume_plan(job: TrainingJob, *, resume_from: str | None = None) -> tuple[dict, dict | None]:
    """The config of the job's next attempt and what it resumes from. A relaunch of a job that snapshots
    resumes from its newest good snapshot (the runtime verifies it and falls back to an older one); a
    restore from ``resume_from`` exactly. A ``resume_from`` of an earlier restore is dropped."""
    config = {k: v for k, v in (job.config or {}).items() if k != "resume_from"}
    if job.attempts and job.snapshots_enabled:
        config["resume"] = True
    if resume_from:
        config["resume"] = True
        config["resume_from"] = resume_from
    if not config.get("resume"):
        return config, None
    snapshots = job.snapshots.filter(verified=True, removed=False)
    chosen = (
        snapshots.filter(name=resume_from).first() if resume_from else snapshots.order_by("-step").first()
    )
    if resume_from:
        message = (
            f"Restores snapshot {resume_from}"
            + (f" (step {chosen.step})" if chosen else "")
            + ": training continues from there; newer snapshots are set aside."
        )
    elif chosen is not None:
        message = (
            f"Resumes from its newest good snapshot ({chosen.name}, step {chosen.step}; an older one if that "
            "one no longer verifies)."
        )
    else:
        message = "Resumes from its newest good snapshot if one was written, else from the start."
    return config, {
        "from": chosen.name if chosen else resume_from,
        "step": chosen.step if chosen else None,
        "exactly": bool(resume_from),
        "message": message,
    }


def _last_train_event(job: TrainingJob):
    from controlplane.live.models import StreamEvent

    return (
        StreamEvent.objects.filter(stream=job.stream, kind="train", values__attempt=job.attempts)
        .order_by("-seq")
        .only("step", "values")
        .first()
    )


def resume_after_worker_lost(*, job_id: int, cause: str) -> str:
    """The reaper found the job's supervising worker dead. A job that snapshots and has restarts left
    records a ``worker-lost`` fault and is queued again, resuming from its newest good snapshot: returns
    "". Otherwise returns why it was not resumed (the caller fails it, saying so)."""
    from controlplane.jobs.services import job_launch

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
        fault = _fault_at_last_step(
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


# --- elastic node range: a node lost for good, a node that comes back ----------------------------------


def _fault_at_last_step(job: TrainingJob, **fields) -> JobFault:
    """A fault found from outside the ranks, at the step and torchrun restart of the job's last train event."""
    last = _last_train_event(job)
    return JobFault.objects.create(
        job=job,
        restart=max(0, _int_or_none((last.values or {}).get("restart")) or 0) if last else 0,
        step=last.step if last else None,
        **fields,
    )


def record_node_lost(*, job: TrainingJob, node, message: str) -> JobFault:
    """Node ``node`` of the elastic job's current attempt is gone for good while other nodes go on (inside
    the caller's transaction, the job locked): a ``node-lost`` fault, closed at once (the nodes left re-form
    the group by a torchrun restart, which their own watch records as a rank fault with its recovery)."""
    now = timezone.now()
    fault = _fault_at_last_step(
        job,
        attempt=node.attempt,
        kind=FaultKind.NODE_LOST,
        message=message[:MESSAGE_CHARS],
        detected_at=now,
        recovered_at=now,
        node_rank=node.node_rank,
        node_name=node.node_name,
    )
    job_event(
        job,
        {
            "fault": fault_values(fault),
            "attempt": node.attempt,
            "message": f"Lost node {node.node_name or node.node_rank}: {message}.",
        },
    )
    return fault


def node_drain(*, job_id: int, attempt: int, node_name: str, reason: str) -> dict:
    """The fault-risk loop's drain (``workers.reliability.risk_watch``): take node ``node_name`` out of the
    elastic job's running attempt so that the others go on without it (their agents re-form the group on
    the nodes left, resharded from the newest snapshot). The node is failed with a ``node-drained`` fault;
    its next heartbeat tells its supervisor to stop its ranks (as for a node called lost), and it is not
    offered back to this attempt. Refused, saying why, where it cannot work: a job that is not elastic, node
    0 (it hosts the rendezvous store), or too few nodes left for ``min_nodes``. Returns ``{"status": "done"
    | "refused", "note"}``."""
    from controlplane.jobs.models import JobNode
    from controlplane.jobs.services import node_alive

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
        fault = _fault_at_last_step(
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
    from controlplane.jobs.models import JobNode
    from controlplane.jobs.services import HEARTBEAT_TIMEOUT, job_fail, node_alive, settle_attempt

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
    from controlplane.jobs.selectors import online_node_queues

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
    from controlplane.jobs.models import JobNode
    from controlplane.jobs.selectors import NODE_QUEUE_PREFIX
    from controlplane.jobs.tasks import run_node

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
            transaction.on_commit(lambda r=rank, q=queue: run_node.apply_async((job_id, attempt, r), queue=q))
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


def settle_worker_lost(*, job_id: int, events: list[dict]) -> None:
    """A job resumed after a lost worker trains again: its first train event of a later attempt closes
    the ``worker-lost`` fault (resumed from the step before it; RTO from detection to that step). The
    relay calls this with each stored batch of train events."""
    later = [
        e
        for e in events
        if e.get("kind") == "train"
        and isinstance(e.get("step"), int)
        and isinstance((e.get("values") or {}).get("attempt"), int)
        and e["values"]["attempt"] > 1
    ]
    if not later:
        return
    from workers.events import parse_time

    for fault in JobFault.objects.filter(
        job_id=job_id, kind=FaultKind.WORKER_LOST, recovered_at__isnull=True
    ):
        first = next((e for e in later if e["values"]["attempt"] > fault.attempt), None)
        if first is None:
            continue
        with transaction.atomic():
            row = JobFault.objects.select_for_update().filter(pk=fault.pk, recovered_at__isnull=True).first()
            if row is None:
                continue
            resumed = first["step"] - 1
            snapshot = JobSnapshot.objects.filter(job_id=job_id, step=resumed).first()
            row.recovered_at = parse_time(first["time"]) if first.get("time") else timezone.now()
            row.resumed_from_step = resumed
            row.snapshot = snapshot.name if snapshot else ""
            row.steps_lost = max(0, row.step - resumed) if row.step is not None else None
            row.rto_s = max(0.0, (row.recovered_at - row.detected_at).total_seconds())
            row.save()
            job = TrainingJob.objects.get(pk=job_id)
            job_event(job, {"recovery": fault_values(row), "attempt": first["values"]["attempt"]})


def job_restore(*, job: TrainingJob, snapshot: str) -> TrainingJob:
    """A new attempt that continues from exactly ``snapshot`` (``resume_from``; the newer snapshots are
    set aside). The job must have ended; the snapshot must be one of its own that verified and is still
    on disk."""
    from controlplane.jobs.services import job_launch
    from workers.training.config import JobConfig

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
