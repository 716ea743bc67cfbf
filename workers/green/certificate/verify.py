"""Verifying a report: :func:`verify_certificate` checks a stored report's code against its content and its
figures against a report rebuilt from the stored measurements; :func:`verify_pdf` compares everything a
downloaded PDF prints with what the stored (signed) report prints: the code, and the whole text word by word
(:func:`compare_printed`), so that an edited figure anywhere (the header's totals, a table row, the scope's
dates, a sentence) fails the check and is named by the words printed before it."""

from __future__ import annotations

import difflib
import hmac
import io
import re
from collections.abc import Mapping
from typing import Any

from workers.green.certificate.canonical import scalar_text, value_at
from workers.green.certificate.codes import check_secret, code_of, hmac_digest, signed_content, text_digest
from workers.green.certificate.figures import READBACK_START, readback_fields

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


def printed_words(text: str) -> list[str]:
    """A PDF's extracted text as the words it prints (line breaks and spacing dropped: a figure edited to a
    different width re-wraps the lines after it, which is no difference of content; a word broken after its
    hyphen at a line's end, "cann-" "train", is one word again)."""
    return _unbroken(text).split()


def _unbroken(text: str) -> str:
    """``text`` with each word that a line break split after its hyphen joined again."""
    return re.sub(r"-[ \t]*\n\s*", "-", text)


def printed_digest(text: str, secret: bytes) -> str:
    """HMAC-SHA256 (hex) of the words ``text`` prints, under ``secret``: keeps a stored copy of a report's
    printed text trustworthy (the control plane stores it beside the PDF so that a check need not render)."""
    return text_digest(" ".join(printed_words(text)), secret)


MAX_TEXT_MISMATCHES = 20
"""The most differences of printed text a check lists (a different document differs everywhere)."""

_LABEL_WORDS = 12
_SEPARATORS = {"·", "•", "|"}


def _labels(text: str) -> list[str]:
    """For each word ``text`` prints, what names it: the words printed before it on its line (or, for a
    line's first word, the end of the line before), from the last separator or sentence end, at most
    :data:`_LABEL_WORDS`, without a trailing ``:`` or ``=``: "last step", "Facility energy (IT energy x
    PUE)", "results.kwh.facility"."""
    labels: list[str] = []
    previous: list[str] = []
    for line in _unbroken(text).splitlines():
        words = line.split()
        for i, _ in enumerate(words):
            before = words[:i] if i else previous
            label: list[str] = []
            for word in reversed(before):
                if word in _SEPARATORS or (label and word.endswith((".", ";")) and not word[-2:-1].isdigit()):
                    break
                label.insert(0, word)
                if len(label) == _LABEL_WORDS:
                    break
            labels.append(" ".join(label).rstrip(":=").strip() or "the start of the report")
        if words:
            previous = words
    return labels


def compare_printed(expected_text: str, shown_text: str) -> list[dict[str, Any]]:
    """Where the words ``shown_text`` prints differ from ``expected_text``'s (the text of the PDF the stored
    report renders to): ``[{"field": "printed: <label>", "certified": shown words, "recomputed": expected
    words}]``, in the order they are printed, at most :data:`MAX_TEXT_MISMATCHES` then one saying how many
    more. A line of the verification block (``results.kwh.facility = 10.4596``) is named by its field path."""
    expected, shown = printed_words(expected_text), printed_words(shown_text)
    labels = _labels(expected_text)
    matcher = difflib.SequenceMatcher(None, expected, shown, autojunk=False)
    out: list[dict[str, Any]] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        label = labels[i1] if i1 < len(labels) else "the end of the report"
        readback = _PRINTED_FIELD_RE.match(f"{label} = x")
        out.append(
            {
                "field": label if readback else f"printed: {label}",
                "certified": " ".join(shown[j1:j2]) or None,
                "recomputed": " ".join(expected[i1:i2]) or None,
            }
        )
    if len(out) > MAX_TEXT_MISMATCHES:
        more = len(out) - MAX_TEXT_MISMATCHES
        out = out[:MAX_TEXT_MISMATCHES] + [
            {"field": "printed text", "certified": f"{more} more difference(s)", "recomputed": None}
        ]
    return out


def expected_text(document: Mapping[str, Any]) -> str:
    """The text of the PDF ``document`` renders to (rendered and read back here: seconds)."""
    from workers.green.certificate.render import render_pdf

    return pdf_text(render_pdf(dict(document)))


def verify_pdf(pdf_bytes: bytes, document: dict, secret: bytes, *, expected: str | None = None) -> dict:
    """Whether a downloaded PDF shows the stored report: the printed code is the stored one and the stored
    report's code matches its content under ``secret``; every word it prints is what the stored report prints
    (``expected``: that text, when the caller keeps it; else the stored report is rendered here).

    Same shape as :func:`verify_certificate`; a mismatch's ``certified`` is what the PDF prints and
    ``recomputed`` what the stored report prints there, as text."""
    secret = check_secret(secret)
    if not isinstance(document, Mapping):
        raise ValueError("document must be the stored report (a dict from build_certificate)")
    shown = pdf_text(pdf_bytes)
    printed = figures_from_pdf_text(shown)
    stored_ok, _ = _check_code(document, secret)
    stored_code = (document.get("verification") or {}).get("code")
    code_ok = stored_ok and printed["code"] is not None and printed["code"] == stored_code
    mismatches = []
    for field in readback_fields(document):  # the verification block's lines, each missing one by name
        if field not in printed["figures"]:
            stored = scalar_text(value_at(document, field))
            mismatches.append({"field": field, "certified": None, "recomputed": stored})
    named = {m["field"] for m in mismatches}
    for m in compare_printed(expected if expected is not None else expected_text(document), shown):
        # a different code is said once, as verification.code, not at each place it is printed
        if m["field"] in named or (stored_code and stored_code in (m["recomputed"] or "")):
            continue
        mismatches.append(m)
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
