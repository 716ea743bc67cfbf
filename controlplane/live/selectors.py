"""Reads of live streams: missed events from Redis, older history from the database."""

from __future__ import annotations

from django.db.models import Max

from controlplane.live.models import StreamEvent
from workers.events import parse_time


def stored_events(
    stream: str, *, after_seq: int = 0, before_seq: int | None = None, limit: int = 10_000
) -> list[dict]:
    qs = StreamEvent.objects.filter(stream=stream, seq__gt=after_seq)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return [row.as_event() for row in qs.order_by("seq")[:limit]]


def clashing_events(stream: str, events: list[dict]) -> list[dict]:
    """The events whose number the database already holds for another event (another time or kind): they
    were numbered by a Redis counter that restarted. A re-delivered event (same number, same time) is not
    a clash."""
    seqs = [e["seq"] for e in events]
    if not seqs:
        return []
    stored = dict(StreamEvent.objects.filter(stream=stream, seq__in=seqs).values_list("seq", "time"))
    return [e for e in events if e["seq"] in stored and stored[e["seq"]] != parse_time(e["time"])]


def highest_stored_seq(stream: str) -> int:
    return StreamEvent.objects.filter(stream=stream).aggregate(top=Max("seq"))["top"] or 0
