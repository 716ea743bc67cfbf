"""Per-step communication timing of a DDP comm hook: total, exposed (not hidden under backward), bytes.

How exposed time is measured. DDP calls the hook for bucket i as soon as bucket i's gradients are ready,
in bucket order, on the autograd thread; backward returns only after every bucket's future is complete.
The hook entry of the *last* bucket marks the end of backward computation (its gradients were the last
to be produced). From that moment on, everything the step waits for is communication that did not hide
under compute. Before that moment, only the time the autograd thread itself spends inside the hooks
(compressing, packing, launching) delays backward. So, per step::

    comm_s_exposed = sum(sync time inside hooks of buckets 0..B-2) + (t_all_done - t_enter_last_bucket)
    comm_s_total   = sum over buckets of (t_bucket_done - t_bucket_enter)   # compression + wire + decode

``comm_s_total`` may exceed the step's wall time because buckets overlap each other. ``bytes_sent`` is
the payload this rank contributes to collectives (the compressed message, counted honestly: indices,
values, scales, padding); ``wire_bytes`` estimates what the rank actually transmits under a ring
algorithm (all-reduce 2(W-1)/W * S, all-gather (W-1) * S; Patarasuk & Yuan 2009).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


def ring_all_reduce_wire_bytes(payload_bytes: int, group_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of ``payload_bytes`` (Patarasuk & Yuan 2009)."""
    return 0 if group_size <= 1 else 2 * (group_size - 1) * payload_bytes // group_size


def all_gather_wire_bytes(payload_bytes: int, group_size: int) -> int:
    """Bytes one rank sends in a ring all-gather where each rank contributes ``payload_bytes``."""
    return (group_size - 1) * payload_bytes


@dataclass
class _StepRecord:
    step: int
    buckets: int = 0
    closed: bool = False
    comm_s_total: float = 0.0
    sync_s_before_last: float = 0.0
    t_enter_last: float | None = None
    t_all_done: float = 0.0
    pending: int = 0
    bytes_sent: int = 0
    wire_bytes: int = 0
    dense_bytes: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        exposed = self.sync_s_before_last
        if self.t_enter_last is not None:
            exposed += max(0.0, self.t_all_done - self.t_enter_last)
        return {
            "step": self.step,
            "buckets": self.buckets,
            "comm_s_total": self.comm_s_total,
            "comm_s_exposed": exposed,
            "bytes_sent": self.bytes_sent,
            "wire_bytes": self.wire_bytes,
            "dense_fp32_bytes": self.dense_bytes,
            "compression_ratio": (self.dense_bytes / self.bytes_sent) if self.bytes_sent else 1.0,
            "complete": self.closed and self.pending == 0,
            **self.extra,
        }


class CommStats:
    """Accumulates one record per training step; thread-safe (futures complete on backend threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = _StepRecord(step=0)
        self._previous: _StepRecord | None = None

    def bucket_enter(self, is_last: bool) -> float:
        """Called first thing in the hook; returns the entry timestamp (pass it to the other calls)."""
        now = time.perf_counter()
        with self._lock:
            if self._current.closed:
                self._previous = self._current
                self._current = _StepRecord(step=self._previous.step + 1)
            rec = self._current
            rec.buckets += 1
            rec.pending += 1
            if is_last:
                rec.t_enter_last = now
                rec.closed = True
        return now

    def bucket_launched(
        self, t_enter: float, is_last: bool, *, bytes_sent: int, wire_bytes: int, dense_bytes: int
    ) -> None:
        """Called when the hook returns its future (end of the synchronous part)."""
        sync = time.perf_counter() - t_enter
        with self._lock:
            rec = self._current
            if not is_last:
                rec.sync_s_before_last += sync
            rec.bytes_sent += int(bytes_sent)
            rec.wire_bytes += int(wire_bytes)
            rec.dense_bytes += int(dense_bytes)

    def bucket_done(self, t_enter: float, record: _StepRecord | None = None) -> None:
        """Called from the future's completion callback."""
        now = time.perf_counter()
        with self._lock:
            rec = record or self._current
            rec.comm_s_total += now - t_enter
            rec.t_all_done = max(rec.t_all_done, now)
            rec.pending -= 1

    def current_record(self) -> _StepRecord:
        with self._lock:
            return self._current

    def add(self, key: str, value: float) -> None:
        with self._lock:
            self._current.extra[key] = self._current.extra.get(key, 0.0) + value

    def comm_stats(self) -> dict[str, float]:
        """Figures of the latest step whose last bucket was launched (call after ``backward()``)."""
        with self._lock:
            rec = self._current if self._current.closed or self._previous is None else self._previous
            return rec.summary()


