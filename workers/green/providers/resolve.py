"""The best carbon-intensity series for a zone and a window: a configured live provider, else the upload,
else the shipped history, else CodeCarbon's country average, with the reason each better source was not
used."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime

from workers.green.providers.config import live_slots
from workers.green.providers.http import DEFAULT_TIMEOUT_S, ProviderError, utc_label, utc_window
from workers.green.providers.stand_ins import country_average, history_stand_in
from workers.green.providers.upload import parse_forecast_csv
from workers.green.series import IntensitySeries


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
    start, end = utc_window(start, end)
    upload = parse_forecast_csv(uploaded, zone=zone) if isinstance(uploaded, str | bytes) else uploaded
    skipped: list[dict] = []

    def chosen(series: IntensitySeries) -> dict:
        return {"series": series, "skipped": skipped}

    for slot in live_slots(env, timeout):
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
                "reason": f"the uploaded forecast covers {utc_label(upload.start)} to {utc_label(upload.end)}, "
                f"not the requested {utc_label(start)} to {utc_label(end)}",
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
        f"no carbon-intensity series for zone {zone} from {utc_label(start)} to {utc_label(end)}: {reasons}"
    )
