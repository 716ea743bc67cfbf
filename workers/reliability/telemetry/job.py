"""The job's own signals: per-rank step time, collective wait time and heartbeat age.

The trainer feeds :class:`JobSignals` (``record_step`` once per step and rank, from whatever the ranks
already share with rank 0); the sampler reads it like any other collector. Per rank, the metrics in
:data:`METRICS` (``job.rank3.step_time_p50_s`` ...).

The EWMA uses ``alpha = 2 / (window + 1)``, the "span" convention of pandas' ``ewm(span=window)``, so that
it and the median look back over comparable spans of steps.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.reliability.telemetry.base import Collector, Reading

SIGNALS = ("step_time", "collective_wait")
METRICS = (
    *(f"job.rank{{rank}}.{s}_{w}_s" for s in SIGNALS for w in ("last", "ewma", "p50")),
    "job.rank{rank}.heartbeat_age_s",
    "job.rank{rank}.step",
)


@dataclass
class _Series:
    window: int
    alpha: float
    last: float | None = None
    ewma: float | None = None
    recent: deque = field(default_factory=deque)

    def add(self, value: float) -> None:
        self.last = value
        self.ewma = value if self.ewma is None else self.alpha * value + (1.0 - self.alpha) * self.ewma
        self.recent.append(value)
        while len(self.recent) > self.window:
            self.recent.popleft()

    def p50(self) -> float | None:
        return statistics.median(self.recent) if self.recent else None


@dataclass
class _Rank:
    series: dict[str, _Series]
    step: int | None = None
    seen_at: float | None = None


class JobSignals(Collector):
    """Per-rank step time and collective wait summaries (last, EWMA, median over ``window`` steps) and the
    age of each rank's last sign of life. Thread-safe: the trainer feeds it, the sampler reads it."""

    name = "job"

    def __init__(self, *, window: int = 20, clock: Callable[[], float] = time.monotonic):
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        self.window = int(window)
        self.alpha = 2.0 / (self.window + 1.0)
        self._clock = clock
        self._ranks: dict[int, _Rank] = {}
        self._lock = threading.Lock()

    def _rank(self, rank: int) -> _Rank:
        r = self._ranks.get(rank)
        if r is None:
            r = self._ranks[rank] = _Rank({s: _Series(self.window, self.alpha) for s in SIGNALS})
        return r

    def record_step(
        self,
        *,
        rank: int,
        step: int,
        step_time_s: float,
        collective_wait_s: float | None = None,
        at: float | None = None,
    ) -> None:
        """One finished step of ``rank``: its wall time, and the part of it spent waiting in collectives
        (None when the trainer does not measure it). ``at``: when (the clock's time; default now)."""
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
        values = {"step_time": step_time_s, "collective_wait": collective_wait_s}
        for name, v in values.items():
            if v is not None and (not math.isfinite(v) or v < 0):
                raise ValueError(f"{name}_s must be a finite number of seconds >= 0, got {v!r}")
        with self._lock:
            r = self._rank(rank)
            r.step = int(step)
            r.seen_at = self._clock() if at is None else float(at)
            for name, v in values.items():
                if v is not None:
                    r.series[name].add(float(v))

    def heartbeat(self, rank: int, at: float | None = None) -> None:
        """A sign of life from ``rank`` without a finished step (e.g. during a long checkpoint)."""
        with self._lock:
            self._rank(rank).seen_at = self._clock() if at is None else float(at)

    def available(self) -> tuple[bool, str]:
        return True, "fed by the trainer (record_step per rank and step)"

    def sample(self) -> Reading:
        out = Reading()
        now = self._clock()
        with self._lock:
            if not self._ranks:
                out.absent["job"] = "no step recorded yet"
            for rank, r in sorted(self._ranks.items()):
                p = f"job.rank{rank}."
                for name, s in r.series.items():
                    why = f"no {name} recorded for rank {rank}"
                    out.put(p + f"{name}_last_s", s.last, why_absent=why)
                    out.put(p + f"{name}_ewma_s", s.ewma, why_absent=why)
                    out.put(p + f"{name}_p50_s", s.p50(), why_absent=why)
                if r.seen_at is not None:
                    out.put(p + "heartbeat_age_s", max(0.0, now - r.seen_at))
                out.put(p + "step", r.step, why_absent=f"rank {rank} has only sent heartbeats")
        return out
