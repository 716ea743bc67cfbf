"""Start and supervise one node's ``torchrun`` agent (or any process group): Django-free, with callbacks.

The Celery task that runs a job's node, the ``cann-train`` CLI and ``make run``'s stack share it. The
supervised process runs in its own session, so stopping it stops the whole process group (agent and
ranks), and it dies with the thread that started it (``PR_SET_PDEATHSIG``), so a killed worker leaves no
orphan ranks behind. The caller decides what a heartbeat means (the web records it in its database and
answers whether a cancel was asked for).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_EVERY_S = 2.0
POLL_EVERY_S = 0.25
KILL_GRACE_S = 10.0
# a beat this many intervals slow to record is logged (so is one woken an interval late)
SLOW_BEAT_FACTOR = 2.0
RDZV_WAIT_S = 120.0
LOG_TAIL_CHARS = 6000
OUTPUT_EVERY_S = 1.0
"""``on_output`` gets the new log lines at most this often (a batch per call)."""
OUTPUT_MAX_LINES = 200
"""At most this many lines per batch; more in one interval are cut to the newest, with a line saying so."""
OUTPUT_MAX_LINE_CHARS = 1000
OUTPUT_MAX_READ_BYTES = 1 << 20
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
log = logging.getLogger(__name__)


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


# Lines of a node's log that tell its reader nothing: torchrun's OMP_NUM_THREADS banner, the profiler's
# start/stop markers (a pair per rank and profiled step), library deprecation warnings (with the source line
# Python prints under each), and torchrun's own chatter when it is stopped (a cancel, a timeout).
# (torchrun's own entry point prints the banner bare; called as a library, as workers.training.supervision.agent does,
# the first line comes through its logger: "W1130 22:05:31.5 17152 .../run.py:874] Setting OMP_...")
_BANNER = re.compile(
    r"^\*{20,}\s*$|^(?:[WI]\d{4} .*\] )?Setting OMP_NUM_THREADS environment variable for each process"
)
_PROFILER = re.compile(r"\bprofiler_(start|stop)\b|ActivityProfiler|^STAGE:\d{4}-")
_DEPRECATION = re.compile(r":\d+: (FutureWarning|DeprecationWarning|PendingDeprecationWarning): ")
_SHUTDOWN = re.compile(r"Received \d+ death signal|closing signal SIG[A-Z]+")
_STOPPED = re.compile(r"\bSignalException\b")
_TRACEBACK_MAX_LINES = 400


class LogFilter:
    """Drops the noise lines of a node's log (lines in, kept lines out), fed in pieces as the file grows.

    Stateful: the indented source line under a dropped warning goes with it, and a traceback is held back
    until its last line says what it is: torchrun's reaction to being stopped (``SignalException``, a
    cancel or a timeout: dropped, the job's state says why it ended) or a real error (kept whole). Lines
    keep their line ends, if any."""

    def __init__(self):
        self._kept_any = False
        self._after_warning = False
        self._traceback: list[str] | None = None

    def feed(self, lines: Sequence[str]) -> list[str]:
        out: list[str] = []
        for line in lines:
            out.extend(self._one(line))
        return out

    def flush(self) -> list[str]:
        """What is held back (a traceback that has not ended yet)."""
        held, self._traceback = self._traceback or [], None
        return held

    def _one(self, line: str) -> list[str]:
        text = line.rstrip("\r\n")
        if self._traceback is not None:
            self._traceback.append(line)
            if text and not text[0].isspace():  # the exception line closes the block
                block, self._traceback = self._traceback, None
                return [] if _STOPPED.search(text) else self._keep(block)
            if len(self._traceback) > _TRACEBACK_MAX_LINES:
                return self._keep(self.flush())
            return []
        after_warning, self._after_warning = self._after_warning, False
        if after_warning and text.startswith("  "):
            return []
        if text.startswith("Traceback (most recent call last)"):
            self._traceback = [line]
            return []
        if _DEPRECATION.search(text):
            self._after_warning = True
            return []
        if _BANNER.search(text) or _PROFILER.search(text) or _SHUTDOWN.search(text) or _STOPPED.search(text):
            return []
        if not text.strip() and not self._kept_any:  # the blank lines around torchrun's banner
            return []
        return self._keep([line])

    def _keep(self, lines: list[str]) -> list[str]:
        self._kept_any = self._kept_any or bool(lines)
        return lines


def filtered_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log, its noise left out (``LogFilter``)."""
    lines = read_tail(path, 8 * chars).splitlines(keepends=True)
    noise = LogFilter()
    return "".join(noise.feed(lines) + noise.flush())[-chars:]


