"""A rank's bookkeeping writes, off the training thread: the progress file, rank 0's timeline, the step-times
line and a local run's events, written by one thread of their own in the order they were asked for.

Why: each is microseconds in isolation, but right after a step (caches cold, the file system shared with
a busy node) the SDK's calls measured 0.3-0.5 ms a step on a 2-core machine, and the progress file's
write-and-rename 0.4-3.5 ms (ext4 starts writing a file renamed over another). ``bench/sdk_overhead.py``
charges that to every step of a user's loop. Here the training thread only enqueues (a few microseconds)
and stamps each record's time itself, so what lands on disk says when it happened, not when it was written.

What a kill can lose: a record waits for this thread for as long as the writes before it take, so a
SIGKILLed rank loses at most the last of them, as if it had died a moment earlier. Nothing is held back on
purpose (no batching window), and :meth:`BackgroundCalls.flush` runs before a snapshot is taken, so every
step a snapshot covers has its lines on disk before the snapshot can become a resume point. A plain
``queue`` and thread rather than an executor: the order of the calls is the point, and a failed write
must be counted and said once, not kept in a future nobody reads.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class BackgroundCalls:
    """Calls run in order on one daemon thread. After :meth:`close` a call runs at once, in the caller."""

    def __init__(self, name: str = "cann-train-writes"):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._lock = threading.Lock()
        self.failures = 0
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> None:
        if self._closed:
            fn(*args, **kwargs)
            return
        self._queue.put((fn, args, kwargs))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every call asked for so far has run (False when ``timeout`` passed first)."""
        if self._closed:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Run what is queued, then stop the thread; later calls run in the caller. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._queue.put(None)
            self._thread.join(timeout)
            self._closed = True
        if self.failures > 1:
            print(f"cann-train: {self.failures} progress or event writes failed in all", file=sys.stderr)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            fn, args, kwargs = item
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a full disk must not stop the training thread
                self.failures += 1
                if self.failures == 1:
                    print(f"cann-train: a progress or event write failed ({exc!r}); training goes on",
                          file=sys.stderr)  # fmt: skip


class DeferredProgress:
    """A :class:`~workers.training.supervision.progress.ProgressWriter` whose writes run on ``calls``."""

    def __init__(self, writer, calls: BackgroundCalls):
        self.writer = writer
        self._calls = calls

    def update(self, phase: str, step: int | None = None) -> None:
        self._calls.call(self.writer.update, phase, step, t=time.time())

    def event(self, event: str, **values) -> None:
        values.setdefault("t", time.time())
        self._calls.call(self.writer.event, event, **values)

    def close(self) -> None:
        self._calls.call(self.writer.close)


class DeferredStepTimes:
    """A :class:`~workers.training.supervision.step_times.StepTimesWriter` whose lines are written on
    ``calls``; the caller gives the step's duration, and the line's time is taken here."""

    def __init__(self, writer, calls: BackgroundCalls):
        self.writer = writer
        self._calls = calls

    def record(self, step: int, *, wait_s: float | None = None, step_time_s: float | None = None) -> None:
        self._calls.call(self.writer.record, step, wait_s=wait_s, step_time_s=step_time_s, at=time.time())

    def close(self) -> None:
        self._calls.call(self.writer.close)
