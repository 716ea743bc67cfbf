"""What every live carbon-intensity provider shares: the :class:`IntensityProvider` protocol that
:func:`~workers.green.providers.resolve.resolve_series` walks, :class:`ProviderError` (the provider, the HTTP
status and its own message), and :class:`HTTPProvider`, the JSON-over-HTTP client the providers are built on
(timeouts, error bodies, rate limits, answers that do not cover the window asked for)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

import requests

from workers.green.series import IntensitySeries, as_utc

DEFAULT_TIMEOUT_S = 10.0


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


def message_in(body: object) -> str:
    """The human message inside an error body, whichever of the usual keys the provider uses."""
    if isinstance(body, str):
        return body.strip()
    if isinstance(body, dict):
        for key in ("message", "error", "detail", "msg"):
            found = message_in(body.get(key))
            if found:
                return found
    if isinstance(body, list):
        return "; ".join(m for m in (message_in(item) for item in body[:3]) if m)
    return ""


def snippet(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def utc_label(t: datetime) -> str:
    return f"{as_utc(t):%Y-%m-%d %H:%M} UTC"


class HTTPProvider:
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
            raise ProviderError(self.label, f"could not reach {shown}: {snippet(str(e))}") from None
        if answer.status_code != 200:
            try:
                message = message_in(answer.json())
            except ValueError:
                message = ""
            message = message or snippet(answer.text) or answer.reason or "(empty body)"
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
                f"HTTP 200 for {shown} but the body is not JSON: {snippet(answer.text)!r}",
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
                f"the answer covers {utc_label(series.start)} to {utc_label(series.end)}, "
                f"not the requested {utc_label(start)} to {utc_label(end)}",
            )
        return series.window(start, end)

    def _joined(self, measured: IntensitySeries, forecast: IntensitySeries) -> IntensitySeries:
        """Measured values up to the first forecast point, the forecast from there. Labelled ``forecast``:
        part of it is one."""
        if measured.end < forecast.start:
            raise ProviderError(
                self.label,
                f"measured values end {utc_label(measured.end)} but the forecast starts "
                f"{utc_label(forecast.start)}: the gap has no figure",
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
            source=f"measured until {utc_label(forecast.start)}, forecast after: {measured.source} | "
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
        start, end = utc_window(start, end)
        now = as_utc(now) if now is not None else datetime.now(UTC)
        if end <= now:
            series = measured(start, end)
        elif start >= now:
            series = forecast()
        else:
            series = self._joined(measured(start, now), forecast())
        return self._covering(series, start, end)


def utc_window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    start, end = as_utc(start), as_utc(end)
    if end <= start:
        raise ValueError(f"the window must end after it starts ({utc_label(start)} to {utc_label(end)})")
    return start, end