class LogFollower:
    """What a growing log file gained since the last call, as whole lines (no line ends), noise left out."""

    def __init__(self, path: Path, offset: int = 0):
        self.path, self.offset = path, offset
        self._partial = b""
        self._filter = LogFilter()

    def read_new(self, *, final: bool = False) -> list[str]:
        """The new complete lines; ``final``: the last, unterminated one and any held-back lines too."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(OUTPUT_MAX_READ_BYTES)
        except OSError:
            data = b""
        self.offset += len(data)
        pieces = (self._partial + data).split(b"\n")
        self._partial = pieces.pop()
        if final and self._partial:
            pieces.append(self._partial)
            self._partial = b""
        lines = [p.decode(errors="replace").rstrip("\r")[:OUTPUT_MAX_LINE_CHARS] for p in pieces]
        kept = self._filter.feed(lines)
        return kept + self._filter.flush() if final else kept


def _batch(lines: list[str]) -> list[str]:
    """At most ``OUTPUT_MAX_LINES`` of the newest lines, the first saying how many were left out."""
    if len(lines) <= OUTPUT_MAX_LINES:
        return lines
    newest = lines[len(lines) - OUTPUT_MAX_LINES + 1 :]
    left_out = len(lines) - len(newest)
    return [f"… {left_out:,} lines left out here (the node's log file has them)", *newest]


def rendezvous_endpoint(
    redis,
    key: str,
    node_rank: int,
    *,
    address: str,
    wait_s: float = RDZV_WAIT_S,
    on_wait: Callable[[], object] = lambda: None,
) -> str:
    """Node 0 picks a free port on its address and announces ``host:port`` under ``key`` in Redis; the
    other nodes wait for it (``TimeoutError`` after ``wait_s``), calling ``on_wait()`` every
    ``HEARTBEAT_EVERY_S`` meanwhile (a waiting node is alive)."""
    if node_rank == 0:
        from workers.training.launch import free_port

        endpoint = f"{address}:{free_port(address)}"
        redis.set(key, endpoint, ex=24 * 3600)
        return endpoint
    deadline = time.monotonic() + wait_s
    last_beat = time.monotonic()
    while time.monotonic() < deadline:
        if value := redis.get(key):
            return value.decode()
        if time.monotonic() - last_beat >= HEARTBEAT_EVERY_S:
            last_beat = time.monotonic()
            on_wait()
        time.sleep(0.2)
    raise TimeoutError(f"node 0 did not announce its rendezvous endpoint ({key}) within {wait_s:.0f}s")


def _quietly(call: Callable[[], None]) -> None:
    try:
        call()
    except Exception:  # a watcher's failure must not stop the training it watches
        log.warning("on_poll failed", exc_info=True)


class _Heartbeats(threading.Thread):
    """``supervise``'s heartbeats, on a thread of their own: a slow poll (the first snapshot verified by a
    fresh worker imports torch: 8.6 and 13.2 s measured under the test suite's load) must not make a live
    supervisor look dead; with the beats in the polling loop the reaper gave up such a worker after its
    6 s timeout and started the job a third time while the second attempt still trained. The beat's verdict
    (stop the group) or its exception is left for the supervising loop."""

    def __init__(self, beat: Callable[[], bool], every_s: float, after: Callable[[], None]):
        super().__init__(name="supervisor-heartbeats", daemon=True)
        self._beat, self._every_s, self._after = beat, every_s, after
        self._done = threading.Event()
        self.wants_stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        due = None
        try:
            while not self._done.is_set():
                started = time.monotonic()
                if due is not None and started - due > self._every_s:
                    # woken this late: the process did not run this thread (a thread holding the GIL, an
                    # overloaded machine); the control plane's reaper sees the same gap
                    log.warning("heartbeat %.1f s late (every %.1f s)", started - due, self._every_s)
                if self._beat():
                    self.wants_stop.set()
                    return
                if (took := time.monotonic() - started) > SLOW_BEAT_FACTOR * self._every_s:
                    log.warning("heartbeat took %.1f s to record (every %.1f s)", took, self._every_s)
                due = time.monotonic() + self._every_s
                self._done.wait(self._every_s)
        except BaseException as exc:  # noqa: BLE001 - handed to the supervising loop, which raises it
            self.error = exc
            self.wants_stop.set()
        finally:
            try:
                self._after()
            except Exception:  # noqa: BLE001 - the run's outcome matters more than a connection left open
                log.warning("after_heartbeats failed", exc_info=True)

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():  # a beat may wait on its database; the run's outcome does not wait long
            self.join(timeout=KILL_GRACE_S)


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    cancelled: bool
    log_tail: str
    timed_out: bool = False
    lost: bool = False
    """The process was killed by a signal nobody here sent (an OOM kill, ``kill -9`` of the node's torchrun
    agent): its processes left behind were stopped, and the caller may resume the run as after a lost
    worker, not fail it as after a rank's error."""