def timed(stats: CommStats, bucket, launch, *, bytes_sent: int, wire_bytes: int, dense_bytes: int):
    """Run ``launch()`` (returns a Future of the bucket tensor) under ``stats``; returns the timed future."""
    is_last = bucket.is_last()
    t0 = stats.bucket_enter(is_last)
    record = stats.current_record()
    fut = launch()
    stats.bucket_launched(t0, is_last, bytes_sent=bytes_sent, wire_bytes=wire_bytes, dense_bytes=dense_bytes)

    def done(f):
        stats.bucket_done(t0, record)
        return f.value()

    return fut.then(done)


# ---------------------------------------------------------------------------- a rank's and a run's figures


def step_comm_figures(states) -> dict | None:
    """A rank's comm-hook figures of the step just back-propagated, summed over its DDP parts' hook
    ``states``: total and exposed communication seconds (see above) and the gradient bytes this rank put
    into collectives. Reads counters only: no communication, no sync. None without a hook."""
    if not states:
        return None
    out = {"comm_s_total": 0.0, "comm_s_exposed": 0.0, "comm_bytes": 0, "dense_fp32_bytes": 0}
    for st in states:
        figures = st.comm_stats()
        out["comm_s_total"] += figures["comm_s_total"]
        out["comm_s_exposed"] += figures["comm_s_exposed"]
        out["comm_bytes"] += int(figures["bytes_sent"])
        out["dense_fp32_bytes"] += int(figures["dense_fp32_bytes"])
        if "inter_node_bytes" in figures:
            out["inter_node_bytes"] = out.get("inter_node_bytes", 0) + int(figures["inter_node_bytes"])
        if "density" in figures:  # share of the gradient elements selected (top-k warm-up, adaptive)
            out["density_elements"] = out.get("density_elements", 0.0) + figures.get("density_elements", 0.0)
    if "density_elements" in out:
        elements = out["dense_fp32_bytes"] / 4
        out["comm_density"] = out.pop("density_elements") / elements if elements else 1.0
    return out


def run_comm_figures(measured: list[dict]) -> dict:
    """A run's comm-hook figures from a rank's :func:`step_comm_figures` of its steady steps
    (``measured``): averaged like the step time, and the last step's bytes and density. {} without any."""
    out: dict = {}
    if not measured:
        return out
    for key in (
        "comm_s_total",
        "comm_s_exposed",
        "comm_bytes",
        "dense_fp32_bytes",
        "inter_node_bytes",
        "comm_density",
    ):
        if key in measured[-1]:
            out[key] = sum(m.get(key, 0) for m in measured) / len(measured)
    # bytes of the last step: the steady state after any density / PowerSGD warm-up
    out["comm_bytes_last"] = measured[-1]["comm_bytes"]
    if "comm_density" in measured[-1]:
        out["comm_density_last"] = measured[-1]["comm_density"]
    return out


def measured_overlap(profiled: list, measured: list[dict]) -> dict:
    """The measured overlap ratio: communication hidden under compute / all communication. From the
    profiled steps where there are any (``profiled``: ``[comm seconds, hidden seconds, steps]`` summed over
    them; every collective and p2p op, as wall-time intervals: what the planner's ratio counts too), else
    from the DP comm hook's own timing of the steady steps (``measured``, :func:`step_comm_figures`'s:
    1 - exposed / total; its total sums the buckets, which overlap each other, so it reads high)."""
    comm, hidden, n = profiled
    if n and comm > 0:
        return {
            "overlap_ratio": round(hidden / comm, 4),
            "overlap_source": f"profiler, {n} profiled step(s), every collective",
        }
    hooked = [c for c in measured if c.get("comm_s_total")]
    if hooked:
        total = sum(c["comm_s_total"] for c in hooked)
        exposed = sum(min(c["comm_s_exposed"], c["comm_s_total"]) for c in hooked)
        return {
            "overlap_ratio": round(max(0.0, 1.0 - exposed / total), 4),
            "overlap_source": "comm hook timing, data-parallel buckets only (run with profile_every for all)",
        }
    return {}
