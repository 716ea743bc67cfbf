"""Carbon-aware scheduling: when to run a job (and, if it can be interrupted, in which slots) so that it
emits the least carbon, costs the least, or minimises a mix of both, before its deadline and under a site
power cap shared with jobs already scheduled.

Everything is a step function of time (the carbon intensity, the electricity price, the power already
reserved), so the job's running cost per hour is a step function too: the *rate*. The search is exact:

- **Contiguous** (not interruptible): the cost of ``[s, s + d)`` is the integral of the rate, piecewise
  linear in ``s`` with kinks only where ``s`` or ``s + d`` meets a breakpoint (of the intensity, the price or
  the reservations) or a bound of the window; the set of starts the cap allows is a union of closed
  intervals whose ends are of the same form. So the minimum lies at one of those candidates, and every
  one is evaluated (in integer microseconds, so no candidate is lost to rounding).
- **Interruptible** (resumes from snapshots; no restart overhead is modelled): cut the window at every
  breakpoint; each piece has a constant rate, so taking the cheapest pieces first (the last one only in
  part) is optimal (a fractional knapsack with unit value per hour); adjacent pieces are merged into slots.

Emissions are location-based: kgCO2e = power_kw x PUE x intensity (g/kWh) x hours / 1000 over the chosen
slots; cost = power_kw x PUE x price x hours. A site power cap applies to the IT power of the jobs
(``power_kw`` and the reservations' kW, PUE excluded): the job may only run where reserved kW + its
``power_kw`` <= cap.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from workers.green.series import IntensitySeries, as_utc, step_integral

OBJECTIVES = ("carbon", "cost", "mix")
_US = timedelta(microseconds=1)
_US_PER_H = 3_600_000_000
CAP_TOLERANCE_KW = 1e-9
"""Reserved kW are summed in floating point; a sum within this of the cap counts as at the cap."""


class NoRoomError(ValueError):
    """The site power cap, with the power already reserved, leaves no room for the job before its deadline
    (the input is valid; nothing fits)."""


@dataclass(frozen=True)
class PriceSeries:
    """Electricity price, currency per kWh drawn from the grid: a flat tariff (no ``times``, one value that
    holds at every time) or a time-of-use step function with :class:`IntensitySeries`' semantics
    (``values[i]`` holds on ``[times[i], times[i+1])``, the last one until ``end``, which defaults to the
    last timestamp plus the most common step)."""

    values: tuple[float, ...]
    times: tuple[datetime, ...] = ()
    source: str = "tariff given by the user"
    currency: str = ""
    end: datetime | None = None

    def __post_init__(self) -> None:
        values = tuple(float(v) for v in self.values)
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError("an electricity price must be a finite number >= 0 per kWh")
        if not self.times:
            if len(values) != 1:
                raise ValueError("a flat price has exactly one value")
            object.__setattr__(self, "values", values)
            return
        if len(self.times) != len(values):
            raise ValueError("a price series needs one value per timestamp")
        times = tuple(as_utc(t) for t in self.times)
        if any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError("price timestamps must be strictly increasing")
        if self.end is not None:
            end = as_utc(self.end)
        else:
            gaps = [b - a for a, b in zip(times, times[1:], strict=False)] or [timedelta(hours=1)]
            end = times[-1] + max(set(gaps), key=lambda g: (gaps.count(g), -g.total_seconds()))
        if end <= times[-1]:
            raise ValueError("the price series' end must be after its last timestamp")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "end", end)

    @classmethod
    def flat(
        cls, price_per_kwh: float, *, currency: str = "", source: str = "flat tariff given by the user"
    ) -> PriceSeries:
        return cls(values=(price_per_kwh,), source=source, currency=currency)

    @property
    def is_flat(self) -> bool:
        return not self.times

    def covers(self, start: datetime, end: datetime) -> bool:
        return self.is_flat or (self.times[0] <= as_utc(start) and as_utc(end) <= self.end)

    def price_per_kw(self, start: datetime, end: datetime) -> float:
        """Currency paid by a constant 1 kW load over ``[start, end)``: the integral of the price."""
        start, end = as_utc(start), as_utc(end)
        if end <= start:
            return 0.0
        if self.is_flat:
            return self.values[0] * (end - start).total_seconds() / 3600.0
        if not self.covers(start, end):
            raise ValueError(
                f"[{start.isoformat()}, {end.isoformat()}) is not covered by the price series "
                f"({self.times[0].isoformat()} to {self.end.isoformat()})"
            )
        return step_integral(self.times, self.values, self.end, start, end)

    def describe(self) -> dict:
        d = {
            "kind": "flat" if self.is_flat else "time-of-use",
            "currency": self.currency,
            "source": self.source,
        }
        if self.is_flat:
            d["price_per_kwh"] = self.values[0]
        else:
            d.update(start=self.times[0].isoformat(), end=self.end.isoformat(), points=len(self.times))
        return d


@dataclass(frozen=True)
class Reservation:
    """Power already promised to a scheduled job on the site: ``kw`` over ``[start, end)``."""

    start: datetime
    end: datetime
    kw: float
    label: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", as_utc(self.start))
        object.__setattr__(self, "end", as_utc(self.end))
        if self.end <= self.start:
            raise ValueError(f"reservation {self.label or self.start.isoformat()}: end must be after start")
        if not math.isfinite(self.kw) or self.kw < 0:
            raise ValueError(f"reservation {self.label or self.start.isoformat()}: kW must be >= 0")


@dataclass(frozen=True)
class Schedule:
    """The chosen window(s) and what they emit and cost, beside starting now."""

    start: datetime
    """The first slot's start."""
    slots: tuple[tuple[datetime, datetime], ...]
    """Where the job runs: one slot unless it is interruptible; ascending, disjoint, merged."""
    kgco2e: float
    kgco2e_now: float
    """Starting now and running without a break (the carbon-agnostic baseline)."""
    saving_pct: float
    """Carbon saving vs starting now, percent (negative when another objective costs carbon)."""
    cost: float | None
    cost_now: float | None
    objective: str
    objective_value: float
    """kgCO2e (carbon), currency (cost), or cost + carbon price x tCO2e (mix), of the chosen slots."""
    objective_value_now: float
    energy_kwh: float
    """Energy drawn from the grid: power_kw x PUE x duration."""
    now: datetime
    finish_by: datetime
    interruptible: bool
    power_kw: float
    pue: float
    intensity: dict
    """The series' provenance (:meth:`IntensitySeries.describe`)."""
    price: dict | None = None
    carbon_price_per_t: float | None = None
    power_cap_kw: float | None = None
    now_fits_cap: bool = True
    """Whether starting now would respect the power cap (the baseline figures are given either way)."""
    method: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def history_used_as_forecast(self) -> bool:
        return self.intensity.get("kind") == "history"

    def to_dict(self) -> dict:
        def iso(t: datetime) -> str:
            return t.isoformat()

        return {
            "start": iso(self.start),
            "slots": [[iso(a), iso(b)] for a, b in self.slots],
            "kgco2e": self.kgco2e,
            "kgco2e_now": self.kgco2e_now,
            "saving_pct": self.saving_pct,
            "cost": self.cost,
            "cost_now": self.cost_now,
            "objective": self.objective,
            "objective_value": self.objective_value,
            "objective_value_now": self.objective_value_now,
            "energy_kwh": self.energy_kwh,
            "now": iso(self.now),
            "finish_by": iso(self.finish_by),
            "end": iso(self.slots[-1][1]),
            "duration_h": sum((b - a) / _US for a, b in self.slots) / _US_PER_H,
            "interruptible": self.interruptible,
            "power_kw": self.power_kw,
            "pue": self.pue,
            "carbon_price_per_t": self.carbon_price_per_t,
            "power_cap_kw": self.power_cap_kw,
            "now_fits_cap": self.now_fits_cap,
            "intensity": self.intensity,
            "history_used_as_forecast": self.history_used_as_forecast,
            "price": self.price,
            "method": self.method,
            "notes": list(self.notes),
        }


