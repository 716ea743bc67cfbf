"""Where grid carbon intensity comes from, best source first, each answer an :class:`IntensitySeries`.

1. Live providers, off unless configured (nothing reaches the internet unless asked; see
   :func:`configured_providers`):

   - Electricity Maps API v3 (``carbon-intensity/history``: the last 24 h, measured; ``carbon-intensity/
     forecast``), header ``auth-token``. Consumption-based average intensity per zone (``DE``,
     ``US-CAL-CISO``...).
   - WattTime API v3 (``/login`` with HTTP basic auth for a token, then ``/v3/historical`` and
     ``/v3/forecast`` with ``signal_type=co2_moer``): the *marginal* operating emissions rate of a grid
     region (``CAISO_NORTH``...), in lbs CO2/MWh, converted here to g/kWh.
   - UK Carbon Intensity API (National Energy System Operator, ``api.carbonintensity.org.uk``, no key):
     national Great Britain, 30-min periods, ``/intensity/{from}/fw48h`` and ``/intensity/{from}/{to}``.

2. A forecast CSV uploaded by the user (:func:`parse_forecast_csv`).
3. The shipped measured 2020 history for GB and DE (:func:`history_stand_in`), moved onto the requested
   dates when they lie outside it, and labelled ``history`` so no page passes it off as a forecast.
4. CodeCarbon's bundled annual country averages (:func:`country_average`), one value for the whole year.

:func:`resolve_series` walks that order for a zone and a window and says why each better source was not
used. Every HTTP failure is a :class:`ProviderError` naming the provider, the HTTP status and the
provider's own message.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import json
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Protocol

import requests

from workers.green.codecarbon_data import codecarbon_package
from workers.green.history import SOURCE as HISTORY_SOURCE
from workers.green.history import ZONES as HISTORY_ZONES
from workers.green.history import load_history
from workers.green.series import KINDS, IntensitySeries, as_utc

DEFAULT_TIMEOUT_S = 10.0

ELECTRICITYMAPS_URL = "https://api.electricitymap.org/v3"
WATTTIME_URL = "https://api.watttime.org"
UK_CARBON_INTENSITY_URL = "https://api.carbonintensity.org.uk"

# 1 lb = 453.59237 g (international avoirdupois pound, 1959) and 1 MWh = 1000 kWh, so
# 1 lb/MWh = 0.45359237 g/kWh; rounded to the 6 figures WattTime's and EPA's conversions use.
G_PER_KWH_PER_LB_PER_MWH = 0.453592

# The environment that switches providers on (empty = unset).
ENV_ELECTRICITYMAPS_TOKEN = "ELECTRICITYMAPS_TOKEN"
ENV_ELECTRICITYMAPS_URL = "ELECTRICITYMAPS_API_URL"
ENV_WATTTIME_USERNAME = "WATTTIME_USERNAME"
ENV_WATTTIME_PASSWORD = "WATTTIME_PASSWORD"
ENV_WATTTIME_URL = "WATTTIME_API_URL"
ENV_UK_CARBON_INTENSITY = "CANN_TRAIN_UK_CARBON_INTENSITY"
ENV_UK_CARBON_INTENSITY_URL = "CANN_TRAIN_UK_CARBON_INTENSITY_URL"

# CSV uploads: a year at 5-min steps is 105,120 rows; twice that is plenty and bounds the work.
MAX_CSV_ROWS = 200_000
CSV_TIME_COLUMNS = ("time", "datetime")
CSV_INTENSITY_COLUMNS = ("gco2_per_kwh", "carbon_intensity", "carbon intensity")

CODECARBON_MIX_FILE = "data/private_infra/global_energy_mix.json"
CODECARBON_UNDERLYING = (
    "Our World in Data, carbon intensity of electricity generation (owid/energy-data, compiled from Ember "
    "and the Energy Institute Statistical Review of World Energy)"
)


class ProviderError(RuntimeError):
    """A provider did not give a usable answer: its name, the HTTP status (``None`` when no answer came
    back) and what went wrong, in the provider's own words where it gave any."""

    def __init__(self, provider: str, message: str, *, status: int | None = None) -> None:
        self.provider = provider
        self.status = status
        self.detail = message
        super().__init__(f"{provider}: {message}")


class IntensityProvider(Protocol):
    """What every live provider offers :func:`resolve_series`."""

    name: str
    """The ``provider`` of the series it returns."""

    def refuses(self, zone: str) -> str | None:
        """Why this provider cannot serve ``zone`` (``None`` when it may)."""

    def series(
        self, zone: str, start: datetime, end: datetime, *, now: datetime | None = None
    ) -> IntensitySeries:
        """Intensity over ``[start, end)``: measured before ``now``, forecast after it."""


# ---------------------------------------------------------------------------------------------- HTTP


def _message_in(body: object) -> str:
    """The human message inside an error body, whichever of the usual keys the provider uses."""
    if isinstance(body, str):
        return body.strip()
    if isinstance(body, dict):
        for key in ("message", "error", "detail", "msg"):
            found = _message_in(body.get(key))
            if found:
                return found
    if isinstance(body, list):
        return "; ".join(m for m in (_message_in(item) for item in body[:3]) if m)
    return ""


