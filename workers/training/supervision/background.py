"""A rank's bookkeeping writes, off the training thread: the progress file, rank 0's timeline, the step-times
line and a local run's events, written by one thread of their own in the order they were asked for.

Why: each is microseconds in isolation, but right after a step (caches cold, the file system shared with
a busy node) the SDK's calls measured 0.3-0.5 ms a step on a 2-core machine, and the progress file's
write-and-rename 0.4-3.5 ms (ext4 starts writing a file renamed over another). ``bench/sdk_overhead.py``
charges that to every step of a user's loop. Here the training thread only enqueues (a few microseconds)
and stamps each record's time itself, so what lands on disk says when it happened, not when it was written.

The training thread only appends to a deque (no lock taken, no thread woken: a queue's ``put`` wakes the
writer and hands it the interpreter lock once per call: ~10 us a call under a profiler, and a few percent of a
16 ms step in GIL hand-overs), and this thread takes what has gathered every :data:`LINGER_S`. So a record
reaches its file within about ``LINGER_S`` of being asked for, and the writer runs ten times a second however
fast the steps are.

What a kill can lose: what was asked for in the last ``LINGER_S`` (plus the write in progress), as if the rank
had died that much earlier. :meth:`BackgroundCalls.flush` runs before a snapshot is taken, so every step a
snapshot covers has its lines on disk before the snapshot can become a resume point, and at exit. A deque and
a thread rather than an executor: the order of the calls is the point, and a failed write must be counted
and said once, not kept in a future nobody reads.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

LINGER_S = 0.1
"""How often the writer takes what the training thread asked for (and the most a record waits for it)."""

_STOP = object()


class BackgroundCalls:
    """Calls run in order on one daemon thread. After :meth:`close` a call runs at once, in the caller."""

    def __init__(self, name: str = "cann-train-writes", linger_s: float = LINGER_S):
        self._pending: deque = deque()  # append and popleft are atomic: the only hand-over between threads
        self._wake = threading.Event()  # set by flush and close: take what is pending now, not at the tick
        self._linger_s = linger_s
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._lock = threading.Lock()
        self.failures = 0
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> None:
        if self._closed:
            fn(*args, **kwargs)
            return
        self._pending.append((fn, args, kwargs))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every call asked for so far has run (False when ``timeout`` passed first)."""
        if self._closed:
            return True
        done = threading.Event()
        self._pending.append(done)
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Run what is pending, then stop the thread; later calls run in the caller. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._pending.append(_STOP)
            self._wake.set()
            self._thread.join(timeout)
            self._closed = True
        if self.failures > 1:
            print(f"cann-train: {self.failures} progress or event writes failed in all", file=sys.stderr)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._linger_s)
            self._wake.clear()  # before taking: a flush that sets it after this finds its marker taken below
            while self._pending:
                item = self._pending.popleft()
                if item is _STOP:
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


class DeferredPublisher:
    """A run's event publisher (``workers.training.metrics.EventPublisher``: its own thread, batching to Redis)
    handed its events on ``calls``: the training thread appends, and the publisher's queue is fed once per
    :data:`LINGER_S` instead of waking its thread every step."""

    def __init__(self, publisher, calls: BackgroundCalls):
        from workers.training.metrics import EventCount

        self.publisher = publisher
        self._calls = calls
        # counted as asked: the run's summary may be written before the writer hands the last ones over
        self.submitted = EventCount()

    def submit(self, kind: str, values: dict, step: int | None = None) -> None:
        self.submitted.add(kind, step)
        self._calls.call(self.publisher.submit, kind, values, step=step)

    def submit_later(self, kind: str, step: int | None, build: Callable[..., dict], *args) -> None:
        """:meth:`submit` of the values ``build(*args)`` makes on the writer thread (counted now)."""
        self.submitted.add(kind, step)
        self._calls.call(self._submit_built, kind, step, build, args)

    def _submit_built(self, kind: str, step: int | None, build: Callable[..., dict], args: tuple) -> None:
        self.publisher.submit(kind, build(*args), step=step)

    def close(self, timeout: float = 10.0) -> None:
        self._calls.flush(timeout)
        self.publisher.close(timeout)