def _hours(td: timedelta) -> str:
    return f"{td.total_seconds() / 3600:g} h"


def _validate(
    series: IntensitySeries,
    now: datetime,
    duration: timedelta,
    power_kw: float,
    deadline: timedelta,
    pue: float,
    price: PriceSeries | None,
    objective: str,
    carbon_price_per_t: float | None,
    power_cap_kw: float | None,
    reservations: Sequence[Reservation],
) -> None:
    if not isinstance(duration, timedelta) or duration <= timedelta(0):
        raise ValueError(f"the job's duration must be > 0, got {duration}")
    if not isinstance(deadline, timedelta) or deadline < duration:
        raise ValueError(
            f"the deadline ({_hours(deadline)} from now) is shorter than the job ({_hours(duration)}): "
            f"allow at least {_hours(duration)}"
        )
    if not math.isfinite(power_kw) or power_kw <= 0:
        raise ValueError(f"the job's power must be > 0 kW, got {power_kw}")
    if not math.isfinite(pue) or pue < 1.0:
        raise ValueError(f"PUE is facility power / IT power, so >= 1; got {pue}")
    finish_by = now + deadline
    if not series.covers(now, finish_by):
        raise ValueError(
            f"the carbon-intensity series covers {series.start.isoformat()} to {series.end.isoformat()}, "
            f"not the whole window {now.isoformat()} to {finish_by.isoformat()} (now + deadline): "
            "move now, shorten the deadline, or supply a longer forecast"
        )
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective in ("cost", "mix") and price is None:
        raise ValueError(f"objective {objective!r} needs an electricity price (flat or a time-of-use series)")
    if objective == "mix":
        if carbon_price_per_t is None or not math.isfinite(carbon_price_per_t) or carbon_price_per_t < 0:
            raise ValueError("objective 'mix' needs an internal carbon price >= 0 (currency per tCO2e)")
    elif carbon_price_per_t is not None:
        raise ValueError("a carbon price only enters objective 'mix'; choose it or drop the carbon price")
    if price is not None and not price.covers(now, finish_by):
        raise ValueError(
            f"the price series covers {price.times[0].isoformat()} to {price.end.isoformat()}, not the "
            f"whole window {now.isoformat()} to {finish_by.isoformat()}: supply a longer tariff or a flat price"
        )
    if power_cap_kw is None:
        if reservations:
            raise ValueError("reservations only matter under a site power cap: give the cap in kW")
    else:
        if not math.isfinite(power_cap_kw) or power_cap_kw <= 0:
            raise ValueError(f"the site power cap must be > 0 kW, got {power_cap_kw}")
        if power_kw > power_cap_kw + CAP_TOLERANCE_KW:
            raise ValueError(
                f"the job draws {power_kw:g} kW, more than the site cap of {power_cap_kw:g} kW: "
                "lower the job's power or raise the cap"
            )


