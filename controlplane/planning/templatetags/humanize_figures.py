"""Large counts as people read them on the knowledge-base pages: 175209209856 -> ``175.2 B``."""

from __future__ import annotations

from django import template

register = template.Library()

UNITS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


@register.filter
def count_text(value) -> str:
    """``175.2 B`` parameters, ``1.08 T`` FLOPs: three significant figures and the unit."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return "—"
    for scale, unit in UNITS:
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g}"


@register.filter
def billions_text(value) -> str:
    """A parameter count given in billions, in the unit that reads: ``7.0 B``, ``25 M`` (not ``0.0 B``)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return "—"
    return count_text(x * 1e9)
