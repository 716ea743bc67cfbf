"""The energy and carbon report of a finished training job: a JSON document, its PDF, and their verification.

:func:`build_certificate` turns a job's :meth:`EnergyAccount.summary() <workers.green.energy.EnergyAccount.summary>`
(and the carbon-aware schedule it ran under, if any) into a plain JSON-able document: scope and boundary,
the methods it follows, every input with its source, the results, which figures rest on an estimate, notes,
and a verification code. The document is a calculation report: it says which methods it follows (GHG
Protocol Scope 2 location- and market-based dual reporting, SCI per ISO/IEC 21031:2024 with R = 1M tokens,
energy from a meter or a labelled CodeCarbon-style estimate) and that no third party has verified it. It
never claims to meet a standard.

Rounding rule: every float in the document is rounded once, when the document is built, to
``SIGNIFICANT_FIGURES`` (6) significant figures (``float(f"{x:.6g}")``: the exact binary value rounded half
to even), and written in plain decimal notation without exponent or trailing zeros (``10.4596``,
``0.000123457``, ``12345700``). The canonical JSON that is hashed and the PDF print that same string, so a
printed figure is exactly a hashed one. Integers (tokens) are kept whole.

Verification: HMAC-SHA256 over the canonical JSON of the whole document except its ``verification`` block
(keys sorted, no whitespace, ASCII), keyed with a key derived from the control plane's secret. The full hex
digest stays in the document; the code a person reads is the first 20 base32 characters in groups of four
(100 bits). :func:`verify_certificate` checks the code and compares the figures with a document rebuilt from
the stored measurements; :func:`verify_pdf` reads the printed code and figures back from a downloaded PDF.

The rooms: :mod:`~.canonical` (rounding, canonical JSON, figure paths), :mod:`~.codes` (the HMAC and the
code), :mod:`~.figures` (what a report shows and reads back), :mod:`~.document` (building it),
:mod:`~.verify` (checking it), :mod:`~.render` (its PDF), :mod:`~.whole_job` (a summary of every attempt and
restart of a job, added up, with the steps trained twice).
"""

from workers.green.certificate.canonical import (
    SIGNIFICANT_FIGURES,
    canonical_json,
    format_number,
    round_figure,
    rounded,
    scalar_text,
    value_at,
)
from workers.green.certificate.codes import (
    ALGORITHM,
    CODE_CHARS,
    MIN_SECRET_BYTES,
    VERIFY_PATH,
    check_secret,
    code_of,
    hmac_digest,
    normalise_code,
    signed_content,
)
from workers.green.certificate.document import (
    FORMAT_VERSION,
    INTENSITY_KINDS,
    ISSUER,
    STATEMENT,
    build_certificate,
)
from workers.green.certificate.figures import (
    KEY_FIGURES,
    READBACK_FIELDS,
    READBACK_START,
    SCHEDULE_FIGURES,
    readback_fields,
)
from workers.green.certificate.render import render_pdf
from workers.green.certificate.verify import (
    compare_printed,
    expected_text,
    figures_from_pdf_text,
    pdf_text,
    printed_digest,
    printed_words,
    verify_certificate,
    verify_pdf,
)
from workers.green.certificate.whole_job import covers, whole_job_summary

__all__ = [
    "ALGORITHM",
    "CODE_CHARS",
    "FORMAT_VERSION",
    "INTENSITY_KINDS",
    "ISSUER",
    "KEY_FIGURES",
    "MIN_SECRET_BYTES",
    "READBACK_FIELDS",
    "READBACK_START",
    "SCHEDULE_FIGURES",
    "SIGNIFICANT_FIGURES",
    "STATEMENT",
    "VERIFY_PATH",
    "build_certificate",
    "canonical_json",
    "check_secret",
    "code_of",
    "compare_printed",
    "covers",
    "expected_text",
    "figures_from_pdf_text",
    "format_number",
    "hmac_digest",
    "normalise_code",
    "pdf_text",
    "printed_digest",
    "printed_words",
    "readback_fields",
    "render_pdf",
    "round_figure",
    "rounded",
    "scalar_text",
    "signed_content",
    "value_at",
    "verify_certificate",
    "verify_pdf",
    "whole_job_summary",
]
