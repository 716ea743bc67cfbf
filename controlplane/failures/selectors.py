"""Reads of the failure-pattern knowledge base: every pattern, extended by the user's teams' incidents."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import Count, QuerySet

from controlplane.accounts.selectors import scoped
from controlplane.failures.models import FailureIncident
from workers.reliability.risk.patterns import extend_with_incidents, failure_patterns, pattern_key
from workers.reliability.risk.traces import Failure

LISTED_NODES = 100
"""Nodes a pattern names at most (``node_count`` says how many there are)."""


def incidents_of(user) -> QuerySet[FailureIncident]:
    """The incidents the user's teams imported, newest first."""
    return scoped(FailureIncident.objects.all(), user).select_related("team")


def pattern_values(pattern, sources: dict[str, dict[str, int]]) -> dict:
    values = pattern.to_dict()
    observed = values["observed"]
    if observed is not None:
        nodes = observed["nodes"]
        observed.update(
            first_seen=datetime.fromtimestamp(observed.pop("first_seen_unix_s"), UTC),
            last_seen=datetime.fromtimestamp(observed.pop("last_seen_unix_s"), UTC),
            nodes=list(nodes[:LISTED_NODES]),
            node_count=len(nodes),
            sources=[
                {"name": name, "count": n}
                for name, n in sorted(sources.get(pattern.key, {}).items(), key=lambda kv: (-kv[1], kv[0]))
            ],
        )
    return values


def failure_patterns_of(user) -> list[dict]:
    """Every failure pattern (``patterns.failure_patterns``: published kinds, their precursors, rates with
    sources and prevention actions) extended by the incidents the user's teams imported: what they observed
    of each kind (count, share, first and last time, nodes, the incident lists it came from), then the
    kinds only they name."""
    incidents = incidents_of(user)
    failures = [
        Failure(node=node, time_unix_s=at.timestamp(), kind=kind)
        for node, at, kind in incidents.values_list("node", "occurred_at", "kind").iterator()
    ]
    sources: dict[str, dict[str, int]] = {}
    for row in incidents.order_by().values("kind", "source").annotate(n=Count("id")):
        per_source = sources.setdefault(pattern_key(row["kind"]), {})
        per_source[row["source"]] = per_source.get(row["source"], 0) + row["n"]
    return [pattern_values(p, sources) for p in extend_with_incidents(failure_patterns(), failures)]


def failure_pattern_of(user, key: str) -> dict | None:
    """One pattern by its key (or a kind as written, matched as the import matches kinds), None when neither
    the catalog nor the user's teams' incidents know it."""
    wanted = pattern_key(key)
    return next((p for p in failure_patterns_of(user) if p["key"] == wanted), None) if wanted else None


def pattern_incidents(user, pattern: dict, limit: int = 50) -> list[FailureIncident]:
    """The newest incidents of a pattern among the user's teams'."""
    spellings = (pattern.get("observed") or {}).get("spellings") or []
    return list(incidents_of(user).filter(kind__in=spellings)[:limit])
