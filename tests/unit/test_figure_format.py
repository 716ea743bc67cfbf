"""The pages' server-side number format (``{{ x|figure }}``): thousands separators and four significant
figures, as ``formatNumber`` writes them in the browser; text passes through; nothing prints "-0"."""

from __future__ import annotations

import pytest
from django.template import Context, Template

from controlplane.common.templatetags.figures import figure_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (68946900.0, "68,946,900"),
        (0.000117331, "0.0001173"),
        (12345, "12,345"),
        (1.5, "1.5"),
        (12.3456, "12.35"),
        (-0.0, "0"),
        (-0.00004, "-0.00004"),
        (1e-12, "0.000000000001"),
        ("3.0", "3"),
        ("tp2-sp", "tp2-sp"),
        (None, "—"),
        (True, "True"),
    ],
)
def test_a_figure_reads_as_people_read_numbers(value, text):
    assert figure_text(value) == text


def test_the_filter_takes_its_significant_figures():
    rendered = Template("{% load figures %}{{ a|figure }} {{ a|figure:6 }} {{ b|figure }}").render(
        Context({"a": 0.000117331, "b": 175209209856})
    )
    assert rendered == "0.0001173 0.000117331 175,209,209,856"
