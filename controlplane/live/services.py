"""Writes for live streams: publish an event (now or after the commit it describes), persist a batch."""

from __future__ import annotations

import functools
import json
import logging
from datetime import timedelta
from typing import Any

import kombu.exceptions
import redis
from django.db import connection, transaction
from django.utils import timezone

from controlplane.common.redis import redis_client
from controlplane.live.models import PendingEvent, PendingTask, StreamEvent
from controlplane.live.selectors import highest_stored_seq
from workers.events import EventWriter, StreamNotReady, parse_time

log = logging.getLogger(__name__)


@functools.cache
def event_writer() -> EventWriter:
    return EventWriter(redis_client())


def publish(stream: str, kind: str, values: dict[str, Any], step: int | None = None) -> int:
    """Append an event to a stream; the relay forwards it to subscribers. Call it after the commit that
    the event describes (``transaction.on_commit``). Guarded (``workers.events``): a stream with no counter
    is opened here when nothing of it is stored (no subscriber has seen a number of it), else :class:`StreamNotReady` -- Redis
    lost its data, and the relay, which knows the highest number subscribers have seen, restores it."""
    writer = event_writer()
    try:
        return writer.publish(stream, kind, values, step=step, guarded=True)
    except StreamNotReady:
        if StreamEvent.objects.filter(stream=stream).exists():
            raise
        writer.open_stream(stream, 0)
        return writer.publish(stream, kind, values, step=step, guarded=True)


def publish_after_commit(stream: str, kind: str, values: dict[str, Any], step: int | None = None) -> None:
    """Publish once the surrounding transaction commits (at once outside one): a subscriber that reacts
    to the event then reads the rows it describes. Every Celery-side and API-side write uses this. When
    Redis is away at that moment the event waits in the database (``PendingEvent``) and the relay publishes
    it when Redis is back: the state change it describes has happened, so the event must not be lost."""

    def send() -> None:
        try:
            publish(stream, kind, values, step=step)
        except (redis.ConnectionError, redis.TimeoutError, StreamNotReady) as exc:
            PendingEvent.objects.create(stream=stream, kind=kind, step=step, values=values)
            log.warning("Redis unavailable (%s): %s event on %s kept for the relay", exc, kind, stream)
        except redis.ResponseError as exc:
            # the stream refuses the append: a job's own code, which may write to its stream, broke its
            # numbering (a raw XADD above it). The state change is stored; only this stream's live view
            # misses it, and the request or task that made it must not fail for that
            log.warning("%s event on %s not published: %s", kind, stream, exc)

    transaction.on_commit(send)


BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.ConnectionError, redis.TimeoutError)
"""What sending a task raises while the broker (Redis) is away."""

STREAM_RESTORE_GRACE = timedelta(seconds=10)
"""An event kept because its stream had no counter waits this long for the relay to restore it."""
PENDING_TASK_GRACE_S = 10.0
"""A pending task younger than this is left to the request that wrote it (it sends it right after its commit):
the relay sends only what that send did not."""


def enqueue_after_commit(task, args: tuple | list, *, queue: str, on_deferred=None) -> PendingTask:
    """Send Celery ``task`` with ``args`` to ``queue`` once the surrounding transaction commits, through a
    transactional outbox: the :class:`PendingTask` row is written in that transaction, removed once the task
    is sent. When the broker is away at the commit, the row stays, ``on_deferred(exc)`` is called (a request
    then says so: 202, not 503), and the relay sends it when Redis is back (:func:`send_pending_tasks`).
    The tasks sent so check their row's state first (a second send of one finds it moved on and skips)."""
    row = PendingTask.objects.create(task=task.name, args=list(args), queue=queue)

    def send() -> None:
        try:
            task.apply_async(tuple(args), queue=queue)
        except BROKER_ERRORS as exc:
            PendingTask.objects.filter(pk=row.pk).update(
                attempts=1, last_error=f"{type(exc).__name__}: {exc}"
            )
            log.warning("broker unavailable (%s): %s kept for the relay to send", exc, row)
            if on_deferred is not None:
                on_deferred(exc)
            return
        PendingTask.objects.filter(pk=row.pk).delete()

    transaction.on_commit(send)
    return row


def note_deferred(obj):
    """An ``on_deferred`` for :func:`enqueue_after_commit` that marks ``obj``: ``obj.dispatch_deferred`` says why
    (a view then answers 202 and says the work is queued for when the broker is back)."""

    def note(exc: Exception) -> None:
        obj.dispatch_deferred = f"{type(exc).__name__}: {exc}"

    return note


