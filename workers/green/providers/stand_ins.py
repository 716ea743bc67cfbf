"""The offline stand-ins when no live provider or upload serves: the shipped measured 2020 history of GB and
DE moved onto the requested dates (labelled ``history``, never passed off as a forecast), and CodeCarbon's
bundled annual country averages (one value for the whole year)."""

from __future__ import annotations

import dataclasses
import functools
import json
from datetime import UTC, datetime

from workers.green.codecarbon_data import codecarbon_package
from workers.green.history import SOURCE as HISTORY_SOURCE
from workers.green.history import ZONES as HISTORY_ZONES
from workers.green.history import load_history
from workers.green.providers.http import ProviderError, utc_label, utc_window
from workers.green.series import IntensitySeries, as_utc

CODECARBON_MIX_FILE = "data/private_infra/global_energy_mix.json"
CODECARBON_UNDERLYING = (
    "Our World in Data, carbon intensity of electricity generation (owid/energy-data, compiled from Ember "
    "and the Energy Institute Statistical Review of World Energy)"
)

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
    start, end = utc_window(start, end)
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
            f"the window is {end - start} long: the shipped {key} history ({utc_label(history.start)} to "
            f"{utc_label(history.end)}) cannot stand in for it"
        )
    measured = history.window(moved_start, moved_end)
    return IntensitySeries(
        provider="history",
        zone=key,
        kind="history",
        times=tuple(t + shift for t in measured.times),
        values=measured.values,
        source=f"history used as a stand-in, not a forecast: {key} values measured {utc_label(moved_start)} to "
        f"{utc_label(moved_end)}, moved to the requested dates; {HISTORY_SOURCE}",
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