def _snippet(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _utc_label(t: datetime) -> str:
    return f"{as_utc(t):%Y-%m-%d %H:%M} UTC"


class _HTTPProvider:
    name = ""
    label = ""
    auth_hint = ""

    def __init__(self, base_url: str, timeout: float) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"{self.label}: base URL must start with http:// or https://, got {base_url!r}")
        if not timeout > 0:
            raise ValueError(f"{self.label}: timeout must be a positive number of seconds, got {timeout!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "cann-train green (carbon-intensity client)"

    def refuses(self, zone: str) -> str | None:
        return None

    def _get_json(self, path: str, *, params: dict | None = None, headers: dict | None = None, auth=None):
        url = self.base_url + path
        shown = requests.Request("GET", url, params=params).prepare().url
        try:
            answer = self.session.get(url, params=params, headers=headers, auth=auth, timeout=self.timeout)
        except requests.Timeout:
            raise ProviderError(self.label, f"no answer from {shown} within {self.timeout:g} s") from None
        except requests.RequestException as e:
            raise ProviderError(self.label, f"could not reach {shown}: {_snippet(str(e))}") from None
        if answer.status_code != 200:
            try:
                message = _message_in(answer.json())
            except ValueError:
                message = ""
            message = message or _snippet(answer.text) or answer.reason or "(empty body)"
            text = f"HTTP {answer.status_code} for {shown}: {message}"
            if answer.status_code in (401, 403) and self.auth_hint:
                text += f" ({self.auth_hint})"
            elif answer.status_code == 429:
                retry = answer.headers.get("Retry-After")
                text += f" (rate limited: retry after {retry} s)" if retry else " (rate limited: retry later)"
            elif answer.status_code >= 500:
                text += " (the provider's server failed: try again later)"
            raise ProviderError(self.label, text, status=answer.status_code)
        try:
            return answer.json()
        except ValueError:
            raise ProviderError(
                self.label,
                f"HTTP 200 for {shown} but the body is not JSON: {_snippet(answer.text)!r}",
                status=200,
            ) from None

    def _malformed(self, what: str, message: str) -> ProviderError:
        return ProviderError(self.label, f"malformed answer from {what}: {message}", status=200)

    def _time(self, what: str, value: object, field: str) -> datetime:
        try:
            return as_utc(datetime.fromisoformat(value))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise self._malformed(what, f"{field} {value!r} is not an ISO 8601 time") from None

    def _series(self, what: str, **fields) -> IntensitySeries:
        try:
            return IntensitySeries(provider=self.name, **fields)
        except ValueError as e:
            raise self._malformed(what, str(e)) from None

    def _covering(self, series: IntensitySeries, start: datetime, end: datetime) -> IntensitySeries:
        if not series.covers(start, end):
            raise ProviderError(
                self.label,
                f"the answer covers {_utc_label(series.start)} to {_utc_label(series.end)}, "
                f"not the requested {_utc_label(start)} to {_utc_label(end)}",
            )
        return series.window(start, end)

    def _joined(self, measured: IntensitySeries, forecast: IntensitySeries) -> IntensitySeries:
        """Measured values up to the first forecast point, the forecast from there. Labelled ``forecast``:
        part of it is one."""
        if measured.end < forecast.start:
            raise ProviderError(
                self.label,
                f"measured values end {_utc_label(measured.end)} but the forecast starts "
                f"{_utc_label(forecast.start)}: the gap has no figure",
            )
        n = sum(1 for t in measured.times if t < forecast.start)
        if n == 0:
            return forecast
        return IntensitySeries(
            provider=self.name,
            zone=forecast.zone,
            kind="forecast",
            times=measured.times[:n] + forecast.times,
            values=measured.values[:n] + forecast.values,
            source=f"measured until {_utc_label(forecast.start)}, forecast after: {measured.source} | "
            f"{forecast.source}",
            end=forecast.end,
        )

    def _measured_and_forecast(
        self,
        start: datetime,
        end: datetime,
        now: datetime | None,
        measured: Callable[[datetime, datetime], IntensitySeries],
        forecast: Callable[[], IntensitySeries],
    ) -> IntensitySeries:
        """Measured values for the part of ``[start, end)`` before ``now``, the forecast for the rest."""
        start, end = _window(start, end)
        now = as_utc(now) if now is not None else datetime.now(UTC)
        if end <= now:
            series = measured(start, end)
        elif start >= now:
            series = forecast()
        else:
            series = self._joined(measured(start, now), forecast())
        return self._covering(series, start, end)


def _window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    start, end = as_utc(start), as_utc(end)
    if end <= start:
        raise ValueError(f"the window must end after it starts ({_utc_label(start)} to {_utc_label(end)})")
    return start, end


# ----------------------------------------------------------------------------------- Electricity Maps


class ElectricityMaps(_HTTPProvider):
    """Electricity Maps API v3: hourly consumption-based (flow-traced) carbon intensity of a zone,
    the past 24 h measured and the forecast ahead. Needs an API token (sent as the ``auth-token``
    header)."""

    name = "electricitymaps"
    label = "Electricity Maps"
    auth_hint = f"check {ENV_ELECTRICITYMAPS_TOKEN} and that the token covers this zone"

    def __init__(
        self, token: str, *, base_url: str = ELECTRICITYMAPS_URL, timeout: float = DEFAULT_TIMEOUT_S
    ):
        if not token:
            raise ValueError(f"Electricity Maps needs an API token ({ENV_ELECTRICITYMAPS_TOKEN})")
        super().__init__(base_url, timeout)
        self._token = token

    def history(self, zone: str) -> IntensitySeries:
        """The last 24 hours, measured (``actual``; hours Electricity Maps estimated are counted in the
        source)."""
        return self._fetch("carbon-intensity/history", "history", zone, kind="actual")

    def forecast(self, zone: str) -> IntensitySeries:
        """The forecast ahead (its horizon depends on the plan), kind ``forecast``."""
        return self._fetch("carbon-intensity/forecast", "forecast", zone, kind="forecast")

    def series(
        self, zone: str, start: datetime, end: datetime, *, now: datetime | None = None
    ) -> IntensitySeries:
        return self._measured_and_forecast(
            start, end, now, lambda _start, _end: self.history(zone), lambda: self.forecast(zone)
        )

    def _fetch(self, endpoint: str, key: str, zone: str, *, kind: str) -> IntensitySeries:
        what = f"{endpoint}?zone={zone}"
        body = self._get_json("/" + endpoint, params={"zone": zone}, headers={"auth-token": self._token})
        points = body.get(key) if isinstance(body, dict) else None
        if not isinstance(points, list) or not points:
            keys = ", ".join(body) if isinstance(body, dict) else type(body).__name__
            raise self._malformed(what, f"expected a non-empty {key!r} list, got {keys or 'an empty object'}")
        times, values, missing, estimated, methods, factors = [], [], 0, 0, set(), set()
        for point in points:
            if not isinstance(point, dict):
                raise self._malformed(what, f"a {key} entry is {point!r}, not an object")
            t = self._time(what, point.get("datetime"), "datetime")
            value = point.get("carbonIntensity")
            if value is None:
                missing += 1
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self._malformed(
                    what, f"carbonIntensity {value!r} at {point.get('datetime')} is not a number"
                )
            times.append(t)
            values.append(value)
            if point.get("isEstimated"):
                estimated += 1
                methods.add(str(point.get("estimationMethod") or "unnamed method"))
            if point.get("emissionFactorType"):
                factors.add(str(point["emissionFactorType"]))
        if not times:
            raise self._malformed(what, f"all {len(points)} entries have carbonIntensity null")
        source = f"Electricity Maps API v3 {endpoint}, zone {zone}, consumption-based (flow-traced)"
        if factors:
            source += f", {'/'.join(sorted(factors))} emission factors"
        if estimated:
            source += f"; {estimated} of {len(times)} hours estimated by Electricity Maps ({', '.join(sorted(methods))})"
        if missing:
            source += f"; {missing} hours without a value (the hour before holds over them)"
        return self._series(
            what, zone=zone, kind=kind, times=tuple(times), values=tuple(values), source=source
        )


# --------------------------------------------------------------------------------------------- WattTime


class WattTime(_HTTPProvider):
    """WattTime API v3: the marginal operating emissions rate (MOER, ``co2_moer``) of a grid region, every
    5 minutes, measured (``/v3/historical``) and forecast (``/v3/forecast``). Logs in with the account's
    username and password for a bearer token."""

    name = "watttime"
    label = "WattTime"
    auth_hint = f"check {ENV_WATTTIME_USERNAME}/{ENV_WATTTIME_PASSWORD} and the plan's regions"
    SIGNAL = "co2_moer"
    TOKEN_LIFETIME = timedelta(minutes=25)  # WattTime: a login token is valid for 30 minutes; renew early
    CHUNK = timedelta(days=30)  # WattTime's own client asks /v3/historical for at most 30 days at a time
    DEFAULT_HORIZON_HOURS, MAX_HORIZON_HOURS = 24, 72  # /v3/forecast horizon_hours: default 24, at most 72

    def __init__(
        self,
        username: str,
        password: str,
        *,
        base_url: str = WATTTIME_URL,
        timeout: float = DEFAULT_TIMEOUT_S,
    ):
        if not username or not password:
            raise ValueError(
                f"WattTime needs a username and a password ({ENV_WATTTIME_USERNAME}, {ENV_WATTTIME_PASSWORD})"
            )
        super().__init__(base_url, timeout)
        self._auth = requests.auth.HTTPBasicAuth(username, password)
        self._token: str | None = None
        self._token_until = datetime.min.replace(tzinfo=UTC)

    def login(self) -> str:
        body = self._get_json("/login", auth=self._auth)
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise self._malformed("/login", "no 'token' in the answer")
        self._token, self._token_until = token, datetime.now(UTC) + self.TOKEN_LIFETIME
        return token

    def forecast(self, region: str, *, horizon_hours: int | None = None) -> IntensitySeries:
        """The latest MOER forecast for ``region`` (kind ``forecast``): WattTime's default horizon (24 h),
        or ``horizon_hours`` up to its maximum of 72."""
        params = {"region": region, "signal_type": self.SIGNAL}
        if horizon_hours is not None:
            if not 0 < horizon_hours <= self.MAX_HORIZON_HOURS:
                raise ValueError(
                    f"WattTime forecasts 1 to {self.MAX_HORIZON_HOURS} hours ahead, not {horizon_hours}"
                )
            params["horizon_hours"] = horizon_hours
        body = self._data("/v3/forecast", params)
        return self._moer(f"/v3/forecast?region={region}", body["data"], body["meta"], region, "forecast")

    def historical(self, region: str, start: datetime, end: datetime) -> IntensitySeries:
        """Measured MOER over ``[start, end)`` (kind ``actual``), asked for in 30-day pieces."""
        start, end = _window(start, end)
        data, meta, piece = [], {}, start
        while piece < end:
            piece_end = min(end, piece + self.CHUNK)
            params = {"region": region, "signal_type": self.SIGNAL}
            params |= {"start": piece.isoformat(), "end": piece_end.isoformat()}
            body = self._data("/v3/historical", params)
            data += body["data"]
            meta = meta or body["meta"]
            piece = piece_end
        return self._moer(f"/v3/historical?region={region}", data, meta, region, "actual", dedupe=True)

    def series(
        self, zone: str, start: datetime, end: datetime, *, now: datetime | None = None
    ) -> IntensitySeries:
        now = as_utc(now) if now is not None else datetime.now(UTC)
        hours = math.ceil((as_utc(end) - now) / timedelta(hours=1))
        horizon = min(hours, self.MAX_HORIZON_HOURS) if hours > self.DEFAULT_HORIZON_HOURS else None
        return self._measured_and_forecast(
            start,
            end,
            now,
            lambda a, b: self.historical(zone, a, b),
            lambda: self.forecast(zone, horizon_hours=horizon),
        )

    def _data(self, path: str, params: dict) -> dict:
        for attempt in (1, 2):
            if self._token is None or datetime.now(UTC) >= self._token_until:
                self.login()
            try:
                body = self._get_json(path, params=params, headers={"Authorization": f"Bearer {self._token}"})
                break
            except ProviderError as e:
                if e.status != 401 or attempt == 2:
                    raise
                self._token = None  # expired early: log in again once
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("data"), list)
            or not isinstance(body.get("meta"), dict)
        ):
            raise self._malformed(path, "expected an object with a 'data' list and a 'meta' object")
        return body

    def _moer(
        self, what: str, data: list, meta: dict, region: str, kind: str, dedupe: bool = False
    ) -> IntensitySeries:
        units, signal = meta.get("units"), meta.get("signal_type", self.SIGNAL)
        if units != "lbs_co2_per_mwh":
            raise self._malformed(what, f"units {units!r}: expected 'lbs_co2_per_mwh' for {self.SIGNAL}")
        if signal != self.SIGNAL:
            raise self._malformed(what, f"signal_type {signal!r}: asked for {self.SIGNAL!r}")
        points: dict[datetime, float] = {}
        missing = 0
        for point in data:
            if not isinstance(point, dict):
                raise self._malformed(what, f"a data entry is {point!r}, not an object")
            t = self._time(what, point.get("point_time"), "point_time")
            value = point.get("value")
            if value is None:
                missing += 1
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self._malformed(what, f"value {value!r} at {point.get('point_time')} is not a number")
            if t in points and not dedupe:
                raise self._malformed(what, f"point_time {point.get('point_time')} appears twice")
            points[t] = value * G_PER_KWH_PER_LB_PER_MWH
        if not points:
            raise self._malformed(what, "no data points with a value")
        period = meta.get("data_point_period_seconds")
        if isinstance(period, bool) or not isinstance(period, int | float) or period <= 0:
            raise self._malformed(what, f"data_point_period_seconds {period!r} is not a positive number")
        times = tuple(sorted(points))
        model = meta.get("model") if isinstance(meta.get("model"), dict) else {}
        source = (
            f"WattTime API v3 {what.split('?')[0]}, region {region}, signal co2_moer: a MARGINAL operating "
            "emissions rate (the CO2 of the generators that answer a change in load), not the grid's average "
            f"intensity; model {model.get('date', 'unstated')}; lbs CO2/MWh x {G_PER_KWH_PER_LB_PER_MWH} = g/kWh"
        )
        if meta.get("generated_at"):
            source += f"; generated {meta['generated_at']}"
        if meta.get("warnings"):
            source += f"; WattTime warnings: {_snippet(json.dumps(meta['warnings']))}"
        if missing:
            source += f"; {missing} points without a value (the point before holds over them)"
        return self._series(
            what,
            zone=region,
            kind=kind,
            times=times,
            values=tuple(points[t] for t in times),
            source=source,
            end=times[-1] + timedelta(seconds=period),
        )


