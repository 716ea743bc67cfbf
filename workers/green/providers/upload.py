"""A carbon-intensity series uploaded by the user as CSV (a time column and an intensity column in
gCO2e/kWh), read with every error naming its line."""

from __future__ import annotations

import csv
import io
import math
from datetime import datetime

from workers.green.series import KINDS, IntensitySeries, as_utc

# CSV uploads: a year at 5-min steps is 105,120 rows; twice that is plenty and bounds the work.
MAX_CSV_ROWS = 200_000
CSV_TIME_COLUMNS = ("time", "datetime")
CSV_INTENSITY_COLUMNS = ("gco2_per_kwh", "carbon_intensity", "carbon intensity")


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
