"""The UK Carbon Intensity API (National Energy System Operator, ``api.carbonintensity.org.uk``, no key):
national Great Britain, 30-min periods, ``/intensity/{from}/fw48h`` and ``/intensity/{from}/{to}``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workers.green.providers.http import DEFAULT_TIMEOUT_S, HTTPProvider, utc_window
from workers.green.series import IntensitySeries, as_utc

UK_CARBON_INTENSITY_URL = "https://api.carbonintensity.org.uk"
# The environment that switches the provider on (empty = unset).
ENV_UK_CARBON_INTENSITY = "CANN_TRAIN_UK_CARBON_INTENSITY"
ENV_UK_CARBON_INTENSITY_URL = "CANN_TRAIN_UK_CARBON_INTENSITY_URL"


class UKCarbonIntensity(HTTPProvider):
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
        start, end = utc_window(start, end)
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
        start, end = utc_window(start, end)
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