def _steps_on(times: Sequence[datetime], values: Sequence[float], now: datetime, horizon_us: int):
    """A step function restricted to ``[now, now + horizon)``: (offsets in microseconds of the steps
    after ``now``, the values from ``now`` on). ``times`` must cover ``now``."""
    finish = now + horizon_us * _US
    i = bisect.bisect_right(times, now) - 1
    j = bisect.bisect_left(times, finish)
    offsets = np.fromiter(
        ((t - now) // _US for t in times[i + 1 : j]), dtype=np.int64, count=max(j - i - 1, 0)
    )
    return offsets, np.asarray(values[i:j], dtype=float)


def _value_on_pieces(offsets: np.ndarray, values: np.ndarray, piece_starts: np.ndarray) -> np.ndarray:
    starts = np.concatenate(([0], offsets))
    return values[np.searchsorted(starts, piece_starts, side="right") - 1]


@dataclass(frozen=True)
class _Pieces:
    bounds: np.ndarray  # int64 microseconds from now, bounds[0] = 0, bounds[-1] = horizon
    rate: np.ndarray  # objective per hour on each piece
    feasible: np.ndarray  # the cap leaves room for the job on each piece


def _pieces(
    series: IntensitySeries,
    now: datetime,
    horizon_us: int,
    power_kw: float,
    pue: float,
    price: PriceSeries | None,
    objective: str,
    carbon_price_per_t: float | None,
    power_cap_kw: float | None,
    reservations: Sequence[Reservation],
) -> _Pieces:
    cuts = [np.array([0, horizon_us], dtype=np.int64)]
    ci_off, ci_val = _steps_on(series.times, series.values, now, horizon_us)
    cuts.append(ci_off)
    if price is not None and not price.is_flat:
        pr_off, pr_val = _steps_on(price.times, price.values, now, horizon_us)
        cuts.append(pr_off)
    res = []
    for r in reservations:
        a, b = max((r.start - now) // _US, 0), min((r.end - now) // _US, horizon_us)
        if a < b and r.kw > 0:
            res.append((a, b, r.kw))
            cuts.append(np.array([a, b], dtype=np.int64))
    bounds = np.unique(np.concatenate(cuts))
    starts = bounds[:-1]
    intensity = _value_on_pieces(ci_off, ci_val, starts)
    grid_kw = power_kw * pue
    if objective == "carbon":
        rate = grid_kw * intensity / 1000.0  # kgCO2e per hour
    else:
        if price.is_flat:
            tariff = np.full(len(starts), price.values[0])
        else:
            tariff = _value_on_pieces(pr_off, pr_val, starts)
        per_kwh = tariff if objective == "cost" else tariff + carbon_price_per_t * intensity / 1e6
        rate = grid_kw * per_kwh  # currency per hour
    feasible = np.ones(len(starts), dtype=bool)
    if power_cap_kw is not None and res:
        reserved = np.zeros(len(starts))
        for a, b, kw in res:
            reserved[np.searchsorted(starts, a) : np.searchsorted(starts, b)] += kw
        feasible = reserved + power_kw <= power_cap_kw + CAP_TOLERANCE_KW
    return _Pieces(bounds, rate, feasible)


def _primitive(bounds: np.ndarray, prefix: np.ndarray, slope: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The integral from 0 to ``t`` of a step function with ``slope`` on each piece (``prefix`` at bounds)."""
    k = np.clip(np.searchsorted(bounds, t, side="right") - 1, 0, len(slope) - 1)
    return prefix[k] + slope[k] * (t - bounds[k])


TIE_RTOL = 1e-9
"""Windows whose costs agree to this relative tolerance are ties (float64 sums carry ~16 digits)."""
TIE_ATOL = 1e-15
"""... and to this absolute one (a zero-carbon plateau: costs of 0 and a rounding residue)."""


def _best_contiguous(p: _Pieces, duration_us: int) -> int | None:
    """The start (microseconds from now) of the cheapest feasible contiguous window, earliest on ties."""
    lengths = np.diff(p.bounds)
    per_us = p.rate / _US_PER_H
    cost_prefix = np.concatenate(([0.0], np.cumsum(per_us * lengths)))
    blocked = (~p.feasible).astype(np.int64)
    blocked_prefix = np.concatenate(([0], np.cumsum(blocked * lengths)))
    horizon = int(p.bounds[-1])
    candidates = np.unique(np.concatenate((p.bounds, p.bounds - duration_us)))
    candidates = candidates[(candidates >= 0) & (candidates <= horizon - duration_us)]
    ends = candidates + duration_us
    blocked_us = _primitive(p.bounds, blocked_prefix, blocked, ends) - _primitive(
        p.bounds, blocked_prefix, blocked, candidates
    )
    ok = blocked_us == 0
    if not ok.any():
        return None
    cost = _primitive(p.bounds, cost_prefix, per_us, ends) - _primitive(
        p.bounds, cost_prefix, per_us, candidates
    )
    cost = np.where(ok, cost, np.inf)
    # "earliest on ties" within rounding: each cost is a difference of two running sums, so windows that
    # emit the same differ in their last bits, and a bare argmin picked the last of a clean plateau's starts
    # as often as the first (a job told to wait 45 min for nothing; tests/unit/test_green_schedule.py)
    best = float(cost.min())
    tied = np.flatnonzero(cost <= best + TIE_RTOL * abs(best) + TIE_ATOL)
    return int(candidates[int(tied[0])])


def _best_slots(p: _Pieces, duration_us: int) -> list[tuple[int, int]] | None:
    """The cheapest feasible pieces (earliest on ties) adding up to ``duration_us``, merged into slots."""
    starts, lengths = p.bounds[:-1], np.diff(p.bounds)
    idx = np.flatnonzero(p.feasible)
    if lengths[idx].sum() < duration_us:
        return None
    order = idx[np.lexsort((starts[idx], p.rate[idx]))]
    taken = np.cumsum(lengths[order])
    k = int(np.searchsorted(taken, duration_us))  # first piece at which the total reaches the duration
    chosen = {int(i) for i in order[:k]}
    last = int(order[k])
    need = duration_us - (int(taken[k - 1]) if k else 0)
    a, b = int(starts[last]), int(p.bounds[last + 1])
    if need == b - a:
        part = (a, b)
    elif (last + 1) in chosen and (last - 1) not in chosen:
        part = (b - need, b)  # touch the chosen piece after it: one slot fewer
    else:
        part = (a, a + need)
    pieces = sorted([(int(starts[i]), int(p.bounds[i + 1])) for i in chosen] + [part])
    slots: list[tuple[int, int]] = []
    for s, e in pieces:
        if slots and slots[-1][1] == s:
            slots[-1] = (slots[-1][0], e)
        else:
            slots.append((s, e))
    return slots


def schedule(
    series: IntensitySeries,
    *,
    now: datetime,
    duration: timedelta,
    power_kw: float,
    deadline: timedelta,
    interruptible: bool = False,
    pue: float = 1.0,
    price: PriceSeries | None = None,
    objective: str = "carbon",
    carbon_price_per_t: float | None = None,
    power_cap_kw: float | None = None,
    reservations: Sequence[Reservation] = (),
) -> Schedule:
    """The least-``objective`` way to run a job of ``duration`` at ``power_kw`` (IT power; the grid draws
    ``power_kw x pue``) that must finish by ``now + deadline``.

    ``objective``: ``carbon`` (kgCO2e, location-based), ``cost`` (needs ``price``) or ``mix`` (cost +
    ``carbon_price_per_t`` x tCO2e). ``power_cap_kw`` with ``reservations``: the site's power cap and the kW
    already promised to scheduled jobs. Raises ``ValueError`` with what to change when the input cannot be
    scheduled."""
    now = as_utc(now)
    reservations = tuple(reservations)
    _validate(
        series,
        now,
        duration,
        power_kw,
        deadline,
        pue,
        price,
        objective,
        carbon_price_per_t,
        power_cap_kw,
        reservations,
    )
    horizon_us, duration_us = deadline // _US, duration // _US
    pieces = _pieces(
        series,
        now,
        horizon_us,
        power_kw,
        pue,
        price,
        objective,
        carbon_price_per_t,
        power_cap_kw,
        reservations,
    )
    if interruptible:
        found = _best_slots(pieces, duration_us)
        method = (
            "exact: the window cut at every breakpoint of the intensity, price and reservations; the "
            "cheapest pieces taken first (the last in part), adjacent ones merged"
        )
    else:
        start_us = _best_contiguous(pieces, duration_us)
        found = None if start_us is None else [(start_us, start_us + duration_us)]
        method = (
            "exact: every start where the start or the end meets a breakpoint of the intensity, price or "
            "reservations, or a bound of the window, evaluated"
        )
    if found is None:
        raise NoRoomError(
            f"the site cap of {power_cap_kw:g} kW, with the power already reserved, leaves no room for "
            f"{_hours(duration)} at {power_kw:g} kW before {(now + deadline).isoformat()}"
            f"{'' if interruptible else ' in one piece'}: extend the deadline, lower the power, raise the cap"
            f"{'' if interruptible else ' or allow interruption'}"
        )
    slots = tuple((now + a * _US, now + b * _US) for a, b in found)
    baseline = ((now, now + duration),)
    grid_kw = power_kw * pue

    def kg(windows) -> float:
        return grid_kw * sum(series.grams_per_kw(a, b) for a, b in windows) / 1000.0

    def money(windows) -> float | None:
        return None if price is None else grid_kw * sum(price.price_per_kw(a, b) for a, b in windows)

    kgco2e, kgco2e_now = kg(slots), kg(baseline)
    cost, cost_now = money(slots), money(baseline)

    def objective_of(kg_: float, cost_: float | None) -> float:
        if objective == "carbon":
            return kg_
        if objective == "cost":
            return cost_
        return cost_ + carbon_price_per_t * kg_ / 1000.0

    now_fits = True
    if power_cap_kw is not None:
        now_fits = bool(pieces.feasible[pieces.bounds[:-1] < duration_us].all())  # pieces of [now, now+d)
    notes = []
    if series.kind == "history":
        notes.append("measured history used as a forecast: the saving is what this past would have allowed")
    elif series.kind == "average":
        notes.append("an annual average has no time variation: nothing to shift")
    return Schedule(
        start=slots[0][0],
        slots=slots,
        kgco2e=kgco2e,
        kgco2e_now=kgco2e_now,
        saving_pct=100.0 * (kgco2e_now - kgco2e) / kgco2e_now if kgco2e_now > 0 else 0.0,
        cost=cost,
        cost_now=cost_now,
        objective=objective,
        objective_value=objective_of(kgco2e, cost),
        objective_value_now=objective_of(kgco2e_now, cost_now),
        energy_kwh=grid_kw * duration_us / _US_PER_H,
        now=now,
        finish_by=now + deadline,
        interruptible=interruptible,
        power_kw=power_kw,
        pue=pue,
        intensity=series.describe(),
        price=None if price is None else price.describe(),
        carbon_price_per_t=carbon_price_per_t,
        power_cap_kw=power_cap_kw,
        now_fits_cap=now_fits,
        method=method,
        notes=tuple(notes),
    )
