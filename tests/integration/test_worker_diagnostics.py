"""A worker asked what it is doing (SIGUSR2) writes every thread's stack into its log and goes on working:
what a failing test prints about its stacks (``tests/conftest.py`` ``stacks_at_failure``). A worker that
supervises nodes imported their watches (torch) before its first task."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import stacks_at_failure

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_sigusr1_dumps_every_worker_thread_and_the_worker_goes_on(live_stack):
    worker, log = live_stack.procs["worker"], live_stack.logs["worker"]
    before = log.stat().st_size
    os.kill(worker.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while "most recent call first" not in (dump := log.read_bytes()[before:].decode(errors="replace")):
        assert time.monotonic() < deadline, "no stack dump in the worker's log"
        time.sleep(0.1)
    time.sleep(0.5)  # the rest of the dump
    dump = log.read_bytes()[before:].decode(errors="replace")
    threads = dump.count("Thread 0x") + dump.count("Current thread 0x")
    assert threads >= 2, dump  # the pool's threads beside the consumer's
    assert "celery" in dump, dump  # frames of the worker itself
    assert worker.poll() is None, "SIGUSR2 must not stop the worker"
    health = live_stack.wait_healthy()  # 200 only when the worker answers a ping after its dump
    assert health["checks"]["celery"]["ok"], health

    report = stacks_at_failure()
    assert str(log) in report and report.count("most recent call first") >= 2  # this dump and its own


def test_a_training_worker_imports_node_supervision_before_its_first_task(live_stack):
    log = live_stack.logs["worker"].read_text(errors="replace")
    warmed, ready = log.find("node supervision imported in"), log.find(" ready.")
    assert 0 <= warmed < ready, log[-3000:]
