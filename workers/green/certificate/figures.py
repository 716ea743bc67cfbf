"""The figures a report shows: its key results, its scheduling results, and the fields printed one per line
in the PDF's verification block (what :func:`~workers.green.certificate.verify.figures_from_pdf_text` reads
back)."""

from __future__ import annotations

KEY_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("results.kwh.facility", "Facility energy (IT energy x PUE)", "kWh"),
    ("results.kwh.it", "IT energy", "kWh"),
    ("results.kwh.device", "of which accelerators", "kWh"),
    ("results.kwh.cpu", "of which host CPU", "kWh"),
    ("results.kwh.memory", "of which host memory", "kWh"),
    ("results.kgco2e_location", "Emissions, location-based", "kgCO2e"),
    ("results.kgco2e_market", "Emissions, market-based", "kgCO2e"),
    ("results.sci.value", "SCI (E x I + M) per R, R = 1M tokens", "gCO2e per 1M tokens"),
    ("results.tokens", "Tokens trained", "tokens"),
    ("results.tokens_per_kwh", "Tokens per kWh of IT energy", "tokens/kWh"),
    ("results.cost.value", "Energy cost", "{currency}"),
    ("results.cost.per_1m_tokens", "Energy cost per 1M tokens", "{currency}"),
    ("results.recomputed.steps", "Steps trained twice after faults (badput)", "steps"),
    ("results.recomputed.kwh_facility", "of which facility energy of steps trained twice", "kWh"),
)
WHOLE_JOB_FIGURES = ("results.recomputed.steps", "results.recomputed.kwh_facility")
"""Figures of a report of the whole job (format version 2): a version 1 report neither has nor prints them."""
SCHEDULE_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("results.schedule.kgco2e_now", "Predicted emissions had the job started at once", "kgCO2e"),
    ("results.schedule.kgco2e", "Predicted emissions in the chosen window", "kgCO2e"),
    ("results.schedule.saving_kgco2e", "Predicted saving", "kgCO2e"),
    ("results.schedule.saving_pct", "Predicted saving", "%"),
)
READBACK_FIELDS: tuple[str, ...] = (
    "issued_at",
    "job.id",
    *(path for path, _, _ in KEY_FIGURES),
    "results.period.start",
    "results.period.end",
    *(path for path, _, _ in SCHEDULE_FIGURES),
    "inputs.energy.method",
    "inputs.pue.value",
    "inputs.intensity.provider",
    "inputs.intensity.zone",
    "inputs.intensity.kind",
    "inputs.market_factor.g_per_kwh",
    "inputs.embodied.kgco2e_per_device",
)
"""The fields printed, one per line, in the PDF's verification block, which :func:`figures_from_pdf_text`
reads back."""
READBACK_START = "Figures covered by the code"
"""The heading of the PDF's verification block."""


def _printed(document, fields):
    whole_job = int(document.get("format_version") or 1) >= 2
    return tuple(f for f in fields if whole_job or f not in WHOLE_JOB_FIGURES)


def key_figures(document) -> tuple[tuple[str, str, str], ...]:
    """The results table's rows ``document`` prints (a version 1 report has no whole-job figures)."""
    return tuple(row for row in KEY_FIGURES if row[0] in _printed(document, [r[0] for r in KEY_FIGURES]))


def readback_fields(document) -> tuple[str, ...]:
    """The verification block's fields ``document`` prints (:data:`READBACK_FIELDS`, by its version)."""
    return _printed(document, READBACK_FIELDS)
