"""Energy, carbon and cost accounting for one training job, from cumulative power-meter readings.

An :class:`EnergyAccount` is fed :class:`~workers.green.power.PowerReading` s (``start`` once, then ``add``
after every step or every few steps, with the tokens trained since the previous reading) and keeps:

- IT energy per component (``device``, ``cpu``, ``memory``) and facility energy = IT x PUE (the cluster's
  PUE, else Uptime Institute's 2023 industry average 1.58, source in ``workers/planner/data/facility.json``);
- location-based gCO2e: each interval's facility energy, taken as drawn at constant power over the
  interval, times the grid intensity integrated over that interval (:meth:`IntensitySeries.grams_per_kw`),
  not one average; energy drawn where the series has no value is counted apart and said so;
- market-based gCO2e when a contractual factor (gCO2e/kWh) is supplied (GHG Protocol Scope 2 Guidance,
  2015: location- and market-based "dual reporting");
- cost from a flat price or a time-of-use :class:`Tariff`, integrated the same way;
- tokens per kWh, and SCI per 1M tokens = (E x I + M) / R (ISO/IEC 21031:2024, the Green Software
  Foundation's Software Carbon Intensity): E facility kWh, I the location-based intensity (SCI does not
  admit market-based instruments), M the devices' embodied carbon amortised over their lifetime for the
  job's duration (:func:`embodied_for`; left out, with the reason, where no trustworthy figure exists).

:meth:`EnergyAccount.event_values` is the payload of a live ``energy`` event; :meth:`EnergyAccount.summary`
lists every input with its source for a report.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from workers.green.power import COMPONENTS, METHODS, PowerReading, load_defaults
from workers.green.series import IntensitySeries, as_utc, step_integral
from workers.planner.energy import DEFAULT_PUE, PUE_SOURCE  # the planner's cited default (data/facility.json)

_DEFAULTS = load_defaults()
JOULES_PER_KWH = 3.6e6
TOKENS_PER_R = 1_000_000
"""SCI's functional unit R: one million training tokens."""
SCI_STANDARD = "ISO/IEC 21031:2024 Software Carbon Intensity (SCI) specification (Green Software Foundation)"
DUAL_REPORTING = (
    "GHG Protocol Scope 2 Guidance (2015): location-based and market-based methods reported side by side"
)
HOURS_PER_YEAR = 8760.0


# ---------------------------------------------------------------------------------------------- tariff