def supervise(
    cmd: Sequence[str],
    *,
    log_path: Path,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    on_start: Callable[[int], None] = lambda pid: None,
    on_heartbeat: Callable[[], bool] = lambda: False,
    after_heartbeats: Callable[[], None] = lambda: None,
    on_output: Callable[[list[str]], None] | None = None,
    on_poll: Callable[[], None] | None = None,
    heartbeat_every_s: float = HEARTBEAT_EVERY_S,
    poll_every_s: float = POLL_EVERY_S,
    output_every_s: float = OUTPUT_EVERY_S,
    timeout_s: float | None = None,
) -> Outcome:
    """Run ``cmd`` in its own session with stdout+stderr appended to ``log_path`` until it exits.

    ``on_start(pid)`` is called once it runs; ``on_heartbeat()`` every ``heartbeat_every_s`` while it
    runs, on a thread of its own (``after_heartbeats()`` on that thread as it ends: a database connection of
    its own to close), and returning True stops the group (a cancel); an exception it raises stops the
    group too, and is raised here. After ``timeout_s`` the group is stopped too.
    ``on_output(lines)`` follows the log: the lines written since its last call, noise left out
    (``LogFilter``), at most every ``output_every_s`` and ``OUTPUT_MAX_LINES`` at a time, and once more
    with the last lines when the process has ended; an exception it raises is logged, never stops the run.
    ``on_poll()`` is called every ``poll_every_s`` while it runs and once after it ended (an elastic watch:
    progress, hangs, fault injection), unless it was ``lost``; an exception it raises is logged too.
    Any other exception (Ctrl-C included) stops the group before it propagates. Returns the exit code,
    whether it was cancelled or timed out, and the log's tail (noise left out too).
    """

    def emit(lines: list[str]) -> None:
        if not lines or on_output is None:
            return
        try:
            on_output(_batch(lines))
        except Exception:  # a publishing failure must not stop the training it reports on
            log.warning("on_output failed; %d log line(s) not passed on", len(lines), exc_info=True)

    with log_path.open("ab") as out:
        follower = LogFollower(log_path, offset=out.tell())
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
    beats = _Heartbeats(on_heartbeat, heartbeat_every_s, after_heartbeats)
    try:
        on_start(proc.pid)
        beats.start()
        last_output = 0.0
        while proc.poll() is None:
            if beats.wants_stop.is_set():
                if beats.error is not None:
                    raise beats.error
                cancelled = True
                stop_group(proc)
                break
            if on_poll is not None:
                _quietly(on_poll)
            if on_output is not None and time.monotonic() - last_output >= output_every_s:
                last_output = time.monotonic()
                emit(follower.read_new())
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                stop_group(proc)
                break
            time.sleep(poll_every_s)
    except BaseException:
        stop_group(proc)  # the supervisor itself failed: leave no unsupervised ranks behind
        raise
    finally:
        beats.stop()
    if beats.error is not None:  # it failed as the run ended, too late to stop it: said, not raised
        log.warning("the last heartbeat failed as the run ended", exc_info=beats.error)
    exit_code = proc.wait()
    lost = exit_code < 0 and not cancelled and not timed_out
    if lost:
        # the agent died under its ranks (forked children, no death signal of their own): they would train on
        # unsupervised, or wait in a collective; the session's group goes with it
        log.warning("the supervised process was killed by signal %d; stopping what it left", -exit_code)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(0.5 if sig == signal.SIGTERM else 0)
    if on_poll is not None and not lost:  # (lost: the ranks a watch would find gone were stopped here)
        _quietly(on_poll)
    if on_output is not None:
        emit(follower.read_new(final=True))
    return Outcome(
        exit_code=exit_code,
        cancelled=cancelled,
        log_tail=filtered_tail(log_path),
        timed_out=timed_out,
        lost=lost,
    )
