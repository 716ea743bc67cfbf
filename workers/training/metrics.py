"""Per-step figures and their publication.

Rank 0 publishes ``kind="train"`` events to Redis stream ``job/<id>`` (``workers.events`` format) with
torchtitan-style keys, and ``kind="event"`` for the lifecycle (``started``, ``finished``, ``failed``).
Other ranks contribute through the one small all-reduce the trainer already does per step (gradient norm,
loss, expert load). Publishing happens on a background thread: the training loop only enqueues a dict.
Lifecycle events carry ``request_id`` when the run was launched with ``CANN_TRAIN_REQUEST_ID`` set (the
control-plane request that started it).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import uuid
from dataclasses import dataclass

# Profiler event names that are communication (c10d collectives, their backend kernels, pipeline p2p).
COMM_MARKERS = (
    "c10d::",
    "gloo:",
    "nccl:",
    "hccl",
    "ncclkernel",
    "allreduce",
    "all_reduce",
    "allgather",
    "all_gather",
    "reduce_scatter",
    "reducescatter",
    "all_to_all",
    "alltoall",
    "broadcast",
    "send",
    "recv",
)


_NOTHING = object()  # "no new item within the retry back-off" (None means: close)


class EventCount:
    """What a rank asked to publish: events by kind, and the first and last step of its ``train`` events. The
    run's summary carries it (``events_submitted``) so that the control plane can count what was stored
    against it and say what a Redis that lost its data lost (``controlplane.jobs.services.delivery``)."""

    def __init__(self):
        self.by_kind: dict[str, int] = {}
        self.train_steps: list[int] | None = None

    def add(self, kind: str, step: int | None) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if kind == "train" and step is not None:
            first, last = self.train_steps or (step, step)
            self.train_steps = [min(first, step), max(last, step)]

    def to_dict(self) -> dict:
        return {"by_kind": dict(self.by_kind), "train_steps": self.train_steps}


class EventPublisher:
    """Publishes events from a background thread (batched with ``publish_many``) so that a slow Redis
    never stalls a step. ``submit`` is an O(1) enqueue; ``submit_seconds`` accumulates what it cost the
    training thread (the overhead bench reports it against step time)."""

    def __init__(self, redis_url: str, job_id: str):
        import redis

        from workers.events import GUARD_ENV, EventWriter

        self.stream = f"job/{job_id}"
        # the control-plane request that launched the run (controlplane.common.logs): lifecycle events say it
        self.request_id = os.environ.get("CANN_TRAIN_REQUEST_ID") or None
        self._writer = EventWriter(redis.Redis.from_url(redis_url))
        # launched by the control plane: appends wait for the stream's counter (a Redis that lost its data
        # gets it back from the relay) instead of numbering from 1 again (workers.events)
        self.guarded = os.environ.get(GUARD_ENV) == "1"
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="event-publisher", daemon=True)
        self.submit_seconds = 0.0
        self.submitted = EventCount()
        self.published = 0
        self.errors = 0
        self.dropped = 0
        self._close_deadline = float("inf")
        self._thread.start()

    def submit(self, kind: str, values: dict, step: int | None = None) -> None:
        t0 = time.perf_counter()
        self.submitted.add(kind, step)
        if kind == "event" and self.request_id and "request_id" not in values:
            values = {**values, "request_id": self.request_id}
        # a token per event: a batch retried after Redis went down mid-reply appends each event once
        self._queue.put((kind, step, values, uuid.uuid4().hex))
        self.submit_seconds += time.perf_counter() - t0

    # events kept while Redis is unreachable (a restart takes seconds; a step publishes one or two events);
    # beyond this the oldest are dropped and counted
    MAX_PENDING = 100_000
    RETRY_MAX_S = 5.0

    def _run(self) -> None:
        pending: list = []
        closing = False
        backoff = 0.2
        while True:
            item = self._queue.get() if not pending else self._get_within(backoff)
            while item is not None:
                if item is not _NOTHING:
                    pending.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            closing = closing or item is None
            if pending:
                try:
                    self._writer.publish_many(self.stream, pending, guarded=self.guarded)
                    self.published += len(pending)
                    pending, backoff = [], 0.2
                except Exception as exc:  # Redis down: training goes on, the events wait here and are retried
                    self.errors += 1
                    if self.errors == 1:
                        print(
                            f"cann-train: publishing to {self.stream} failed ({exc}); retrying",
                            file=sys.stderr,
                        )
                    if len(pending) > self.MAX_PENDING:
                        self.dropped += len(pending) - self.MAX_PENDING
                        pending = pending[-self.MAX_PENDING :]
                    backoff = min(backoff * 2, self.RETRY_MAX_S)
                    if closing and time.monotonic() > self._close_deadline:
                        self.dropped += len(pending)
                        print(
                            f"cann-train: {len(pending)} event(s) for {self.stream} not published: Redis "
                            "did not come back before the run ended",
                            file=sys.stderr,
                        )
                        return
            if closing and not pending:
                return

    def _get_within(self, seconds: float):
        try:
            return self._queue.get(timeout=seconds)
        except queue.Empty:
            return _NOTHING

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued (retrying while Redis is away, for at most ``timeout`` seconds)."""
        self._close_deadline = time.monotonic() + timeout
        self._queue.put(None)
        self._thread.join(timeout + 1.0)


class NullPublisher:
    """No job id / Redis: nothing is published (the CLI prints a summary instead)."""

    submit_seconds = 0.0
    published = 0
    errors = 0
    dropped = 0

    def submit(self, kind: str, values: dict, step: int | None = None) -> None:
        pass

    def submit_later(self, kind: str, step: int | None, build, *args) -> None:
        pass

    def close(self, timeout: float = 0.0) -> None:
        pass


@dataclass
class CommComputeSplit:
    """Wall time of one profiled step covered by communication, by computation, and by both."""

    comm_s: float
    compute_s: float
    overlap_s: float

    @property
    def exposed_comm_s(self) -> float:
        return self.comm_s - self.overlap_s


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_comm_event(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in COMM_MARKERS)


def split_comm_compute(events) -> CommComputeSplit:
    """From ``torch.profiler`` events of one step: communication = union of the intervals of collective
    and p2p ops (any thread, device kernels included); computation = union of the other top-level ops.
    Overlap is where both run at once (e.g. DDP's bucketed all-reduce during backward)."""
    comm, compute = [], []
    for ev in events:
        start, end = ev.time_range.start / 1e6, ev.time_range.end / 1e6  # us -> s
        if end <= start:
            continue
        if is_comm_event(ev.name):
            comm.append((start, end))
        elif ev.cpu_parent is None and not ev.name.startswith("ProfilerStep"):
            compute.append((start, end))
    comm_u, compute_u = _union(comm), _union(compute)
    return CommComputeSplit(_length(comm_u), _length(compute_u), _intersection(comm_u, compute_u))