@dataclass(frozen=True)
class Tariff:
    """Electricity price per kWh: flat (``price``) or a time-of-use step function (``times``/``prices``,
    each price holding until the next timestamp, the last until ``end``). Prices may be negative (spot
    markets); ``currency`` is a code such as ``EUR``."""

    currency: str
    source: str
    price: float | None = None
    times: tuple[datetime, ...] = ()
    prices: tuple[float, ...] = ()
    end: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.currency, str) or not self.currency.strip():
            raise ValueError("a tariff needs a currency (e.g. 'EUR')")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError("a tariff needs a source (the contract, the supplier's price list, the market)")
        if self.price is not None:
            if self.times or self.prices:
                raise ValueError(
                    "a tariff is either flat (price) or time-of-use (times and prices), not both"
                )
            if isinstance(self.price, bool) or not math.isfinite(self.price):
                raise ValueError(f"price must be a finite number per kWh, got {self.price!r}")
            object.__setattr__(self, "price", float(self.price))
            return
        if not self.times or len(self.times) != len(self.prices):
            raise ValueError("a time-of-use tariff needs at least one timestamp and one price per timestamp")
        times = tuple(as_utc(t) for t in self.times)
        if any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError("tariff timestamps must be strictly increasing")
        prices = tuple(float(p) for p in self.prices)
        if any(not math.isfinite(p) for p in prices):
            raise ValueError("tariff prices must be finite numbers per kWh")
        if self.end is not None:
            end = as_utc(self.end)
        elif len(times) > 1:
            end = times[-1] + min(b - a for a, b in zip(times, times[1:], strict=False))
        else:
            end = times[0] + timedelta(hours=1)
        if end <= times[-1]:
            raise ValueError("a tariff's end must be after its last timestamp")
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "prices", prices)
        object.__setattr__(self, "end", end)

    @classmethod
    def flat(cls, price_per_kwh: float, currency: str, source: str) -> Tariff:
        return cls(currency=currency, source=source, price=price_per_kwh)

    @classmethod
    def time_of_use(
        cls,
        times: Sequence[datetime],
        prices: Sequence[float],
        currency: str,
        source: str,
        end: datetime | None = None,
    ) -> Tariff:
        return cls(currency=currency, source=source, times=tuple(times), prices=tuple(prices), end=end)

    @property
    def is_flat(self) -> bool:
        return self.price is not None

    def span(self) -> tuple[datetime | None, datetime | None]:
        """The period the prices cover (``(None, None)``: always)."""
        return (None, None) if self.is_flat else (self.times[0], self.end)

    def price_at(self, t: datetime) -> float:
        if self.is_flat:
            return self.price
        t = as_utc(t)
        if not self.times[0] <= t < self.end:
            raise ValueError(
                f"{t.isoformat()} is outside the tariff ({self.times[0].isoformat()} to {self.end})"
            )
        return self.prices[bisect.bisect_right(self.times, t) - 1]

    def cost_per_kw(self, start: datetime, end: datetime) -> float:
        """The cost of a constant 1 kW load over ``[start, end)`` (the window must lie inside the tariff)."""
        start, end = as_utc(start), as_utc(end)
        if end < start:
            raise ValueError("end is before start")
        if self.is_flat:
            return self.price * (end - start).total_seconds() / 3600.0
        if start == end:
            return 0.0
        if not (self.times[0] <= start and end <= self.end):
            raise ValueError("the window is not covered by the tariff")
        return step_integral(self.times, self.prices, self.end, start, end)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "currency": self.currency,
            "unit": f"{self.currency}/kWh",
            "source": self.source,
        }
        if self.is_flat:
            out |= {"kind": "flat", "price_per_kwh": self.price}
        else:
            out |= {
                "kind": "time-of-use",
                "start": self.times[0].isoformat(),
                "end": self.end.isoformat(),
                "points": len(self.times),
            }
        return out


# -------------------------------------------------------------------------------------------- embodied


@dataclass(frozen=True)
class Embodied:
    """The embodied carbon of the devices a job reserves, for SCI's M; ``available`` False (with
    ``reason``) where no trustworthy figure exists: then M is left out, never guessed."""

    device: str
    count: int
    available: bool
    kgco2e_per_device: float | None = None
    """Embodied kgCO2e one reserved device carries: the device plus its share of the host server."""
    lifetime_hours: float | None = None
    source: str = ""
    confidence: str = ""
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def grams_for(self, hours: float) -> float:
        """M for a job that reserved the devices ``hours``: TE x (TiR / EL), RS = 1 per reserved device."""
        if not self.available:
            raise ValueError(f"no embodied figure for {self.device}: {self.reason}")
        return self.count * self.kgco2e_per_device * 1000.0 * hours / self.lifetime_hours

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device, "count": self.count, "available": self.available}
        if self.available:
            out |= {
                "kgco2e_per_device": self.kgco2e_per_device,
                "lifetime_hours": self.lifetime_hours,
                "source": self.source,
                "confidence": self.confidence,
                **self.detail,
            }
        else:
            out["reason"] = self.reason
        return out