# ---------------------------------------------------------------------------------- UK Carbon Intensity


class UKCarbonIntensity(_HTTPProvider):
    """The UK Carbon Intensity API (National Energy System Operator, no key): national Great Britain
    intensity per 30-min period, the measured ``actual`` where the period has one, else the ``forecast``."""

    name = "uk-carbon-intensity"
    label = "UK Carbon Intensity API"
    ZONE = "GB"
    FORECAST_HORIZON = timedelta(hours=48)
    CHUNK = timedelta(days=14)  # API documentation: /intensity/{from}/{to} spans at most 14 days

    def __init__(self, *, base_url: str = UK_CARBON_INTENSITY_URL, timeout: float = DEFAULT_TIMEOUT_S):
        super().__init__(base_url, timeout)

    def refuses(self, zone: str) -> str | None:
        if zone.strip().upper() != self.ZONE:
            return f"national Great Britain only (zone GB); zone {zone} is not served"
        return None

    def forecast_48h(self, start: datetime) -> IntensitySeries:
        """The 48 h from ``start`` (``/intensity/{from}/fw48h``)."""
        start = as_utc(start)
        path = f"/intensity/{_uk_time(start)}/fw48h"
        return self._periods(path, self._data(path))

    def intensity(self, start: datetime, end: datetime) -> IntensitySeries:
        """The periods between ``start`` and ``end`` (``/intensity/{from}/{to}``, 14 days a request)."""
        start, end = _window(start, end)
        periods, piece = [], start
        while piece < end:
            piece_end = min(end, piece + self.CHUNK)
            periods += self._data(f"/intensity/{_uk_time(piece)}/{_uk_time(piece_end)}")
            piece = piece_end
        return self._periods(f"/intensity/{_uk_time(start)}/{_uk_time(end)}", periods, start, end)

    def series(
        self, zone: str, start: datetime, end: datetime, *, now: datetime | None = None
    ) -> IntensitySeries:
        if self.refuses(zone):
            raise ValueError(f"{self.label}: {self.refuses(zone)}")
        start, end = _window(start, end)
        now = as_utc(now) if now is not None else datetime.now(UTC)
        if start >= now and end - start <= self.FORECAST_HORIZON:
            path = f"/intensity/{_uk_time(start)}/fw48h"
            series = self._periods(path, self._data(path), start, end)
        else:
            series = self.intensity(start, end)
        return self._covering(series, start, end)

    def _data(self, path: str) -> list:
        body = self._get_json(path)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise self._malformed(path, "expected an object with a 'data' list")
        return data

    def _periods(
        self, what: str, periods: list, start: datetime | None = None, end: datetime | None = None
    ) -> IntensitySeries:
        """The periods overlapping ``[start, end)`` as a step function; ``actual`` only when every one of
        them has a measured value."""
        rows: dict[datetime, tuple[datetime, float, bool]] = {}
        for period in periods:
            if not isinstance(period, dict) or not isinstance(period.get("intensity"), dict):
                raise self._malformed(what, f"a period is {period!r}, not an object with an 'intensity'")
            a = self._time(what, period.get("from"), "from")
            b = self._time(what, period.get("to"), "to")
            if (start is not None and b <= start) or (end is not None and a >= end):
                continue
            actual, forecast = period["intensity"].get("actual"), period["intensity"].get("forecast")
            value = actual if actual is not None else forecast
            if value is None:
                raise self._malformed(
                    what, f"the period from {period.get('from')} has neither actual nor forecast"
                )
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self._malformed(what, f"intensity {value!r} from {period.get('from')} is not a number")
            rows[a] = (b, value, actual is not None)
        if not rows:
            raise self._malformed(what, "no 30-min period in the requested window")
        times = tuple(sorted(rows))
        measured = sum(1 for t in times if rows[t][2])
        kind = "actual" if measured == len(times) else "forecast"
        if measured == len(times):
            share = "measured ('actual') for every period"
        elif measured == 0:
            share = "forecast for every period"
        else:
            share = f"measured ('actual') for {measured} of {len(times)} periods, forecast for the rest"
        source = (
            f"UK Carbon Intensity API (National Energy System Operator) {what}, national Great Britain, "
            f"30-min periods; {share}"
        )
        return self._series(
            what,
            zone=self.ZONE,
            kind=kind,
            times=times,
            values=tuple(rows[t][1] for t in times),
            source=source,
            end=rows[times[-1]][0],
        )


