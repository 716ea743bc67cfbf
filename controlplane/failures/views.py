"""Pages of the failure-pattern knowledge base: the list (with an incident-list import) and one page per
pattern."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse

from controlplane.accounts.selectors import teams_of
from controlplane.failures import selectors, services

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def rate_text(rate: float | None) -> str:
    """A small rate as a person reads it: 0.00134 -> ``1.3×10⁻³``."""
    if rate is None:
        return "—"
    if rate == 0:
        return "0"
    mantissa, exponent = f"{rate:.1e}".split("e")
    return f"{mantissa}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def _lead(precursor: dict | None) -> str:
    from workers.reliability.risk.patterns import lead_text

    if not precursor or not precursor["share"] or not precursor["signals"]:
        return ""
    return lead_text(precursor["lead_min_s"], precursor["lead_max_s"])


def _percent(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:.1f}%"


def _pattern_page_values(pattern: dict) -> dict:
    published, precursor, observed = pattern["published"], pattern["precursor"], pattern["observed"]
    return {
        **pattern,
        "share_text": _percent(published["share"] if published else None),
        "rate_text": rate_text(published["rate_per_node_day"] if published else None),
        "precursor_share_text": f"{100 * precursor['share']:.0f}%" if precursor else "—",
        "observed_share_text": _percent(observed["share"] if observed else None),
        "lead": _lead(precursor),
        "more_nodes": observed["node_count"] - len(observed["nodes"]) if observed else 0,
    }


def _pattern_sources() -> dict:
    from workers.reliability.risk.patterns import PRECURSOR_SOURCE
    from workers.reliability.risk.simulator import (
        LLAMA3_RATE_SOURCE,
        LLAMA3_TABLE5_NOTE,
        LLAMA3_TABLE5_SOURCE,
    )

    return {
        "table5": LLAMA3_TABLE5_SOURCE,
        "table5_note": LLAMA3_TABLE5_NOTE,
        "rate": LLAMA3_RATE_SOURCE,
        "precursors": PRECURSOR_SOURCE,
    }


@login_required
def failure_pattern_list(request):
    patterns = [_pattern_page_values(p) for p in selectors.failure_patterns_of(request.user)]
    incidents = selectors.incidents_of(request.user)
    return render(
        request,
        "failures/failure_patterns.html",
        {
            "patterns": patterns,
            "sources": _pattern_sources(),
            "incident_count": incidents.count(),
            "incident_lists": list(
                incidents.order_by("source").values("source", "team__name").annotate(n=Count("id"))
            ),
            "teams": list(teams_of(request.user)),
            "page": {
                "api": reverse("api:failure-incident-list"),
                "max_chars": services.MAX_INCIDENT_CSV_CHARS,
            },
        },
    )


@login_required
def failure_pattern_detail(request, key: str):
    pattern = selectors.failure_pattern_of(request.user, key)
    if pattern is None:
        raise Http404(
            f"No failure pattern {key!r}: neither a published kind nor a kind your teams' incidents name."
        )
    if pattern["key"] != key:  # a kind as written (GPU HBM3 Memory): the pattern's own address
        return redirect("failure-pattern-detail", key=pattern["key"])
    return render(
        request,
        "failures/failure_pattern_detail.html",
        {
            "pattern": _pattern_page_values(pattern),
            "sources": _pattern_sources(),
            "incidents": selectors.pattern_incidents(request.user, pattern),
        },
    )
