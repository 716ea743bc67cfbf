"""Writes of the failure-pattern knowledge base: the incident lists a team imports (CSV), its own history of
failures."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import transaction

from controlplane.failures.models import FailureIncident

# --- the failure-pattern knowledge base: a team's imported incidents ---------------------------------
MAX_INCIDENT_CSV_CHARS = 1_000_000  # ~20,000 incidents of ~50 characters: a large cluster's years of history

MAX_INCIDENTS_PER_TEAM = 100_000

MAX_LISTED_PROBLEMS = 10

# the times an incident may have: Unix time's start to the year 2100 (a typo guard; the database holds them)
INCIDENT_TIME_RANGE_S = (0.0, 4_102_444_800.0)


def incidents_import(*, team, text: str, source: str, created_by=None) -> dict:
    """Store the incidents of an incident list (CSV ``node,time,kind``, ``workers.reliability.risk.history``)
    for the team. Every problem is a ``ValueError`` naming the line and what is wrong, and nothing is
    stored; an incident the team already has (same node, time and kind) is counted once. Returns what was
    imported: rows, imported, duplicates, and the incidents per pattern."""
    from workers.planner.specs import name_problem
    from workers.reliability.risk.history import incident_rows
    from workers.reliability.risk.patterns import pattern_key

    if len(text) > MAX_INCIDENT_CSV_CHARS:
        raise ValueError(
            f"{source}: {len(text):,} characters, more than the {MAX_INCIDENT_CSV_CHARS:,} one import takes: "
            "split the list"
        )
    rows = incident_rows(text, source=source)
    if not rows:
        raise ValueError(f"{source}: a header but no incident (one line per incident: node,time,kind)")
    problems, incidents = [], {}
    low, high = INCIDENT_TIME_RANGE_S
    for lineno, failure in rows:
        problem = ""
        for what, value in (("node", failure.node), ("kind", failure.kind)):
            if why := name_problem(value):
                problem = f"{what} {why}"
                break
        else:
            if not pattern_key(failure.kind):
                problem = f"kind {failure.kind!r} has no letter or digit"
            elif not low <= failure.time_unix_s < high:
                problem = f"time {failure.time_unix_s:g} (Unix seconds) is not between 1970 and 2100"
        if problem:
            problems.append(f"{source}, line {lineno}: {problem}")
            continue
        when = datetime.fromtimestamp(failure.time_unix_s, UTC)
        incidents.setdefault((failure.node, when, failure.kind), lineno)
    if problems:
        more = len(problems) - MAX_LISTED_PROBLEMS
        listed = problems[:MAX_LISTED_PROBLEMS] + ([f"... and {more} more"] if more > 0 else [])
        raise ValueError("\n".join(listed))

    with transaction.atomic():
        times = [when for _, when, _ in incidents]
        existing = set(
            FailureIncident.objects.filter(
                team=team, occurred_at__gte=min(times), occurred_at__lte=max(times)
            ).values_list("node", "occurred_at", "kind")
        )
        new = {key: lineno for key, lineno in incidents.items() if key not in existing}
        held = FailureIncident.objects.filter(team=team).count()
        if held + len(new) > MAX_INCIDENTS_PER_TEAM:
            raise ValueError(
                f"{source}: {len(new):,} new incidents would make the team's {held + len(new):,}, more than the "
                f"{MAX_INCIDENTS_PER_TEAM:,} it may hold"
            )
        source_name = source[:200]
        FailureIncident.objects.bulk_create(
            [
                FailureIncident(
                    team=team,
                    node=node,
                    occurred_at=when,
                    kind=kind,
                    source=source_name,
                    line=lineno,
                    created_by=created_by,
                )
                for (node, when, kind), lineno in new.items()
            ],
            ignore_conflicts=True,  # a concurrent import of the same list: each incident once
            batch_size=1000,
        )
    per_pattern: dict[str, int] = {}
    for _node, _when, kind in new:
        key = pattern_key(kind)
        per_pattern[key] = per_pattern.get(key, 0) + 1
    return {
        "team": team.slug,
        "source": source_name,
        "rows": len(rows),
        "imported": len(new),
        "duplicates": len(rows) - len(new),
        "patterns": dict(sorted(per_pattern.items(), key=lambda kv: (-kv[1], kv[0]))),
    }
