"""A node's watches over its ranks: the recovery engine's (``ElasticWatch``: dead or hung ranks, snapshots,
fault injection) and the fault-risk loop's (``NodeRiskWatch``: telemetry, risk, prevention), wired to the
records of ``faults`` and to the drain of ``recovery``.

The engine's callbacks run in the supervising thread, between polls of the ranks: ``watch_callbacks`` wraps
each write so that a database error is logged, never raised into the engine (the training goes on; the
end-of-run report fills in what a callback missed)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections

from controlplane.jobs.models import TrainingJob
from controlplane.jobs.services.faults import record_fault, record_recovery, record_snapshot
from controlplane.jobs.services.recovery import node_drain
from controlplane.live.services import publish_after_commit

log = logging.getLogger(__name__)


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
        cut_hang=watch.cut_hang,
        hang_timeout_s=watch.hang_timeout_s,
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
