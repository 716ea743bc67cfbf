"""Counts as people read them on the pages (controlplane/planning/templatetags/humanize_figures.py): three
significant figures and the unit; a small model's parameters in M, not "0.0 B" (issue 35)."""

from __future__ import annotations

import pytest
from django.template import Context, Template


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (175_209_209_856, "175 B"),
        (1.08e12, "1.08 T"),
        (25_000_000, "25 M"),
        (4_096, "4.1 k"),
        (12, "12"),
        (None, "—"),
    ],
)
def test_count_text(value, text):
    from controlplane.planning.templatetags.humanize_figures import count_text

    assert count_text(value) == text


@pytest.mark.parametrize(("billions", "text"), [(7.0, "7 B"), (0.025, "25 M"), (0.0004, "400 k"), ("x", "—")])
def test_billions_text(billions, text):
    from controlplane.planning.templatetags.humanize_figures import billions_text

    assert billions_text(billions) == text


def test_node_counts_are_pluralised_on_the_planner_pages():
    """ "1 node", not "1 nodes": no planner template writes a count followed by a fixed "nodes"."""
    import re
    from pathlib import Path

    assert Template("{{ n }} node{{ n|pluralize }}").render(Context({"n": 1})) == "1 node"
    folder = Path(__file__).resolve().parents[2] / "frontend" / "templates" / "planning"
    fixed = {p.name: re.findall(r"\}\} nodes\b", p.read_text()) for p in folder.glob("*.html")}
    assert {name: found for name, found in fixed.items() if found} == {}
