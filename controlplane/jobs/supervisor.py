"""Run and supervise one node's ``torchrun`` agent for a job attempt (inside a Celery worker).

The agent runs in its own session (so cancel kills the whole process group: agent and ranks) and dies
with the worker thread that started it (``PR_SET_PDEATHSIG``), so a killed worker leaves no orphan
ranks behind; the relay's reaper then marks the job failed once its heartbeats stop.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections

from controlplane.common.models import JobState
from controlplane.common.redis import redis_client
from controlplane.jobs import services
from controlplane.jobs.models import JobNode, TrainingJob

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 2.0
POLL_EVERY_S = 0.25
KILL_GRACE_S = 10.0
RDZV_WAIT_S = 120.0
LOG_TAIL_CHARS = 6000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_PR_SET_PDEATHSIG = 1


def node_name() -> str:
    """This worker's node: ``CANN_TRAIN_NODE`` or the host name. Its Celery queue is ``node.<name>``."""
    return os.environ.get("CANN_TRAIN_NODE") or socket.gethostname()


def node_address() -> str:
    """The address other nodes reach this one at (rendezvous endpoint when it is node 0)."""
    return os.environ.get("CANN_TRAIN_NODE_ADDR", "127.0.0.1")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def job_dir(job: TrainingJob, attempt: int) -> Path:
    path = Path(settings.VAR_DIR) / "jobs" / str(job.pk) / f"attempt-{attempt}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def rendezvous_endpoint(job: TrainingJob, attempt: int, node_rank: int) -> str:
    """Node 0 picks a free port on its address and announces it in Redis; the other nodes wait for it."""
    key = f"cann:rdzv:job/{job.pk}/{attempt}"
    r = redis_client()
    if node_rank == 0:
        from workers.training.launch import free_port

        endpoint = f"{node_address()}:{free_port(node_address())}"
        r.set(key, endpoint, ex=24 * 3600)
        return endpoint
    deadline = time.monotonic() + RDZV_WAIT_S
    while time.monotonic() < deadline:
        if value := r.get(key):
            return value.decode()
        time.sleep(0.2)
    raise TimeoutError(
        f"node 0 of job {job.pk} did not announce its rendezvous endpoint within {RDZV_WAIT_S:.0f}s"
    )


def stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(KILL_GRACE_S)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def read_tail(path: Path) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - LOG_TAIL_CHARS))
        return f.read().decode(errors="replace")


def run_node(job_id: int, attempt: int, node_rank: int) -> str:
    from workers.training.launch import render_torchrun_command, torchrun_env

    close_old_connections()
    job = TrainingJob.objects.get(pk=job_id)
    node = JobNode.objects.filter(job=job, attempt=attempt, node_rank=node_rank).first()
    if node is None or job.attempts != attempt or job.is_finished or node.state != JobState.QUEUED:
        log.info(
            "job %s attempt %s node %s: nothing to do (stale or repeated delivery)",
            job_id,
            attempt,
            node_rank,
        )
        return "skipped"
    JobNode.objects.filter(pk=node.pk).update(node_name=node_name())
    workdir = job_dir(job, attempt)
    try:
        endpoint = rendezvous_endpoint(job, attempt, node_rank)
    except TimeoutError as exc:
        services.job_fail(job_id=job.pk, human=str(exc))
        return "failed"
    config_path = workdir / f"config-node{node_rank}.json"
    config = {**job.config, "job_id": str(job.pk), "redis_url": settings.REDIS_URL}
    config_path.write_text(json.dumps(config))
    # torchrun's c10d rendezvous hands out global ranks in joining order and ignores --node-rank, so global
    # rank 0 (the one that writes the summary) may run under any node's agent: every node asks for one.
    summary_path = workdir / f"summary-node{node_rank}.json"
    log_path = workdir / f"node{node_rank}.log"
    cmd = render_torchrun_command(
        str(config_path),
        job.nnodes,
        job.nproc_per_node,
        node_rank,
        endpoint,
        run_id=f"job{job.pk}-a{attempt}",
        max_restarts=0,
        summary_path=str(summary_path),
    )
    log.info("job %s node %s: %s", job.pk, node_rank, " ".join(cmd))
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=settings.BASE_DIR,
            env=torchrun_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    services.node_started(node=node, pid=proc.pid)
    cancelled = False
    last_beat = 0.0
    while proc.poll() is None:
        if time.monotonic() - last_beat >= HEARTBEAT_EVERY_S:
            last_beat = time.monotonic()
            close_old_connections()
            if services.heartbeat(node=node):
                cancelled = True
                log.info("job %s node %s: cancel requested, stopping pid %s", job.pk, node_rank, proc.pid)
                stop_group(proc)
                break
        time.sleep(POLL_EVERY_S)
    exit_code = proc.wait()
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    close_old_connections()
    services.node_finished(
        node=node, exit_code=exit_code, cancelled=cancelled, log_tail=read_tail(log_path), summary=summary
    )
    return "cancelled" if cancelled else f"exit {exit_code}"