def send_pending_tasks(*, limit: int = 200) -> int:
    """Send the tasks whose send after their commit failed (or never ran: the process died), oldest first
    (the relay calls this every few seconds); each row is removed once its task is with the broker."""
    from celery import current_app

    sent = 0
    cutoff = timezone.now() - timedelta(seconds=PENDING_TASK_GRACE_S)
    for row in PendingTask.objects.filter(created_at__lte=cutoff)[:limit]:
        try:
            current_app.send_task(row.task, args=row.args, queue=row.queue)
        except BROKER_ERRORS as exc:
            PendingTask.objects.filter(pk=row.pk).update(
                attempts=row.attempts + 1, last_error=f"{type(exc).__name__}: {exc}"
            )
            return sent  # still away: the rest waits for the next round
        PendingTask.objects.filter(pk=row.pk).delete()
        log.info("sent %s, kept %s while the broker was away", row, timezone.now() - row.created_at)
        sent += 1
    return sent


def publish_pending_events(*, limit: int = 500) -> int:
    """Publish the events kept while Redis was away, oldest first (the relay calls this every few
    seconds); each row is removed once its event is in Redis. Returns how many were published."""
    sent, waiting = 0, set()
    for row in PendingEvent.objects.all()[:limit]:
        if row.stream in waiting:
            continue  # in order: none of a stream's later events before its earlier one
        try:
            publish(row.stream, row.kind, row.values, step=row.step)
        except StreamNotReady:
            if timezone.now() - row.created_at < STREAM_RESTORE_GRACE:
                waiting.add(row.stream)  # the relay restores the counters of the streams it forwards
                continue
            # a stream no relay restored in that time is no stream it forwards: numbered on from its history
            event_writer().open_stream(row.stream, highest_stored_seq(row.stream))
            publish(row.stream, row.kind, row.values, step=row.step)
        PendingEvent.objects.filter(pk=row.pk).delete()
        sent += 1
    return sent


def persist_events(events: list[dict]) -> int:
    """Store a batch of events in one transaction; re-delivered ones (same stream and seq) are ignored.
    Returns the count sent. The relay first sets aside events whose number is already taken by another
    event (:func:`controlplane.live.selectors.clashing_events`): those are renumbered, never dropped.

    Plain tuples in multi-row ``INSERT ... VALUES (...), (...) ON CONFLICT DO NOTHING`` statements
    (SQLite >= 3.24 and PostgreSQL both have it), values encoded to JSON once, here, as ``JSONField``
    would: the ORM's ``bulk_create`` builds a model instance per row and was most of the relay's time, so
    at 2,000 events/s it fell behind (issue 16). ``executemany`` is as fast on SQLite but sends one
    statement per row to PostgreSQL. Per 500 events, medians on the busy 2-core bench machine:
    SQLite bulk_create 128 ms, executemany 46 ms, this 49 ms; PostgreSQL 121, 109 and 46 ms."""
    if not events:
        return 0
    adapt_time = connection.ops.adapt_datetimefield_value
    rows = [
        (
            e["stream"],
            e["seq"],
            adapt_time(parse_time(e["time"])),
            e["kind"],
            e.get("step"),
            json.dumps(e.get("values") or {}, separators=(",", ":"), allow_nan=False),
        )
        for e in events
    ]
    with transaction.atomic(), _unlogged_cursor() as cursor:
        for start in range(0, len(rows), ROWS_PER_INSERT):
            chunk = rows[start : start + ROWS_PER_INSERT]
            cursor.execute(_insert_sql(len(chunk)), [value for row in chunk for value in row])
    return len(rows)


def _unlogged_cursor():
    """A cursor whose statements stay out of ``DEBUG``'s query log (what ``connection.cursor()`` returns
    when DEBUG is off; database errors are still Django's). Under ``make run`` (DEBUG on) the relay's
    INSERTs of 900 parameters each would be quoted again to be logged (SQLite: one more ``SELECT
    QUOTE(?), ...`` per statement, a third of the write's time) and the log would keep 9,000 of them
    (~200 MB) in a process that runs for weeks."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        return connection.make_cursor(connection.create_cursor())


_STORED_FIELDS = ("stream", "seq", "time", "kind", "step", "values")
# 150 rows x 6 columns = 900 parameters: under SQLite's historical limit of 999 per statement
ROWS_PER_INSERT = 150


@functools.cache
def _insert_sql(rows: int) -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(StreamEvent._meta.get_field(name).column) for name in _STORED_FIELDS)
    row = "(" + ", ".join(["%s"] * len(_STORED_FIELDS)) + ")"
    return (
        f"INSERT INTO {quote(StreamEvent._meta.db_table)} ({columns}) VALUES {', '.join([row] * rows)} "
        "ON CONFLICT DO NOTHING"
    )
