"""How a page prints a figure: ``{{ x|figure }}`` -- thousands separators and a few significant digits, the
server-side twin of ``formatNumber`` in ``frontend/static/js/common.js`` (``68946900.0`` reads ``68,946,900``,
``0.000117331`` reads ``0.0001173``, ``-0.0`` reads ``0``). Not for values a script or a URL reads back:
those keep their raw form in ``data-`` attributes."""

from __future__ import annotations

import math

from django import template

register = template.Library()

SIGNIFICANT = 4


def figure_text(value, digits: int = SIGNIFICANT) -> str:
    """``value`` as a person reads it (module docstring); anything not a number is returned as it is (text),
    or as "—" (None)."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            value = float(value) if isinstance(value, str) and value.strip() else value
        except ValueError:
            return str(value)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 10 ** (digits - 1):  # nothing after the point is significant any more
        text = f"{round(value):,}"
    else:
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
        text = f"{value:,.{decimals}f}"
        if "." in text:
            text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


@register.filter
def figure(value, digits=SIGNIFICANT) -> str:
    try:
        digits = int(digits)
    except (TypeError, ValueError):
        digits = SIGNIFICANT
    return figure_text(value, digits)
