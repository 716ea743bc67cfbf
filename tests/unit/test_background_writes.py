"""The SDK's bookkeeping writes off the training thread (workers.training.supervision.background): in order,
stamped when asked for, all on disk after a flush or close, a failed write counted without stopping the
ones after it; and the stop request looked at with one stat while nothing changed."""

from __future__ import annotations

import json
import threading
import time

from workers.training.supervision import stop_now
from workers.training.supervision.background import BackgroundCalls, DeferredProgress, DeferredStepTimes
from workers.training.supervision.progress import TIMELINE, ProgressWriter, read_progress
from workers.training.supervision.step_times import StepTimesReader, StepTimesWriter


def test_calls_run_in_order_and_flush_waits_for_them():
    calls = BackgroundCalls()
    gate = threading.Event()
    seen: list[int] = []
    calls.call(gate.wait, 5)  # the thread is busy: what follows waits in the queue, in order
    for i in range(200):
        calls.call(seen.append, i)
    assert seen == []
    gate.set()
    assert calls.flush(timeout=5)
    assert seen == list(range(200))
    calls.close()
    calls.call(seen.append, 200)  # after close: at once, in the caller
    assert seen[-1] == 200
    calls.close()  # idempotent


def test_a_failed_write_is_counted_and_the_next_ones_still_run(capsys):
    calls = BackgroundCalls()
    seen = []

    def broken():
        raise OSError(28, "No space left on device")

    calls.call(broken)
    calls.call(broken)
    calls.call(seen.append, "after")
    calls.close()
    assert seen == ["after"]
    assert calls.failures == 2
    assert capsys.readouterr().err.count("No space left on device") == 1  # said once


def test_deferred_lines_carry_the_time_they_were_asked_for(tmp_path):
    calls = BackgroundCalls()
    gate = threading.Event()
    calls.call(gate.wait, 5)
    progress = DeferredProgress(ProgressWriter(tmp_path, 0, restart=0), calls)
    steps = DeferredStepTimes(StepTimesWriter(tmp_path, 0, restart=0), calls)
    asked = time.time()
    progress.update("training", 7)
    progress.event("step", step=7, loss=1.5)
    steps.record(7, wait_s=0.0, step_time_s=0.02)
    time.sleep(0.3)  # written only after this, but stamped before it
    gate.set()
    progress.close()
    steps.close()
    calls.close()
    doc = read_progress(tmp_path)[0]
    assert doc["step"] == 7 and doc["phase"] == "training"
    assert asked <= doc["t"] < asked + 0.25
    (line,) = [json.loads(x) for x in (tmp_path / TIMELINE).read_text().splitlines()]
    assert line["event"] == "step" and asked <= line["t"] < asked + 0.25
    (record,) = StepTimesReader(tmp_path).read_new()
    assert record["step"] == 7 and record["step_s"] == 0.02 and asked <= record["t"] < asked + 0.25


def test_a_stop_request_is_seen_changed_and_gone(tmp_path):
    requests = stop_now.StopRequests(tmp_path)
    assert requests.pending() is None
    stop_now.request_stop(tmp_path, reason="cancelled by alice")
    assert requests.pending()["reason"] == "cancelled by alice"
    assert requests.pending()["reason"] == "cancelled by alice"  # unchanged: the one it read
    time.sleep(0.01)  # a new modification time on file systems with coarse clocks
    stop_now.request_stop(tmp_path, reason="drained")
    assert requests.pending()["reason"] == "drained"
    stop_now.clear(tmp_path)
    assert requests.pending() is None
