"""The Django-free supervisor the Celery node task, ``cann-train train`` and ``make run`` share: it runs a
process group, reports its start and heartbeats, and stops the whole group (children included) on a
cancel, a timeout or its own failure."""

from __future__ import annotations

import os
import sys
import time

import pytest

from workers.training.supervision.supervisor import read_tail, supervise

# a parent that starts a grandchild, writes both pids, and waits: stopping must reach the grandchild too
FAMILY = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "open(sys.argv[1], 'w').write(f'{os.getpid()} {child.pid}')\n"
    "print('family started', flush=True)\n"
    "time.sleep(120)\n"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone for our purposes
        return f.read().split()[2] != "Z"


def _wait_for(path, timeout=20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("the family never started")


def test_a_clean_exit_reports_its_code_and_log_tail(tmp_path):
    started = []
    outcome = supervise(
        [sys.executable, "-c", "print('x' * 9000); raise SystemExit(3)"],
        log_path=tmp_path / "run.log",
        on_start=started.append,
        heartbeat_every_s=0.05,
        poll_every_s=0.02,
    )
    assert outcome.exit_code == 3 and not outcome.cancelled and not outcome.timed_out
    assert len(started) == 1 and started[0] > 0
    assert outcome.log_tail == read_tail(tmp_path / "run.log") and len(outcome.log_tail) == 6000


def test_a_cancel_from_the_heartbeat_stops_the_whole_group(tmp_path):
    pids_file = tmp_path / "pids"
    beats = []

    def beat() -> bool:
        beats.append(time.monotonic())
        return pids_file.exists() and bool(pids_file.read_text())

    outcome = supervise(
        [sys.executable, "-c", FAMILY, str(pids_file)],
        log_path=tmp_path / "run.log",
        on_heartbeat=beat,
        heartbeat_every_s=0.1,
        poll_every_s=0.02,
    )
    parent, child = _wait_for(pids_file)
    assert outcome.cancelled and outcome.exit_code != 0 and len(beats) >= 1
    assert "family started" in outcome.log_tail
    time.sleep(0.2)
    assert not _alive(parent) and not _alive(child)


def test_a_timeout_stops_the_group_and_says_so(tmp_path):
    pids_file = tmp_path / "pids"
    outcome = supervise(
        [sys.executable, "-c", FAMILY, str(pids_file)], log_path=tmp_path / "run.log", timeout_s=3
    )
    parent, child = _wait_for(pids_file)
    assert outcome.timed_out and not outcome.cancelled
    time.sleep(0.2)
    assert not _alive(child)


def test_a_failing_heartbeat_leaves_no_unsupervised_ranks(tmp_path):
    pids_file = tmp_path / "pids"

    def beat() -> bool:
        if pids_file.exists() and pids_file.read_text():
            raise RuntimeError("the supervisor itself broke")
        return False

    with pytest.raises(RuntimeError, match="supervisor itself broke"):
        supervise(
            [sys.executable, "-c", FAMILY, str(pids_file)],
            log_path=tmp_path / "run.log",
            on_heartbeat=beat,
            heartbeat_every_s=0.05,
            poll_every_s=0.02,
        )
    parent, child = _wait_for(pids_file)
    time.sleep(0.2)
    assert not _alive(parent) and not _alive(child)


def test_a_slow_poll_does_not_hold_up_the_heartbeats(tmp_path):
    """The reaper calls a supervisor dead when its beats stop: a poll that takes long (a fresh worker's
    first import of torch) must not stop them."""
    beats, polls = [], []

    def slow_poll() -> None:
        polls.append(time.monotonic())
        time.sleep(0.8)

    supervise(
        [sys.executable, "-c", "import time; time.sleep(2.5)"],
        log_path=tmp_path / "run.log",
        on_heartbeat=lambda: beats.append(time.monotonic()) and False,
        on_poll=slow_poll,
        heartbeat_every_s=0.1,
        poll_every_s=0.02,
    )
    gaps = [b - a for a, b in zip(beats, beats[1:], strict=False)]
    # polls of 0.8 s each: beats taken between them would be ~4; on their own thread ~25
    assert len(polls) >= 2 and len(beats) >= 10 and max(gaps) < 0.6, (len(beats), max(gaps, default=None))


def test_the_heartbeat_thread_says_when_it_ends(tmp_path):
    from threading import current_thread

    threads = []
    supervise(
        [sys.executable, "-c", "import time; time.sleep(0.3)"],
        log_path=tmp_path / "run.log",
        on_heartbeat=lambda: threads.append(current_thread().name) and False,
        after_heartbeats=lambda: threads.append(("after", current_thread().name)),
        heartbeat_every_s=0.05,
    )
    assert threads[-1] == ("after", "supervisor-heartbeats") and threads[0] == "supervisor-heartbeats"