def embodied_for(device_name: str, count: int) -> Embodied:
    """The embodied carbon of ``count`` devices named ``device_name`` (a cluster's device name, e.g.
    ``A100-SXM4-80GB``, or ``cpu``), from ``data/power_defaults.json``."""
    if not isinstance(device_name, str) or not device_name.strip():
        raise ValueError("device_name must be the cluster's device name, e.g. 'A100-SXM4-80GB'")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be the number of devices the job reserves (>= 1), got {count!r}")
    key = device_name.strip().lower()
    for entry in _DEFAULTS["embodied"]["devices"]:
        names = [n.lower() for n in entry["names"]]
        if not any(
            n == key or (n != "cpu" and n in key) or (n == "cpu" and key.startswith("cpu")) for n in names
        ):
            continue
        if not entry["available"]:
            return Embodied(device_name, count, False, reason=entry["reason"])
        per_device = entry["gpu_kgco2e"] + entry["server_kgco2e"] / entry["gpus_per_server"]
        return Embodied(
            device_name,
            count,
            True,
            kgco2e_per_device=per_device,
            lifetime_hours=entry["lifetime_years"] * HOURS_PER_YEAR,
            source=entry["source"],
            confidence=entry["confidence"],
            detail={
                "gpu_kgco2e": entry["gpu_kgco2e"],
                "server_kgco2e": entry["server_kgco2e"],
                "gpus_per_server": entry["gpus_per_server"],
                "lifetime_years": entry["lifetime_years"],
                "method": _DEFAULTS["embodied"]["method"],
            },
        )
    return Embodied(
        device_name,
        count,
        False,
        reason=f"no embodied-carbon figure for {device_name!r} in workers/green/data/power_defaults.json",
    )


# ---------------------------------------------------------------------------------------------- account


def _spread(
    kwh: float,
    t0: datetime,
    t1: datetime,
    span: tuple[datetime | None, datetime | None],
    per_kw: Callable[[datetime, datetime], float],
    at: Callable[[datetime], float],
) -> tuple[float, float]:
    """``kwh`` drawn at constant power over ``[t0, t1)``, priced by a step function: ``(integral over the
    covered part, kWh outside the function's span)``."""
    if kwh == 0.0:
        return 0.0, 0.0
    lo, hi = span
    if t1 == t0:  # energy with no duration: priced at the instant
        inside = (lo is None or lo <= t0) and (hi is None or t0 < hi)
        return (kwh * at(t0), 0.0) if inside else (0.0, kwh)
    a = t0 if lo is None else max(t0, lo)
    b = t1 if hi is None else min(t1, hi)
    if b <= a:
        return 0.0, kwh
    total_s, covered_s = (t1 - t0).total_seconds(), (b - a).total_seconds()
    kw = kwh / (total_s / 3600.0)
    return kw * per_kw(a, b), kwh * (total_s - covered_s) / total_s


@dataclass
class _Totals:
    joules: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0.0))
    facility_kwh: float = 0.0
    location_g: float = 0.0
    kwh_without_intensity: float = 0.0
    market_g: float = 0.0
    cost: float = 0.0
    kwh_without_price: float = 0.0
    tokens: int = 0

    @property
    def it_kwh(self) -> float:
        return sum(self.joules.values()) / JOULES_PER_KWH


