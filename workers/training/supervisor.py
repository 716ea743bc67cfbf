"""Start and supervise one node's ``torchrun`` agent (or any process group): Django-free, with callbacks.

The Celery task that runs a job's node, the ``cann-train`` CLI and ``make run``'s stack share it. The
supervised process runs in its own session, so stopping it stops the whole process group (agent and
ranks), and it dies with the thread that started it (``PR_SET_PDEATHSIG``), so a killed worker leaves no
orphan ranks behind. The caller decides what a heartbeat means (the web records it in its database and
answers whether a cancel was asked for).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_EVERY_S = 2.0
POLL_EVERY_S = 0.25
KILL_GRACE_S = 10.0
RDZV_WAIT_S = 120.0
LOG_TAIL_CHARS = 6000
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def node_name() -> str:
    """This worker's node: ``CANN_TRAIN_NODE`` or the host name. Its Celery queue is ``node.<name>``."""
    return os.environ.get("CANN_TRAIN_NODE") or socket.gethostname()


def node_address() -> str:
    """The address other nodes reach this one at (rendezvous endpoint when it is node 0)."""
    return os.environ.get("CANN_TRAIN_NODE_ADDR", "127.0.0.1")


def die_with_parent() -> None:
    """``preexec_fn``: runs in the child between fork and exec; SIGTERM when the parent thread exits."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_groups(procs: Sequence[subprocess.Popen], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM each process group, wait up to ``grace_s`` in all, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def stop_group(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    stop_groups([proc], grace_s)


def read_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` bytes of a log file as text ("" when it does not exist)."""
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - chars))
        return f.read().decode(errors="replace")


def rendezvous_endpoint(redis, key: str, node_rank: int, *, address: str, wait_s: float = RDZV_WAIT_S) -> str:
    """Node 0 picks a free port on its address and announces ``host:port`` under ``key`` in Redis; the
    other nodes wait for it (``TimeoutError`` after ``wait_s``)."""
    if node_rank == 0:
        from workers.training.launch import free_port

        endpoint = f"{address}:{free_port(address)}"
        redis.set(key, endpoint, ex=24 * 3600)
        return endpoint
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if value := redis.get(key):
            return value.decode()
        time.sleep(0.2)
    raise TimeoutError(f"node 0 did not announce its rendezvous endpoint ({key}) within {wait_s:.0f}s")


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    cancelled: bool
    log_tail: str
    timed_out: bool = False


def supervise(
    cmd: Sequence[str],
    *,
    log_path: Path,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    on_start: Callable[[int], None] = lambda pid: None,
    on_heartbeat: Callable[[], bool] = lambda: False,
    heartbeat_every_s: float = HEARTBEAT_EVERY_S,
    poll_every_s: float = POLL_EVERY_S,
    timeout_s: float | None = None,
) -> Outcome:
    """Run ``cmd`` in its own session with stdout+stderr appended to ``log_path`` until it exits.

    ``on_start(pid)`` is called once it runs; ``on_heartbeat()`` every ``heartbeat_every_s`` while it
    runs, and returning True stops the group (a cancel). After ``timeout_s`` the group is stopped too.
    Any exception (Ctrl-C included) stops the group before it propagates. Returns the exit code, whether
    it was cancelled or timed out, and the log's tail.
    """
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    cancelled = timed_out = False
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        on_start(proc.pid)
        last_beat = 0.0
        while proc.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                stop_group(proc)
                break
            if time.monotonic() - last_beat >= heartbeat_every_s:
                last_beat = time.monotonic()
                if on_heartbeat():
                    cancelled = True
                    stop_group(proc)
                    break
            time.sleep(poll_every_s)
    except BaseException:
        stop_group(proc)  # the supervisor itself failed: leave no unsupervised ranks behind
        raise
    exit_code = proc.wait()
    return Outcome(
        exit_code=exit_code, cancelled=cancelled, log_tail=read_tail(log_path), timed_out=timed_out
    )
