"""Electricity Maps API v3 (``carbon-intensity/history``: the last 24 h, measured; ``carbon-intensity/
forecast``), header ``auth-token``: consumption-based average intensity per zone (``DE``, ``US-CAL-CISO``...)."""

from __future__ import annotations

from datetime import datetime

from workers.green.providers.http import DEFAULT_TIMEOUT_S, HTTPProvider
from workers.green.series import IntensitySeries

ELECTRICITYMAPS_URL = "https://api.electricitymap.org/v3"
# The environment that switches the provider on (empty = unset).
ENV_ELECTRICITYMAPS_TOKEN = "ELECTRICITYMAPS_TOKEN"
ENV_ELECTRICITYMAPS_URL = "ELECTRICITYMAPS_API_URL"


class ElectricityMaps(HTTPProvider):
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
