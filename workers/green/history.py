"""The measured 2020 carbon-intensity history shipped with the product (``data/carbon_intensity/``, a copy
of ``shared/data/carbon_intensity/``): Great Britain every 30 min, Germany every 15 min. The default
series for demos, tests and benchmarks when no live provider or uploaded forecast is configured.

Source (cite it wherever these figures are shown): P. Wiesner, I. Behnke, D. Scheinert, K. Gontarska,
L. Thamsen, "Let's Wait Awhile: How Temporal Workload Shifting Can Reduce Carbon Emissions in the Cloud",
Middleware '21, doi:10.1145/3464298.3493399 (dos-group/lets-wait-awhile, ``data/``): ENTSO-E generation
per source weighted by IPCC SRREN Annex II life-cycle emission factors.
"""

from __future__ import annotations

import csv
import functools
from datetime import datetime
from pathlib import Path

from workers.green.series import IntensitySeries, as_utc

DATA = Path(__file__).resolve().parent / "data" / "carbon_intensity"
SOURCE = (
    "Wiesner et al., Let's Wait Awhile, Middleware '21, doi:10.1145/3464298.3493399 "
    "(dos-group/lets-wait-awhile data/; ENTSO-E generation x IPCC SRREN life-cycle factors)"
)
ZONES = {"GB": "gb-2020.csv", "DE": "de-2020.csv"}


@functools.cache
def load_history(zone: str) -> IntensitySeries:
    """The shipped 2020 series for ``zone`` (``GB`` or ``DE``), kind ``history``."""
    key = zone.upper()
    if key not in ZONES:
        raise ValueError(f"no shipped history for zone {zone!r}; shipped: {', '.join(sorted(ZONES))}")
    times, values = [], []
    with (DATA / ZONES[key]).open(newline="") as f:
        for row in csv.DictReader(f):
            times.append(as_utc(datetime.fromisoformat(row["Time"])))
            values.append(float(row["Carbon Intensity"]))
    return IntensitySeries(
        provider="history", zone=key, kind="history", times=tuple(times), values=tuple(values), source=SOURCE
    )
