"""Reads of live streams: missed events from Redis, older history from the database."""

from __future__ import annotations

from controlplane.live.models import StreamEvent


def stored_events(
    stream: str, *, after_seq: int = 0, before_seq: int | None = None, limit: int = 10_000
) -> list[dict]:
    qs = StreamEvent.objects.filter(stream=stream, seq__gt=after_seq)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return [row.as_event() for row in qs.order_by("seq")[:limit]]
