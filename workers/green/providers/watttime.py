"""WattTime API v3 (``/login`` with HTTP basic auth for a token, then ``/v3/historical`` and ``/v3/forecast``
with ``signal_type=co2_moer``): the *marginal* operating emissions rate of a grid region (``CAISO_NORTH``...),
in lbs CO2/MWh, converted here to g/kWh."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import requests

from workers.green.providers.http import DEFAULT_TIMEOUT_S, HTTPProvider, ProviderError, snippet, utc_window
from workers.green.series import IntensitySeries, as_utc

WATTTIME_URL = "https://api.watttime.org"
# The environment that switches the provider on (empty = unset).
ENV_WATTTIME_USERNAME = "WATTTIME_USERNAME"
ENV_WATTTIME_PASSWORD = "WATTTIME_PASSWORD"
ENV_WATTTIME_URL = "WATTTIME_API_URL"

# 1 lb = 453.59237 g (international avoirdupois pound, 1959) and 1 MWh = 1000 kWh, so
# 1 lb/MWh = 0.45359237 g/kWh; rounded to the 6 figures WattTime's and EPA's conversions use.
G_PER_KWH_PER_LB_PER_MWH = 0.453592


class WattTime(HTTPProvider):
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
        start, end = utc_window(start, end)
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
            source += f"; WattTime warnings: {snippet(json.dumps(meta['warnings']))}"
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