def _uk_time(t: datetime) -> str:
    """The API's path format, ``YYYY-MM-DDThh:mmZ``."""
    return as_utc(t).strftime("%Y-%m-%dT%H:%MZ")


# ------------------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class _Slot:
    name: str
    provider: IntensityProvider | None
    reason: str = ""
    misconfigured: bool = False


def _env(env: Mapping[str, str], key: str) -> str:
    return (env.get(key) or "").strip()


def _live_slots(env: Mapping[str, str], timeout: float) -> list[_Slot]:
    """Each live provider, best first: the client when configured, else why not."""
    slots = []

    def url(key: str, default: str) -> str:
        value = _env(env, key) or default
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{key} must be an http:// or https:// URL, got {value!r}")
        return value

    token = _env(env, ENV_ELECTRICITYMAPS_TOKEN)
    if not token:
        slots.append(_Slot("electricitymaps", None, f"not configured (set {ENV_ELECTRICITYMAPS_TOKEN})"))
    else:
        try:
            client = ElectricityMaps(
                token, base_url=url(ENV_ELECTRICITYMAPS_URL, ELECTRICITYMAPS_URL), timeout=timeout
            )
            slots.append(_Slot("electricitymaps", client))
        except ValueError as e:
            slots.append(_Slot("electricitymaps", None, str(e), misconfigured=True))

    user, password = _env(env, ENV_WATTTIME_USERNAME), _env(env, ENV_WATTTIME_PASSWORD)
    if not user and not password:
        slots.append(
            _Slot(
                "watttime", None, f"not configured (set {ENV_WATTTIME_USERNAME} and {ENV_WATTTIME_PASSWORD})"
            )
        )
    elif not user or not password:
        have, lack = (
            (ENV_WATTTIME_USERNAME, ENV_WATTTIME_PASSWORD)
            if user
            else (ENV_WATTTIME_PASSWORD, ENV_WATTTIME_USERNAME)
        )
        slots.append(_Slot("watttime", None, f"{have} is set but {lack} is not: set both or neither", True))
    else:
        try:
            client = WattTime(user, password, base_url=url(ENV_WATTTIME_URL, WATTTIME_URL), timeout=timeout)
            slots.append(_Slot("watttime", client))
        except ValueError as e:
            slots.append(_Slot("watttime", None, str(e), misconfigured=True))

    switch = _env(env, ENV_UK_CARBON_INTENSITY).lower()
    if switch in ("", "0", "false", "no", "off"):
        slots.append(
            _Slot(
                "uk-carbon-intensity",
                None,
                f"not switched on (set {ENV_UK_CARBON_INTENSITY}=1; it needs no key)",
            )
        )
    elif switch not in ("1", "true", "yes", "on"):
        slots.append(
            _Slot(
                "uk-carbon-intensity",
                None,
                f"{ENV_UK_CARBON_INTENSITY} must be 1 or 0, got {env.get(ENV_UK_CARBON_INTENSITY)!r}",
                True,
            )
        )
    else:
        try:
            client = UKCarbonIntensity(
                base_url=url(ENV_UK_CARBON_INTENSITY_URL, UK_CARBON_INTENSITY_URL), timeout=timeout
            )
            slots.append(_Slot("uk-carbon-intensity", client))
        except ValueError as e:
            slots.append(_Slot("uk-carbon-intensity", None, str(e), misconfigured=True))
    return slots


