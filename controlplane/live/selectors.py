"""Reads of live streams: missed events from Redis, older history from the database, the relay's backlog."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Max

from controlplane.live.models import StreamEvent
from workers.events import STREAMS_SET, parse_entries, parse_time, seq_key, stream_of_key


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
    # one range over the (stream, seq) index, not seq IN (500 numbers): it runs before every batch is
    # forwarded, and finds no row at all in the usual case (new events come after every stored one)
    stored = dict(
        StreamEvent.objects.filter(stream=stream, seq__gte=min(seqs), seq__lte=max(seqs)).values_list(
            "seq", "time"
        )
    )
    return [e for e in events if e["seq"] in stored and stored[e["seq"]] != parse_time(e["time"])]


def highest_stored_seq(stream: str) -> int:
    return StreamEvent.objects.filter(stream=stream).aggregate(top=Max("seq"))["top"] or 0


@dataclass(frozen=True)
class RelayBacklog:
    """What the relay (consumer group ``relay``) has not stored yet, over every live stream."""

    events: int
    """Events appended but not acknowledged: never read, or read and not yet stored (pending)."""
    lag_s: float
    """Age of the oldest of them (0 when there are none)."""
    streams: int
    """Streams that have any."""


def relay_backlog(redis_client, *, group: str = "relay") -> RelayBacklog:
    """Read from Redis in a few pipelined round trips (every stream at once). An entry's id is ``<seq>-1``
    (``workers.events``), so the events a stream's group has not been given are its seq counter minus the
    seq of the last entry delivered; the oldest unacknowledged entry is the first pending one, else the
    first after the last delivered."""
    keys = sorted(redis_client.smembers(STREAMS_SET))
    if not keys:
        return RelayBacklog(0, 0.0, 0)
    pipe = redis_client.pipeline(transaction=False)
    for key in keys:
        pipe.xinfo_groups(key)
        pipe.get(seq_key(stream_of_key(key)))
    replies = pipe.execute(raise_on_error=False)
    behind: list[tuple[bytes, int, str, int]] = []  # key, pending, last delivered id, events
    for key, groups, counter in zip(keys, replies[0::2], replies[1::2], strict=True):
        if isinstance(groups, Exception):  # the key is gone (or not a stream): nothing to relay
            continue
        mine = next((g for g in groups if _text(g.get("name")) == group), None)
        last_id = _text(mine.get("last-delivered-id")) if mine else "0-0"
        pending = int(mine.get("pending") or 0) if mine else 0
        undelivered = max(0, int(counter or 0) - int(last_id.split("-")[0]))
        if pending + undelivered:
            behind.append((key, pending, last_id, pending + undelivered))
    if not behind:
        return RelayBacklog(0, 0.0, 0)
    pipe = redis_client.pipeline(transaction=False)
    for key, pending, last_id, _ in behind:
        if pending:
            pipe.xpending_range(key, group, min="-", max="+", count=1)
        else:
            pipe.xrange(key, min=f"({last_id}", max="+", count=1)
    oldest = None
    for (key, pending, _, _), reply in zip(behind, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, Exception) or not reply:
            continue
        entries = redis_client.xrange(key, min=reply[0]["message_id"], max="+", count=1) if pending else reply
        if entries:
            at = parse_time(parse_entries(entries)[0]["time"])
            oldest = at if oldest is None else min(oldest, at)
    lag = max(0.0, (datetime.now(UTC) - oldest).total_seconds()) if oldest is not None else 0.0
    return RelayBacklog(sum(b[3] for b in behind), lag, len(behind))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