class EnergyAccount:
    """A job's running energy, carbon, cost and SCI from cumulative power readings (module docstring)."""

    def __init__(
        self,
        *,
        meter: Mapping[str, Any],
        pue: float | None = None,
        pue_source: str | None = None,
        intensity: IntensitySeries | None = None,
        market_factor_g_per_kwh: float | None = None,
        market_factor_source: str | None = None,
        tariff: Tariff | None = None,
        embodied: Embodied | None = None,
    ):
        if not isinstance(meter, Mapping) or meter.get("method") not in METHODS:
            raise ValueError(
                f"meter must be a power meter's describe() (its 'method' one of {', '.join(METHODS)}), "
                f"got {meter!r:.120}"
            )
        if pue is None:
            pue, pue_source = DEFAULT_PUE, PUE_SOURCE if pue_source is None else pue_source
        if isinstance(pue, bool) or not isinstance(pue, int | float) or not math.isfinite(pue) or pue < 1.0:
            raise ValueError(
                f"PUE must be a number >= 1 (total facility energy / IT energy), got {pue!r}; "
                f"leave it unset for the default {DEFAULT_PUE}"
            )
        if not pue_source:
            raise ValueError("a cluster's PUE needs its source (a measurement, the operator's report)")
        if intensity is not None and not isinstance(intensity, IntensitySeries):
            raise ValueError(f"intensity must be an IntensitySeries, got {type(intensity).__name__}")
        if market_factor_g_per_kwh is not None:
            f = market_factor_g_per_kwh
            if isinstance(f, bool) or not isinstance(f, int | float) or not math.isfinite(f) or f < 0:
                raise ValueError(f"the contractual emission factor must be gCO2e/kWh >= 0, got {f!r}")
            if not market_factor_source:
                raise ValueError(
                    "a market-based factor needs its source (the contract, the certificates, or the residual mix)"
                )
        if tariff is not None and not isinstance(tariff, Tariff):
            raise ValueError(
                f"tariff must be a Tariff (Tariff.flat(...) or Tariff.time_of_use(...)), got {tariff!r}"
            )
        if embodied is not None and not isinstance(embodied, Embodied):
            raise ValueError(f"embodied must come from embodied_for(device_name, count), got {embodied!r}")
        self.meter = dict(meter)
        self.pue, self.pue_source = float(pue), str(pue_source)
        self.intensity = intensity
        self.market_factor = None if market_factor_g_per_kwh is None else float(market_factor_g_per_kwh)
        self.market_factor_source = market_factor_source
        self.tariff = tariff
        self.embodied = embodied
        self.first: PowerReading | None = None
        self.last: PowerReading | None = None
        self.last_step: int | None = None
        self.last_interval: dict[str, Any] | None = None
        self.intervals = 0
        self.totals = _Totals()

    # ---------------------------------------------------------------------------------------- feeding

    def start(self, reading: PowerReading) -> None:
        """The reading at the start of the job (or of this attempt): energy counts from here."""
        if not isinstance(reading, PowerReading):
            raise ValueError(f"start needs a PowerReading (meter.read()), got {type(reading).__name__}")
        if self.first is not None:
            raise ValueError("the account has already started")
        self.first = self.last = reading

    def add(self, reading: PowerReading, *, step: int | None = None, tokens: int = 0) -> dict[str, Any]:
        """Account the interval since the previous reading (``tokens`` trained in it); returns its figures."""
        if self.last is None:
            raise ValueError("call start(meter.read()) before the first step")
        if not isinstance(reading, PowerReading):
            raise ValueError(f"add needs a PowerReading (meter.read()), got {type(reading).__name__}")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(
                f"tokens must be a whole number >= 0 (tokens trained since the last reading), got {tokens!r}"
            )
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise ValueError(f"step must be an integer, got {step!r}")
        prev = self.last
        t0, t1 = prev.time, reading.time
        if t1 < t0:
            raise ValueError(f"readings must come in time order: {t1.isoformat()} is before {t0.isoformat()}")
        delta = {c: reading.joules[c] - prev.joules[c] for c in COMPONENTS}
        if any(d < 0 for d in delta.values()):
            raise ValueError(
                f"meter readings are cumulative: {', '.join(c for c, d in delta.items() if d < 0)} went down "
                "(readings from another meter, or a meter restarted without a new start())"
            )
        it_kwh = sum(delta.values()) / JOULES_PER_KWH
        facility_kwh = it_kwh * self.pue
        seconds = (t1 - t0).total_seconds()

        interval: dict[str, Any] = {
            "start": t0.isoformat(),
            "end": t1.isoformat(),
            "step": step,
            "tokens": tokens,
            "kwh_it": it_kwh,
            "kwh": facility_kwh,
            "kwh_by_component": {c: d / JOULES_PER_KWH for c, d in delta.items()},
            "watts": sum(delta.values()) / seconds if seconds > 0 else None,
            "watts_by_component": {c: d / seconds for c, d in delta.items()} if seconds > 0 else None,
        }
        tot = self.totals
        if self.intensity is not None:
            s = self.intensity
            grams, outside = _spread(facility_kwh, t0, t1, (s.start, s.end), s.grams_per_kw, s.value_at)
            tot.location_g += grams
            tot.kwh_without_intensity += outside
            interval["gco2e"] = grams
            interval["kwh_without_intensity"] = outside
        if self.market_factor is not None:
            tot.market_g += facility_kwh * self.market_factor
            interval["gco2e_market"] = facility_kwh * self.market_factor
        if self.tariff is not None:
            tf = self.tariff
            cost, outside = _spread(facility_kwh, t0, t1, tf.span(), tf.cost_per_kw, tf.price_at)
            tot.cost += cost
            tot.kwh_without_price += outside
            interval["cost"] = cost
        for c in COMPONENTS:
            tot.joules[c] += delta[c]
        tot.facility_kwh += facility_kwh
        tot.tokens += tokens
        self.last, self.last_step, self.last_interval = reading, step, interval
        self.intervals += 1
        return interval

    # -------------------------------------------------------------------------------------- figures

    @property
    def hours(self) -> float:
        """Wall time from the first to the last reading."""
        if self.first is None or self.last is None:
            return 0.0
        return (self.last.time - self.first.time).total_seconds() / 3600.0

    def kgco2e(self) -> float | None:
        """Location-based kgCO2e so far (of the energy the intensity series covers); None without one."""
        return None if self.intensity is None else self.totals.location_g / 1000.0

    def kgco2e_market(self) -> float | None:
        return None if self.market_factor is None else self.totals.market_g / 1000.0

    def intensity_now(self) -> dict[str, Any] | None:
        """The intensity in force at the last reading, with its provenance (None outside the series)."""
        if self.intensity is None or self.last is None:
            return None
        s = self.intensity
        if not s.start <= self.last.time < s.end:
            return {
                "g_per_kwh": None,
                "provider": s.provider,
                "zone": s.zone,
                "kind": s.kind,
                "note": "outside the series",
            }
        return {
            "g_per_kwh": s.value_at(self.last.time),
            "provider": s.provider,
            "zone": s.zone,
            "kind": s.kind,
        }

    def tokens_per_kwh(self) -> float | None:
        """Tokens per kWh of IT energy (before PUE: the hardware's efficiency, comparable across sites)."""
        it = self.totals.it_kwh
        return self.totals.tokens / it if it > 0 else None

    def cost(self) -> float | None:
        return None if self.tariff is None else self.totals.cost

    def cost_per_1m_tokens(self) -> float | None:
        t = self.totals
        if self.tariff is None or t.tokens == 0 or t.kwh_without_price > 0:
            return None
        return t.cost / (t.tokens / TOKENS_PER_R)

    def sci(self) -> dict[str, Any]:
        """SCI = (E x I + M) per R, R = 1M tokens (``value`` in gCO2e per 1M tokens; None with ``why``)."""
        t = self.totals
        out: dict[str, Any] = {
            "standard": SCI_STANDARD,
            "functional_unit": "1M tokens",
            "R": t.tokens / TOKENS_PER_R,
            "E_kwh": t.facility_kwh,
            "I": "location-based grid intensity integrated over each interval (SCI admits no market-based factors)",
        }
        if self.embodied is None:
            m_g, m_note = 0.0, "not included: no device given for embodied carbon (embodied_for(...))"
        elif not self.embodied.available:
            m_g, m_note = 0.0, f"not included: {self.embodied.reason}"
        else:
            m_g = self.embodied.grams_for(self.hours)
            m_note = f"included: {self.embodied.count} x {self.embodied.device}, amortised over its lifetime"
        out |= {"M_g": m_g, "M": m_note, "M_included": self.embodied is not None and self.embodied.available}
        why = None
        if t.tokens == 0:
            why = "no tokens trained yet"
        elif self.intensity is None:
            why = "no carbon intensity configured"
        elif t.kwh_without_intensity > 0:
            why = f"{t.kwh_without_intensity:.6g} kWh were drawn outside the intensity series: E x I is incomplete"
        if why is not None:
            return out | {"value": None, "why": why}
        out["EI_g"] = t.location_g
        out["value"] = (t.location_g + m_g) / (t.tokens / TOKENS_PER_R)
        out["unit"] = "gCO2e per 1M tokens"
        return out

    def event_values(self) -> dict[str, Any]:
        """The ``values`` of a live ``energy`` event: running totals, power now, the meter's method (an
        estimate is labelled as one) and the intensity in force with its provider, zone and kind."""
        t = self.totals
        last = self.last_interval or {}
        watts = last.get("watts")
        values: dict[str, Any] = {
            "kwh": t.facility_kwh,
            "kwh_it": t.it_kwh,
            "kwh_device": t.joules["device"] / JOULES_PER_KWH,
            "kwh_cpu": t.joules["cpu"] / JOULES_PER_KWH,
            "kwh_memory": t.joules["memory"] / JOULES_PER_KWH,
            "step_kwh": last.get("kwh"),
            "watts": watts,
            "watts_facility": None if watts is None else watts * self.pue,
            "pue": self.pue,
            "kgco2e": self.kgco2e(),
            "kgco2e_market": self.kgco2e_market(),
            "kwh_without_intensity": t.kwh_without_intensity if self.intensity is not None else None,
            "kwh_without_price": t.kwh_without_price if self.tariff is not None else None,
            "intensity": self.intensity_now(),
            "tokens": t.tokens,
            "tokens_per_kwh": self.tokens_per_kwh(),
            "cost": self.cost(),
            "currency": self.tariff.currency if self.tariff is not None else None,
            "sci_g_per_1m_tokens": self.sci()["value"],
            "method": self.meter["method"],
            "estimated": list(self.meter.get("estimated", [])),
            "measured": bool(self.meter.get("measured", False)),
            "label": self.meter.get("label", ""),
        }
        return values

    def summary(self) -> dict[str, Any]:
        """Every input with its source and every result, for a report."""
        t = self.totals
        notes = []
        if self.meter.get("estimated"):
            notes.append(
                f"Estimated, not measured: {', '.join(self.meter['estimated'])} ({self.meter.get('label', '')})."
            )
        if self.meter.get("missing"):
            notes.append(
                f"Not counted (no meter and no figure to estimate from): {', '.join(self.meter['missing'])}."
            )
        if self.intensity is not None and t.kwh_without_intensity > 0:
            notes.append(
                f"{t.kwh_without_intensity:.6g} kWh were drawn outside the intensity series "
                f"({self.intensity.start.isoformat()} to {self.intensity.end.isoformat()}): not in kgCO2e."
            )
        if self.intensity is not None and self.intensity.kind == "history":
            notes.append(
                "The carbon intensity is a historical series used as a stand-in, not the actual grid."
            )
        if self.tariff is not None and t.kwh_without_price > 0:
            notes.append(
                f"{t.kwh_without_price:.6g} kWh fall outside the time-of-use tariff: not in the cost."
            )
        return {
            "scope": (
                "IT energy of the metered nodes (accelerators, CPUs, memory) x PUE = facility energy; carbon "
                "location-based (grid intensity when each interval's energy was drawn) and market-based where a "
                f"contractual factor is given ({DUAL_REPORTING}); SCI per {SCI_STANDARD}"
            ),
            "inputs": {
                "meter": self.meter,
                "pue": {"value": self.pue, "source": self.pue_source},
                "intensity": self.intensity.describe() if self.intensity is not None else None,
                "market_factor": None
                if self.market_factor is None
                else {"g_per_kwh": self.market_factor, "source": self.market_factor_source},
                "tariff": self.tariff.describe() if self.tariff is not None else None,
                "embodied": self.embodied.describe() if self.embodied is not None else None,
            },
            "results": {
                "start": self.first.time.isoformat() if self.first else None,
                "end": self.last.time.isoformat() if self.last else None,
                "hours": self.hours,
                "intervals": self.intervals,
                "kwh": {
                    **{c: t.joules[c] / JOULES_PER_KWH for c in COMPONENTS},
                    "it": t.it_kwh,
                    "facility": t.facility_kwh,
                },
                "kgco2e_location": self.kgco2e(),
                "kwh_without_intensity": t.kwh_without_intensity if self.intensity is not None else None,
                "kgco2e_market": self.kgco2e_market(),
                "cost": self.cost(),
                "currency": self.tariff.currency if self.tariff else None,
                "kwh_without_price": t.kwh_without_price if self.tariff is not None else None,
                "cost_per_1m_tokens": self.cost_per_1m_tokens(),
                "tokens": t.tokens,
                "tokens_per_kwh": self.tokens_per_kwh(),
                "sci": self.sci(),
            },
            "notes": notes,
        }
