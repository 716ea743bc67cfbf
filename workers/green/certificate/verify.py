"""Verifying a report: :func:`verify_certificate` checks a stored report's code against its content and its
figures against a report rebuilt from the stored measurements; :func:`verify_pdf` reads the printed code and
figures back from a downloaded PDF and compares them with the stored report."""

from __future__ import annotations

import hmac
import io
import re
from collections.abc import Mapping
from typing import Any

from workers.green.certificate.canonical import scalar_text, value_at
from workers.green.certificate.codes import check_secret, code_of, hmac_digest, signed_content
from workers.green.certificate.figures import READBACK_FIELDS, READBACK_START

_FIGURE_SECTIONS = ("job", "inputs", "results")
"""The parts of a document :func:`verify_certificate` compares with the recomputation (the texts around the
figures may change between versions; the HMAC covers them)."""


def _flatten(value: Any, path: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _flatten(v, f"{path}.{i}", out)
    else:
        out[path] = value
    return out


_ABSENT = object()


def _check_code(document: Mapping[str, Any], secret: bytes) -> tuple[bool, dict[str, Any]]:
    verification = document.get("verification")
    stored_code = verification.get("code") if isinstance(verification, Mapping) else None
    stored_digest = verification.get("digest") if isinstance(verification, Mapping) else None
    try:
        expected = hmac_digest(signed_content(document), secret)
    except ValueError:
        expected = None
    ok = (
        expected is not None
        and isinstance(stored_digest, str)
        and stored_digest.isascii()
        and hmac.compare_digest(stored_digest, expected)
        and stored_code == code_of(expected)
    )
    return ok, {
        "field": "verification.code",
        "certified": stored_code,
        "recomputed": None if expected is None else code_of(expected),
    }


def verify_certificate(document: dict, *, recomputed: dict, secret: bytes) -> dict:
    """Whether a stored report still holds: its code matches its content under ``secret``, and its figures
    (job, inputs, results) equal those of ``recomputed``, the report rebuilt with :func:`build_certificate`
    from the stored measurements.

    Returns ``{"valid", "code_matches", "figures_match", "mismatches": [{"field", "certified",
    "recomputed"}]}``: one mismatch per differing figure (``certified`` the stored value), then, when the
    code does not match, one for ``verification.code`` (``recomputed``: the code the stored content gives)."""
    secret = check_secret(secret)
    if not isinstance(document, Mapping):
        raise ValueError("document must be a stored report (a dict from build_certificate)")
    if not isinstance(recomputed, Mapping) or not isinstance(recomputed.get("results"), Mapping):
        raise ValueError("recomputed must be build_certificate(...) rebuilt from the stored measurements")
    code_ok, code_mismatch = _check_code(document, secret)
    certified: dict[str, Any] = {}
    again: dict[str, Any] = {}
    for section in _FIGURE_SECTIONS:
        _flatten(document.get(section, _ABSENT), section, certified)
        _flatten(recomputed.get(section, _ABSENT), section, again)
    mismatches = []
    for field in sorted(set(certified) | set(again)):
        a, b = certified.get(field, _ABSENT), again.get(field, _ABSENT)
        if (
            a is _ABSENT
            or b is _ABSENT
            or scalar_text(a) != scalar_text(b)
            or isinstance(a, str) != isinstance(b, str)
        ):
            mismatches.append(
                {
                    "field": field,
                    "certified": None if a is _ABSENT else a,
                    "recomputed": None if b is _ABSENT else b,
                }
            )
    if not code_ok:
        mismatches.append(code_mismatch)
    figures_ok = not [m for m in mismatches if m["field"] != "verification.code"]
    return {
        "valid": code_ok and figures_ok,
        "code_matches": code_ok,
        "figures_match": figures_ok,
        "mismatches": mismatches,
    }


_PRINTED_CODE_RE = re.compile(r"Verification code:?\s*([A-Z2-7]{4}(?:-[A-Z2-7]{4}){4})")
_PRINTED_FIELD_RE = re.compile(r"^\s*((?:job|inputs|results)(?:\.[A-Za-z0-9_]+)+|issued_at) = (.*?)\s*$")


def figures_from_pdf_text(text: str) -> dict:
    """The code and the figures printed in a report's verification block, from the PDF's extracted text
    (``pypdf``): ``{"code": "XXXX-...", "figures": {field: printed text}}`` (``code`` None when absent)."""
    if not isinstance(text, str):
        raise ValueError("text must be the text extracted from the report's PDF")
    found = _PRINTED_CODE_RE.search(text)
    figures: dict[str, str] = {}
    start = text.find(READBACK_START)
    if start >= 0:
        for line in text[start:].splitlines():
            m = _PRINTED_FIELD_RE.match(line)
            if m:
                figures.setdefault(m.group(1), m.group(2))
    return {"code": found.group(1) if found else None, "figures": figures}


def pdf_text(pdf_bytes: bytes) -> str:
    """The text of a PDF, page after page (``pypdf``)."""
    if not isinstance(pdf_bytes, bytes | bytearray) or not bytes(pdf_bytes[:5]) == b"%PDF-":
        raise ValueError("that is not a PDF (it does not start with %PDF-): upload the report as downloaded")
    from pypdf import PdfReader  # optional at import time: only verifiers of downloaded PDFs need it

    reader = PdfReader(io.BytesIO(bytes(pdf_bytes)))
    return "\n".join(page.extract_text() or "" for page in reader.pages)


def verify_pdf(pdf_bytes: bytes, document: dict, secret: bytes) -> dict:
    """Whether a downloaded PDF shows the stored report: the printed code is the stored one and the stored
    report's code matches its content under ``secret``; each printed figure equals the stored one.

    Same shape as :func:`verify_certificate`; a mismatch's ``certified`` is what the PDF prints and
    ``recomputed`` the stored value, as text."""
    secret = check_secret(secret)
    if not isinstance(document, Mapping):
        raise ValueError("document must be the stored report (a dict from build_certificate)")
    printed = figures_from_pdf_text(pdf_text(pdf_bytes))
    stored_ok, _ = _check_code(document, secret)
    stored_code = (document.get("verification") or {}).get("code")
    code_ok = stored_ok and printed["code"] is not None and printed["code"] == stored_code
    mismatches = []
    for field in sorted(set(READBACK_FIELDS) | set(printed["figures"])):
        shown = printed["figures"].get(field)
        stored = scalar_text(value_at(document, field))
        if shown != stored:
            mismatches.append({"field": field, "certified": shown, "recomputed": stored})
    if not code_ok:
        mismatches.append(
            {"field": "verification.code", "certified": printed["code"], "recomputed": stored_code}
        )
    figures_ok = not [m for m in mismatches if m["field"] != "verification.code"]
    return {
        "valid": code_ok and figures_ok,
        "code_matches": code_ok,
        "figures_match": figures_ok,
        "mismatches": mismatches,
    }
