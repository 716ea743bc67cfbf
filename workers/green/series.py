"""Grid carbon intensity as a time series: the one shape every provider returns and every consumer
(energy accounting, the scheduler, reports) reads.

A series is a step function: each value holds from its timestamp until the next one, the last until
``end``. Every series keeps where its figures came from (provider, zone, source citation) and what they are
(``kind``): measured ``actual`` values, a provider's ``forecast``, an ``average`` (an annual country
figure), or ``history`` used as a stand-in forecast, which every page and report must say.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

KINDS = ("actual", "forecast", "average", "history")
UNIT = "gCO2e/kWh"


def as_utc(t: datetime) -> datetime:
    """An aware UTC datetime; a naive one is taken as UTC (the shared history files carry no zone)."""
    if t.tzinfo is UTC:
        return t
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def step_integral(
    times: tuple[datetime, ...], values: tuple[float, ...], end: datetime, start: datetime, stop: datetime
) -> float:
    """The integral over ``[start, stop)`` of the step function that holds ``values[i]`` on
    ``[times[i], times[i+1])`` and the last value until ``end``, in value x hours. The window must lie inside
    ``[times[0], end)`` (the caller says so in its own words). One implementation for every step series here:
    carbon intensity (g/kWh x h = g per kW), a time-of-use price (currency per kW)."""
    i = bisect.bisect_right(times, start) - 1
    total, t = 0.0, start
    while t < stop:
        nxt = times[i + 1] if i + 1 < len(times) else end
        seg_end = min(nxt, stop)
        total += values[i] * (seg_end - t).total_seconds() / 3600.0
        t, i = seg_end, i + 1
    return total


@dataclass(frozen=True)
class IntensitySeries:
    """Carbon intensity (gCO2e per kWh of electricity drawn) over time, for one zone from one provider.

    ``times`` ascend strictly; ``values[i]`` holds on ``[times[i], times[i+1])`` and the last one on
    ``[times[-1], end)``. ``end`` defaults to the last timestamp plus the series' most common step.
    """

    provider: str
    """Where the figures came from: ``history``, ``csv``, ``electricitymaps``, ``watttime``,
    ``uk-carbon-intensity``, ``codecarbon``."""
    zone: str
    """The grid zone as the provider names it (``GB``, ``DE``, ``CAISO_NORTH``...)."""
    kind: str
    """``actual`` | ``forecast`` | ``average`` | ``history`` (history used as a forecast: say so)."""
    times: tuple[datetime, ...]
    values: tuple[float, ...]
    source: str
    """A citation a person can follow (paper, API and its documentation, data file)."""
    end: datetime | None = None
    unit: str = field(default=UNIT)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.times or len(self.times) != len(self.values):
            raise ValueError("a series needs at least one timestamp and one value per timestamp")
        times = tuple(as_utc(t) for t in self.times)
        if any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError("timestamps must be strictly increasing")
        values = tuple(float(v) for v in self.values)
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError("carbon intensity must be a finite number >= 0")
        end = as_utc(self.end) if self.end is not None else times[-1] + self.step()
        if end <= times[-1]:
            raise ValueError("end must be after the last timestamp")
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "end", end)

    @property
    def start(self) -> datetime:
        return self.times[0]

    def step(self) -> timedelta:
        """The most common spacing of the timestamps (one hour for a single point)."""
        if len(self.times) < 2:
            return timedelta(hours=1)
        gaps: dict[timedelta, int] = {}
        for a, b in zip(self.times, self.times[1:], strict=False):
            gaps[b - a] = gaps.get(b - a, 0) + 1
        return max(gaps.items(), key=lambda kv: (kv[1], -kv[0].total_seconds()))[0]

    def covers(self, start: datetime, end: datetime) -> bool:
        return self.start <= as_utc(start) and as_utc(end) <= self.end

    def value_at(self, t: datetime) -> float:
        """The intensity in force at ``t`` (``ValueError`` outside the series)."""
        t = as_utc(t)
        if not self.start <= t < self.end:
            raise ValueError(
                f"{t.isoformat()} is outside the series ({self.start.isoformat()} to {self.end.isoformat()})"
            )
        return self.values[bisect.bisect_right(self.times, t) - 1]

    def grams_per_kw(self, start: datetime, end: datetime) -> float:
        """gCO2e emitted by a constant 1 kW load over ``[start, end)``: the integral of the step function
        in g/kWh x hours."""
        start, end = as_utc(start), as_utc(end)
        if end < start:
            raise ValueError("end is before start")
        if start == end:
            return 0.0
        if not self.covers(start, end):
            raise ValueError(
                f"[{start.isoformat()}, {end.isoformat()}) is not covered by the series "
                f"({self.start.isoformat()} to {self.end.isoformat()})"
            )
        return step_integral(self.times, self.values, self.end, start, end)

    def mean(self, start: datetime, end: datetime) -> float:
        """The time-weighted mean intensity over ``[start, end)``."""
        hours = (as_utc(end) - as_utc(start)).total_seconds() / 3600.0
        if hours <= 0:
            raise ValueError("the window must have a positive length")
        return self.grams_per_kw(start, end) / hours

    def window(self, start: datetime, end: datetime) -> IntensitySeries:
        """The part of the series over ``[start, end)`` (its first point moved to ``start``)."""
        start, end = as_utc(start), as_utc(end)
        if not self.covers(start, end) or end <= start:
            raise ValueError("the window must lie inside the series and have a positive length")
        i = bisect.bisect_right(self.times, start) - 1
        j = bisect.bisect_left(self.times, end)
        times = (start, *self.times[i + 1 : j])
        return IntensitySeries(
            provider=self.provider,
            zone=self.zone,
            kind=self.kind,
            times=times,
            values=self.values[i:j],
            source=self.source,
            end=end,
        )

    def describe(self) -> dict:
        """Provenance, for events, API answers and reports."""
        return {
            "provider": self.provider,
            "zone": self.zone,
            "kind": self.kind,
            "unit": self.unit,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "points": len(self.times),
            "source": self.source,
        }
