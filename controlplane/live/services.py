"""Writes for live streams: publish an event (now or after the commit it describes), persist a batch."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from django.db import transaction

from controlplane.common.redis import redis_client
from controlplane.live.models import StreamEvent
from workers.events import EventWriter


@functools.cache
def _writer() -> EventWriter:
    return EventWriter(redis_client())


def publish(stream: str, kind: str, values: dict[str, Any], step: int | None = None) -> int:
    """Append an event to a stream; the relay forwards it to subscribers. Call it after the commit that
    the event describes (``transaction.on_commit``)."""
    return _writer().publish(stream, kind, values, step=step)


def publish_after_commit(stream: str, kind: str, values: dict[str, Any], step: int | None = None) -> None:
    """Publish once the surrounding transaction commits (at once outside one): a subscriber that reacts
    to the event then reads the rows it describes. Every Celery-side and API-side write uses this."""
    transaction.on_commit(lambda: publish(stream, kind, values, step=step))


def persist_events(events: list[dict]) -> int:
    """Store a batch of events; re-delivered ones (same stream and seq) are ignored. Returns the count sent."""
    rows = [
        StreamEvent(
            stream=e["stream"],
            seq=e["seq"],
            time=datetime.fromisoformat(e["time"].replace("Z", "+00:00")),
            kind=e["kind"],
            step=e.get("step"),
            values=e.get("values") or {},
        )
        for e in events
    ]
    StreamEvent.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
    return len(rows)
