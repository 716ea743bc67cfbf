"""Writes for live streams: publish an event (now or after the commit it describes), persist a batch."""

from __future__ import annotations

import functools
import logging
from typing import Any

import redis
from django.db import transaction

from controlplane.common.redis import redis_client
from controlplane.live.models import PendingEvent, StreamEvent
from workers.events import EventWriter, parse_time

log = logging.getLogger(__name__)


@functools.cache
def _writer() -> EventWriter:
    return EventWriter(redis_client())


def publish(stream: str, kind: str, values: dict[str, Any], step: int | None = None) -> int:
    """Append an event to a stream; the relay forwards it to subscribers. Call it after the commit that
    the event describes (``transaction.on_commit``)."""
    return _writer().publish(stream, kind, values, step=step)


def publish_after_commit(stream: str, kind: str, values: dict[str, Any], step: int | None = None) -> None:
    """Publish once the surrounding transaction commits (at once outside one): a subscriber that reacts
    to the event then reads the rows it describes. Every Celery-side and API-side write uses this. When
    Redis is away at that moment the event waits in the database (``PendingEvent``) and the relay publishes
    it when Redis is back: the state change it describes has happened, so the event must not be lost."""

    def send() -> None:
        try:
            publish(stream, kind, values, step=step)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            PendingEvent.objects.create(stream=stream, kind=kind, step=step, values=values)
            log.warning("Redis unavailable (%s): %s event on %s kept for the relay", exc, kind, stream)

    transaction.on_commit(send)


def publish_pending_events(*, limit: int = 500) -> int:
    """Publish the events kept while Redis was away, oldest first (the relay calls this every few
    seconds); each row is removed once its event is in Redis. Returns how many were published."""
    sent = 0
    for row in PendingEvent.objects.all()[:limit]:
        publish(row.stream, row.kind, row.values, step=row.step)
        PendingEvent.objects.filter(pk=row.pk).delete()
        sent += 1
    return sent


def persist_events(events: list[dict]) -> int:
    """Store a batch of events; re-delivered ones (same stream and seq) are ignored. Returns the count sent.
    The relay first sets aside events whose number is already taken by another event
    (:func:`controlplane.live.selectors.clashing_events`): those are renumbered, never dropped."""
    rows = [
        StreamEvent(
            stream=e["stream"],
            seq=e["seq"],
            time=parse_time(e["time"]),
            kind=e["kind"],
            step=e.get("step"),
            values=e.get("values") or {},
        )
        for e in events
    ]
    StreamEvent.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
    return len(rows)
