"""What a power meter reads: the cumulative joules per component (``device``, ``cpu``, ``memory``) at one
instant, and the readings of several nodes' meters added up."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

COMPONENTS = ("device", "cpu", "memory")
METHODS = ("nvml", "npu-smi", "rapl", "estimate")
DEVICE_KINDS = ("cpu", "cuda", "npu")


@dataclass(frozen=True)
class PowerReading:
    """Cumulative energy per component since a meter started, at one instant."""

    time: datetime
    """Wall-clock time of the reading, aware UTC (the carbon intensity in force is looked up by it)."""
    joules: dict[str, float]
    """Cumulative joules per component (``device``, ``cpu``, ``memory``) since the meter started."""

    def __post_init__(self) -> None:
        if self.time.tzinfo is None:
            raise ValueError("a reading's time must be timezone-aware (UTC)")
        unknown = set(self.joules) - set(COMPONENTS)
        if unknown:
            raise ValueError(
                f"unknown component(s) {sorted(unknown)}; components are {', '.join(COMPONENTS)}"
            )
        joules = {c: float(self.joules.get(c, 0.0)) for c in COMPONENTS}
        if any(not math.isfinite(v) or v < 0 for v in joules.values()):
            raise ValueError(f"cumulative joules must be finite and >= 0, got {joules}")
        object.__setattr__(self, "time", self.time.astimezone(UTC))
        object.__setattr__(self, "joules", joules)

    @property
    def total_joules(self) -> float:
        return sum(self.joules.values())

    def to_floats(self) -> list[float]:
        """``[device, cpu, memory]`` joules: what one rank puts into an all-gather."""
        return [self.joules[c] for c in COMPONENTS]


def sum_readings(readings: Iterable[PowerReading]) -> PowerReading:
    """The readings of several nodes' meters as one (joules added, the latest time)."""
    readings = list(readings)
    if not readings:
        raise ValueError("no readings to add up")
    total = {c: sum(r.joules[c] for r in readings) for c in COMPONENTS}
    return PowerReading(max(r.time for r in readings), total)
