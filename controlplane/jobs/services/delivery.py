"""Did every train event a job's rank 0 published reach the database? Counted once the job has ended.

A rank publishes into Redis and forgets; the relay reads the stream and stores it. A Redis that dies and
comes back without its data (no AOF, a failover to an empty replica) takes with it whatever the relay had not
read yet: an operator's probe lost steps 61-100 of a job that then ended "succeeded", with no trace. The run's
summary says what rank 0 asked to publish (``events_submitted``: events by kind and the first and last step of
its ``train`` events, ``workers.training.metrics.EventCount``); :func:`audit_event_delivery` (the relay runs it)
counts the attempt's stored ``train`` events against it once the job has ended and the relay had
``AUDIT_AFTER_S`` to catch up. A shortfall is an ``events-lost`` fault naming the missing steps, on the job's
page and stream; the figures are kept in the job's ``measured["events_audit"]`` either way (and the audit is
not made twice). The steps themselves were trained: what is lost is their live record (loss, throughput).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.jobs.models import FaultKind, JobFault, TrainingJob
from controlplane.jobs.services.events import job_event
from controlplane.live.models import StreamEvent

log = logging.getLogger(__name__)

AUDIT_AFTER_S = float(os.environ.get("CANN_TRAIN_EVENTS_AUDIT_AFTER_S", "20"))
"""How long after a job ended its stored events are counted: the relay's backlog is stored by then."""
AUDIT_WITHIN = timedelta(days=1)
"""Jobs that ended longer ago than this are not audited (before this audit existed, or long settled)."""


def _ranges(steps: list[int]) -> str:
    """``[61, 62, 63, 70]`` -> ``"61-63, 70"`` (at most 8 ranges, then how many more)."""
    out: list[str] = []
    start = prev = None
    for s in steps:
        if start is None:
            start = prev = s
        elif s == prev + 1:
            prev = s
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = s
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ", ".join(out[:8]) + (f" and {len(out) - 8} more range(s)" if len(out) > 8 else "")


def audit_job(job: TrainingJob) -> dict | None:
    """Count ``job``'s stored train events of its last attempt against what its rank 0 published; record an
    ``events-lost`` fault for a shortfall. Returns the audit (None: nothing to count against)."""
    submitted = (job.measured or {}).get("events_submitted") or {}
    expected = int((submitted.get("by_kind") or {}).get("train", 0))
    first_last = submitted.get("train_steps")
    if not expected or not first_last:
        return None
    attempt = job.attempts
    stored_steps = set(
        StreamEvent.objects.filter(stream=job.stream, kind="train", values__attempt=attempt).values_list(
            "step", flat=True
        )
    )
    first, last = int(first_last[0]), int(first_last[1])
    missing = sorted(set(range(first, last + 1)) - stored_steps)
    audit = {"attempt": attempt, "submitted": expected, "stored": len(stored_steps), "missing": len(missing)}
    with transaction.atomic():
        row = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if "events_audit" in (row.measured or {}):
            return row.measured["events_audit"]
        row.measured = {**(row.measured or {}), "events_audit": audit}
        row.save(update_fields=["measured", "updated_at"])
        if missing:
            message = (
                f"{len(missing)} of the {expected} train events rank 0 published were never stored (steps "
                f"{_ranges(missing)}): Redis lost them before the relay read them (it restarted without its "
                "data?). The steps were trained; their live record (loss, throughput) is gone."
            )
            fault = JobFault.objects.create(
                job=row,
                attempt=attempt,
                kind=FaultKind.EVENTS_LOST,
                step=missing[0],
                message=message[:2000],
                detected_at=timezone.now(),
            )
            log.warning("job %s: %s", row.pk, message)
            job_event(
                row,
                {
                    "attempt": attempt,
                    "message": message,
                    "fault": {"kind": fault.kind, "step": fault.step, "message": fault.message},
                },
            )
    return audit


def audit_event_delivery(*, now=None) -> list[int]:
    """The relay's periodic call: audit the jobs that ended at least ``AUDIT_AFTER_S`` ago (within
    ``AUDIT_WITHIN``) and were not audited yet. Returns the ids of those that lost events."""
    now = now or timezone.now()
    jobs = (
        TrainingJob.objects.filter(
            state__in=TrainingJob.TERMINAL_STATES,
            finished_at__lte=now - timedelta(seconds=AUDIT_AFTER_S),
            finished_at__gte=now - AUDIT_WITHIN,
            measured__has_key="events_submitted",
        )
        .exclude(measured__has_key="events_audit")
        .order_by("finished_at")[:50]
    )
    lost = []
    for job in jobs:
        audit = audit_job(job)
        if audit and audit.get("missing"):
            lost.append(job.pk)
    return lost
