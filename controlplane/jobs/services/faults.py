"""What the recovery engine reports, kept: the faults, recoveries, snapshots and goodput that
``workers.reliability.elastic.ElasticWatch`` (run by a node's supervisor) reports; a fault found from outside
the ranks (a node lost, a worker lost, settled when the job trains again); and what a job's next attempt
resumes from (``resume_plan``).

Each write publishes its event on the job's stream after its commit: ``{"fault": {...}}``,
``{"recovery": {...}}``, ``{"snapshot": {...}}`` (with ``"state"`` where the job's state changed). These are
the floor of the recovery rooms: they need no launch (``lifecycle``) and no node bookkeeping (``nodes``),
which stand on them; the watches that call them are ``watches``, the automatic recoveries ``recovery``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone

from controlplane.common.models import JobState
from controlplane.jobs.models import FaultKind, JobFault, JobNode, JobSnapshot, SnapshotKind, TrainingJob
from controlplane.jobs.selectors import fault_values, restarts_left, snapshot_values
from controlplane.jobs.services.events import job_event
from controlplane.live.models import StreamEvent
from workers.events import parse_time

# how many characters of an engine's message a fault row keeps
MESSAGE_CHARS = 2000

# a snapshot's name: its directory under the job's snapshot_dir (``workers.training.checkpoint.storage``'s
# ``snapshot_name``: step-<step, 8 digits or more>)
SNAPSHOT_NAME = re.compile(r"step-(\d{8,12})")


def _when(unix) -> datetime:
    """An engine's unix time as an aware datetime (now when it gave none)."""
    if isinstance(unix, int | float) and not isinstance(unix, bool) and unix > 0:
        return datetime.fromtimestamp(float(unix), tz=UTC)
    return timezone.now()


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _float_or_none(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


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

    return (
        StreamEvent.objects.filter(stream=job.stream, kind="train", values__attempt=job.attempts)
        .order_by("-seq")
        .only("step", "values")
        .first()
    )


def fault_at_last_step(job: TrainingJob, **fields) -> JobFault:
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
    fault = fault_at_last_step(
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