def configured_providers(
    env: Mapping[str, str], *, timeout: float = DEFAULT_TIMEOUT_S
) -> list[IntensityProvider]:
    """The live providers ``env`` switches on, best first (none by default): Electricity Maps with
    ``ELECTRICITYMAPS_TOKEN``, WattTime with ``WATTTIME_USERNAME`` and ``WATTTIME_PASSWORD``, the UK Carbon
    Intensity API with ``CANN_TRAIN_UK_CARBON_INTENSITY=1``. ``ELECTRICITYMAPS_API_URL``, ``WATTTIME_API_URL``
    and ``CANN_TRAIN_UK_CARBON_INTENSITY_URL`` replace the base URLs (a proxy, a mirror, a test server).
    A half-done configuration (a username without a password, an unreadable switch) is a ``ValueError``."""
    slots = _live_slots(env, timeout)
    wrong = [s.reason for s in slots if s.misconfigured]
    if wrong:
        raise ValueError("; ".join(wrong))
    return [s.provider for s in slots if s.provider is not None]


# ------------------------------------------------------------------------------------------------ CSV


def parse_forecast_csv(
    text: str | bytes,
    *,
    zone: str,
    kind: str = "forecast",
    source: str = "uploaded CSV",
    max_rows: int = MAX_CSV_ROWS,
) -> IntensitySeries:
    """An uploaded intensity series: a header naming a time column (``time``, ``datetime``, any case) and
    an intensity column in gCO2e/kWh (``gco2_per_kwh``, ``carbon_intensity``, ``Carbon Intensity``), then
    one row per time, sorted, each time once. Times are ISO 8601; one without an offset is UTC. Each value
    holds until the next time, the last one for the most common step. The shipped history files
    (``Time,Carbon Intensity``) read the same way. Anything else is a ``ValueError`` naming the line."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not zone or not zone.strip():
        raise ValueError("a zone is required (the grid the figures describe, e.g. GB, DE, US-CAL-CISO)")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"the CSV file is not UTF-8 text (byte {e.start} cannot be read): save it as UTF-8"
            ) from None
    text = text.lstrip("\ufeff")
    if not text.strip():
        raise ValueError(
            "the CSV file is empty: expected a header line such as 'time,gco2_per_kwh' and one row per time"
        )
    reader = csv.reader(io.StringIO(text))
    header: list[str] = []
    for row in reader:
        if any(cell.strip() for cell in row):
            header = row
            break
    header_line = reader.line_num
    names = [cell.strip().lower() for cell in header]
    time_col = next((i for i, n in enumerate(names) if n in CSV_TIME_COLUMNS), None)
    value_col = next((i for i, n in enumerate(names) if n in CSV_INTENSITY_COLUMNS), None)
    if time_col is None or value_col is None:
        hint = " (it looks separated by ';': use commas)" if len(header) == 1 and ";" in header[0] else ""
        raise ValueError(
            f"line {header_line}: the header must name a time column ({' or '.join(CSV_TIME_COLUMNS)}) and an "
            f"intensity column in gCO2e/kWh ({' or '.join(CSV_INTENSITY_COLUMNS)}); found {header}{hint}"
        )
    width = max(time_col, value_col) + 1
    times: list[datetime] = []
    values: list[float] = []
    previous_line = header_line
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(times) >= max_rows:
            raise ValueError(
                f"line {line}: more than {max_rows:,} rows; split the file or use a coarser step"
            )
        if len(row) < width:
            raise ValueError(f"line {line}: expected {len(header)} columns like the header, found {len(row)}")
        raw_time, raw_value = row[time_col].strip(), row[value_col].strip()
        try:
            t = as_utc(datetime.fromisoformat(raw_time))
        except ValueError:
            raise ValueError(
                f"line {line}: cannot read the time {raw_time!r}: use ISO 8601 such as 2026-03-10T12:00:00Z or "
                "2026-03-10 12:00 (a time without an offset is UTC)"
            ) from None
        try:
            value = float(raw_value)
        except ValueError:
            raise ValueError(
                f"line {line}: the intensity {raw_value!r} is not a number (gCO2e/kWh)"
            ) from None
        if not math.isfinite(value):
            raise ValueError(f"line {line}: the intensity {raw_value!r} is not a finite number")
        if value < 0:
            raise ValueError(
                f"line {line}: the intensity {raw_value} is negative; gCO2e/kWh is never below 0"
            )
        if times and t <= times[-1]:
            relation = "repeats the time of" if t == times[-1] else "is earlier than"
            raise ValueError(
                f"line {line}: the time {raw_time} {relation} line {previous_line} ({times[-1].isoformat()}): "
                "rows must be sorted by time, each time once"
            )
        times.append(t)
        values.append(value)
        previous_line = line
    if not times:
        raise ValueError(f"the CSV file has a header (line {header_line}) but no rows")
    return IntensitySeries(
        provider="csv",
        zone=zone.strip(),
        kind=kind,
        times=tuple(times),
        values=tuple(values),
        source=f"{source}: {len(times):,} rows, columns {header[time_col].strip()!r} and "
        f"{header[value_col].strip()!r} (gCO2e/kWh; times without an offset taken as UTC)",
    )


# -------------------------------------------------------------------------------------------- history

HISTORY_YEAR = 2020


def history_stand_in(zone: str, start: datetime, end: datetime) -> IntensitySeries:
    """The shipped measured history of ``zone`` (GB or DE) over ``[start, end)``, kind ``history``. A window
    outside the shipped dates is moved to the same calendar position in 2020 and the values moved back to
    the requested dates; the source says which dates they were measured on."""
    key = zone.strip().upper()
    if key not in HISTORY_ZONES:
        raise ValueError(
            f"no shipped history for zone {zone!r} (shipped: {', '.join(sorted(HISTORY_ZONES))})"
        )
    start, end = _window(start, end)
    history = load_history(key)
    if history.covers(start, end):
        measured = history.window(start, end)
        return dataclasses.replace(
            measured,
            source=f"history used as a stand-in: values measured in this very window; {HISTORY_SOURCE}",
        )
    moved_start = start.replace(year=HISTORY_YEAR)  # 2020 is a leap year: every date has its place
    shift = start - moved_start
    moved_end = end - shift
    if not history.covers(moved_start, moved_end):
        raise ValueError(
            f"the window is {end - start} long: the shipped {key} history ({_utc_label(history.start)} to "
            f"{_utc_label(history.end)}) cannot stand in for it"
        )
    measured = history.window(moved_start, moved_end)
    return IntensitySeries(
        provider="history",
        zone=key,
        kind="history",
        times=tuple(t + shift for t in measured.times),
        values=measured.values,
        source=f"history used as a stand-in, not a forecast: {key} values measured {_utc_label(moved_start)} to "
        f"{_utc_label(moved_end)}, moved to the requested dates; {HISTORY_SOURCE}",
        end=end,
    )


# ------------------------------------------------------------------------------------------ CodeCarbon


@functools.cache
def _codecarbon_energy_mix() -> tuple[str, dict]:
    """CodeCarbon's version and its per-country table, read from the installed package's data without
    importing ``codecarbon`` (:mod:`workers.green.codecarbon_data`)."""
    package = codecarbon_package()
    if package is None:
        raise ProviderError(
            "CodeCarbon",
            "the codecarbon package is not installed (pip install 'codecarbon~=3.3'): its bundled annual "
            "country averages are the last-resort intensity",
        )
    version, root = package
    path = root / CODECARBON_MIX_FILE
    if not path.is_file():
        raise ProviderError(
            "CodeCarbon", f"{path} is missing: this codecarbon version keeps its data elsewhere"
        )
    return version, json.loads(path.read_text())


def average_countries() -> dict[str, str]:
    """The countries with a CodeCarbon annual average: ISO 3166-1 alpha-3 code -> name."""
    _, mix = _codecarbon_energy_mix()
    return {
        code: row.get("country_name", code)
        for code, row in sorted(mix.items())
        if isinstance(row, dict) and row.get("carbon_intensity") is not None
    }


def _alpha3(code: str) -> str | None:
    c = code.strip().upper()
    if c == "UK":  # ISO 3166-1 reserves UK for the United Kingdom, whose code is GB
        return "GBR"
    if len(c) == 3 and c.isalpha():
        return c
    if len(c) == 2 and c.isalpha():
        import pycountry  # the ISO 3166 tables; loaded only when an alpha-2 code needs them

        country = pycountry.countries.get(alpha_2=c)
        return country.alpha_3 if country else None
    return None


def _unknown_country(country: str) -> str:
    names = average_countries()
    wanted = country.strip().lower()
    close = [f"{code} ({name})" for code, name in names.items() if len(wanted) > 3 and wanted in name.lower()]
    return (
        f"no CodeCarbon annual average for country {country!r}: give an ISO 3166-1 alpha-2 code (FR) or "
        f"alpha-3 code (FRA)"
        + (f"; did you mean {', '.join(close[:5])}?" if close else ".")
        + f" workers.green.providers.average_countries() lists the {len(names)} countries with data; "
        "ISO's own list is at https://www.iso.org/obp/ui/#search/code/"
    )


def _one_year_after(t: datetime) -> datetime:
    try:
        return t.replace(year=t.year + 1)
    except ValueError:  # 29 February
        return t.replace(year=t.year + 1, day=28)


def country_average(
    country: str, *, start: datetime | None = None, end: datetime | None = None
) -> IntensitySeries:
    """CodeCarbon's annual average intensity for ``country`` (ISO 3166-1 alpha-2 or alpha-3) as one
    point, kind ``average``, from ``start`` (default: 1 January of the data's year) for a year (or to
    ``end`` when that is later). An unknown country is a ``ValueError`` saying where to find the codes."""
    version, mix = _codecarbon_energy_mix()
    code = _alpha3(country)
    row = mix.get(code) if code else None
    if not isinstance(row, dict) or row.get("carbon_intensity") is None:
        raise ValueError(_unknown_country(country))
    year = int(row["year"])
    value = float(row["carbon_intensity"])
    begin = as_utc(start) if start is not None else datetime(year, 1, 1, tzinfo=UTC)
    stop = _one_year_after(begin)
    if end is not None:
        stop = max(stop, as_utc(end))
    return IntensitySeries(
        provider="codecarbon",
        zone=code,
        kind="average",
        times=(begin,),
        values=(value,),
        source=f"annual average, the same value for every hour: {row.get('country_name', code)} {year}, "
        f"{value:g} gCO2e/kWh; CodeCarbon {version} (MIT) codecarbon/{CODECARBON_MIX_FILE}, from "
        f"{CODECARBON_UNDERLYING}",
        end=stop,
    )


# ----------------------------------------------------------------------------------------- resolution


def resolve_series(
    zone: str,
    start: datetime,
    end: datetime,
    *,
    env: Mapping[str, str],
    uploaded: IntensitySeries | str | None = None,
    now: datetime | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict:
    """The best series covering ``[start, end)`` for ``zone``: a live provider ``env`` configures, else the
    uploaded forecast (an :class:`IntensitySeries` or CSV text), else the shipped history (GB, DE) as a
    stand-in, else CodeCarbon's annual average for the zone's country (the part before the first ``-``:
    ``US-CAL-CISO`` -> US). Returns ``{"series": IntensitySeries over exactly [start, end), "skipped":
    [{"provider", "reason"}, ...]}`` with one entry per better source not used. ``LookupError`` when none
    serves; ``ValueError`` for a bad window, zone or upload."""
    zone = (zone or "").strip()
    if not zone:
        raise ValueError("a zone is required (e.g. GB, DE, FR, US-CAL-CISO)")
    start, end = _window(start, end)
    upload = parse_forecast_csv(uploaded, zone=zone) if isinstance(uploaded, str | bytes) else uploaded
    skipped: list[dict] = []

    def chosen(series: IntensitySeries) -> dict:
        return {"series": series, "skipped": skipped}

    for slot in _live_slots(env, timeout):
        if slot.provider is None:
            skipped.append({"provider": slot.name, "reason": slot.reason})
            continue
        refusal = slot.provider.refuses(zone)
        if refusal:
            skipped.append({"provider": slot.name, "reason": refusal})
            continue
        try:
            return chosen(slot.provider.series(zone, start, end, now=now))
        except ProviderError as e:
            skipped.append({"provider": slot.name, "reason": str(e)})

    if upload is None:
        skipped.append({"provider": "csv", "reason": "no forecast was uploaded"})
    elif upload.zone.upper() != zone.upper():
        skipped.append(
            {"provider": "csv", "reason": f"the uploaded forecast is for zone {upload.zone}, not {zone}"}
        )
    elif not upload.covers(start, end):
        skipped.append(
            {
                "provider": "csv",
                "reason": f"the uploaded forecast covers {_utc_label(upload.start)} to {_utc_label(upload.end)}, "
                f"not the requested {_utc_label(start)} to {_utc_label(end)}",
            }
        )
    else:
        return chosen(upload.window(start, end))

    try:
        return chosen(history_stand_in(zone, start, end))
    except ValueError as e:
        skipped.append({"provider": "history", "reason": str(e)})

    country = zone.split("-")[0]
    try:
        average = country_average(country, start=start, end=end)
    except (ValueError, ProviderError) as e:
        skipped.append({"provider": "codecarbon", "reason": str(e)})
    else:
        if country.upper() != zone.upper():
            average = dataclasses.replace(
                average, source=f"country average standing in for zone {zone}: {average.source}"
            )
        return chosen(average.window(start, end))

    reasons = "; ".join(f"{s['provider']}: {s['reason']}" for s in skipped)
    raise LookupError(
        f"no carbon-intensity series for zone {zone} from {_utc_label(start)} to {_utc_label(end)}: {reasons}"
    )
