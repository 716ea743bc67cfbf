"""The measured 2020 carbon-intensity history shipped with the product (``data/carbon_intensity/``, a copy
of ``shared/data/carbon_intensity/``): Great Britain every 30 min, Germany every 15 min. The default
series for demos, tests and benchmarks when no live provider or uploaded forecast is configured.

Source (cite it wherever these figures are shown): P. Wiesner, I. Behnke, D. Scheinert, K. Gontarska,
L. Thamsen, "Let's Wait Awhile: How Temporal Workload Shifting Can Reduce Carbon Emissions in the Cloud",
Middleware '21, doi:10.1145/3464298.3493399 (dos-group/lets-wait-awhile, ``data/``): ENTSO-E generation
per source weighted by IPCC SRREN Annex II life-cycle emission factors.
"""

from __future__ import annotations

import functools
from datetime import UTC
from pathlib import Path

import numpy as np

from workers.green.series import IntensitySeries

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
    # numpy parses the 22k-37k timestamps in C: every training job's rank 0 loads a zone at start-up
    # (0.25-0.8 s with csv + datetime.fromisoformat per row, ~0.05 s this way)
    lines = (DATA / ZONES[key]).read_text().splitlines()
    if lines[0].strip() != "Time,Carbon Intensity":
        raise ValueError(f"{ZONES[key]}: unexpected header {lines[0]!r}")
    stamps, numbers = zip(*(line.split(",") for line in lines[1:] if line.strip()), strict=True)
    naive = np.array(stamps, dtype="datetime64[us]").tolist()
    times = [t.replace(tzinfo=UTC) for t in naive]
    values = np.array(numbers, dtype=float).tolist()
    return IntensitySeries(
        provider="history", zone=key, kind="history", times=tuple(times), values=tuple(values), source=SOURCE
    )
