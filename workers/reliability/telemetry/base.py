"""The collector interface, one reading, one node's time-stamped sample, and counter rates.

A :class:`Collector` reads one source (psutil, NVML, npu-smi, the job's own signals). ``available()``
says whether the source is present here and, if not, why; ``sample()`` returns a :class:`Reading`: the
metrics it measured (``values``: name -> number, the unit in the name), the metrics it knows about but could
not read this time with the reason (``absent``), and descriptive, non-numeric facts (``info``, e.g. the
decoded names of a GPU's clock-event reasons). Nothing is ever filled in: a metric is measured or absent.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class Reading:
    """What one collector read at one instant."""

    values: dict[str, float] = field(default_factory=dict)
    """Metric name -> value; the unit is the name's suffix (``_C``, ``_W``, ``_MHz``, ``_pct``, ``_GiB``,
    ``_Bps``, ``_per_s``, ``_count``, ``_s``); 0/1 flags and codes carry no unit."""
    absent: dict[str, str] = field(default_factory=dict)
    """Metric (or group of metrics, e.g. ``gpu.0.nvlink``) -> why it was not read."""
    info: dict[str, Any] = field(default_factory=dict)
    """Descriptive facts that are not numbers (device names, decoded reasons, error texts)."""

    def put(self, name: str, value: float | int | None, *, why_absent: str = "") -> None:
        """Record ``value`` under ``name``, or ``name`` as absent when the value is None or not finite."""
        if value is None:
            self.absent[name] = why_absent or "not reported"
            return
        number = float(value)
        if not math.isfinite(number):
            self.absent[name] = f"not a finite number ({value!r})"
            return
        self.values[name] = number

    def merge(self, other: Reading) -> None:
        self.values.update(other.values)
        self.absent.update(other.absent)
        self.info.update(other.info)


class Collector(ABC):
    """One telemetry source on one node."""

    name: str = "collector"

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """``(True, how)`` when the source can be read here, else ``(False, why not)``."""

    @abstractmethod
    def sample(self) -> Reading:
        """Read the source now. Only called when :meth:`available` says so."""

    def close(self) -> None:  # noqa: B027 - most collectors hold nothing to release
        """Release what the collector holds (library handles, event sets)."""


@dataclass
class TelemetrySample:
    """One node's telemetry at one instant: the readings of all its collectors, merged."""

    node: str
    time_unix_s: float
    """When the sample was taken (Unix seconds, UTC)."""
    values: dict[str, float] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    """What taking the sample cost (live sampling only): ``cpu_s``, ``wall_s`` and per collector."""
    source: str = "live"
    """``live`` (a collector on this node) or the import it came from (e.g. ``prometheus``)."""

    @property
    def time(self) -> datetime:
        return datetime.fromtimestamp(self.time_unix_s, UTC)

    def to_event_values(self) -> dict[str, Any]:
        """The ``values`` of a ``telemetry`` event (``workers/events.py``): JSON-safe, finite numbers."""
        out: dict[str, Any] = {
            "node": self.node,
            "sampled_at": self.time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "source": self.source,
            "metrics": {k: v for k, v in self.values.items() if math.isfinite(v)},
            "absent": dict(self.absent),
        }
        if self.info:
            out["info"] = self.info
        if self.cost:
            out["cost"] = {k: round(v, 6) for k, v in self.cost.items()}
        return out


def counter_increase(previous: float, current: float) -> float:
    """The increase of a monotonic counter between two readings. A counter that went down was reset (a
    driver reload, an interface re-created) and counts again from zero, so the increase is its new value:
    the rule of Prometheus's ``rate()`` ("breaks in monotonicity ... are automatically adjusted for")."""
    return current - previous if current >= previous else current


class CounterRates:
    """Per-second rates of monotonic counters between consecutive readings, keyed by metric name."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}

    def prime(self, name: str, t: float, value: float) -> None:
        self._last[name] = (t, float(value))

    def rate(self, name: str, t: float, value: float) -> float | None:
        """The rate since the previous reading of ``name`` (None for the first one, or no time passed)."""
        value = float(value)
        last = self._last.get(name)
        self._last[name] = (t, value)
        if last is None or t <= last[0]:
            return None
        return counter_increase(last[1], value) / (t - last[0])
