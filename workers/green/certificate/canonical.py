"""How a report writes its figures: every float rounded once to :data:`SIGNIFICANT_FIGURES` significant
figures and written in plain decimal, the canonical JSON the HMAC covers, and the dotted paths that name a
figure (``results.kwh.facility``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from workers.green.series import as_utc

SIGNIFICANT_FIGURES = 6
"""Every float in a report is rounded to this many significant figures before it is hashed or printed."""


def round_figure(x: float) -> float:
    """``x`` rounded to ``SIGNIFICANT_FIGURES`` significant figures (idempotent)."""
    if not math.isfinite(x):
        raise ValueError(f"a report figure must be a finite number, got {x!r}")
    return float(f"{x:.{SIGNIFICANT_FIGURES}g}") + 0.0  # + 0.0: -0.0 -> 0.0


def format_number(x: int | float) -> str:
    """The one way a number is written in the canonical JSON and in the PDF: rounded, plain decimal."""
    if isinstance(x, bool):
        raise ValueError("a truth value is not a number")
    if isinstance(x, int):
        return str(x)
    text = format(Decimal(repr(round_figure(float(x)))), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def scalar_text(value: Any) -> str:
    """A leaf as the canonical JSON writes it, strings without quotes (what the PDF prints)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return format_number(value)
    return str(value)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII, numbers by :func:`format_number`: the bytes the HMAC covers."""
    if value is None or isinstance(value, bool):
        return scalar_text(value)
    if isinstance(value, int | float):
        return format_number(value)
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, Mapping):
        if any(not isinstance(k, str) for k in value):
            raise ValueError("report keys must be strings")
        items = sorted(value.items())
        return "{" + ",".join(f"{_json_string(k)}:{canonical_json(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    raise ValueError(f"a report holds only JSON values, not {type(value).__name__}")


def _json_string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20 or ord(ch) > 0x7E:
            if ord(ch) > 0xFFFF:
                v = ord(ch) - 0x10000
                out.append(f"\\u{0xD800 + (v >> 10):04x}\\u{0xDC00 + (v & 0x3FF):04x}")
            else:
                out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def rounded(value: Any, path: str) -> Any:
    """A copy with every float rounded, tuples as lists and datetimes as ISO strings."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path} is {value!r}: a report figure must be a finite number")
        return round_figure(value)
    if isinstance(value, datetime):
        return as_utc(value).isoformat()
    if isinstance(value, Mapping):
        return {str(k): rounded(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, f"{path}.{i}") for i, v in enumerate(value)]
    raise ValueError(f"{path} is a {type(value).__name__}: a report holds only JSON values")


def value_at(document: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a report (``results.kwh.facility``; list items by index), None
    where the path leads nowhere."""
    node = document
    for part in path.split(".") if path else ():
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
