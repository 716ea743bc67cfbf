"""The metric relay: reads every live stream from Redis, forwards each batch to the Channels group of the
stream, and persists it.

It reads through a Redis consumer group, so an event is acknowledged only after it is stored: a relay that
dies mid-batch re-reads its pending events when it comes back (persisting is idempotent on ``(stream,
seq)``), and several relays can share the work. Producers (training ranks, Celery tasks) know nothing about
Channels or the database: they only append to Redis (``workers.events``).

Under load (issue 16, ``bench/live_fanout.py``) the relay forwards a batch, hands it to its store thread
and reads the next one: the database write of one batch overlaps the reading and forwarding of the next
(``store_ahead`` batches at most wait for the store; then reading waits, and the backlog stays in Redis).
The store thread acknowledges a batch only once it is stored; a batch it fails to store stays pending in
Redis and is read, forwarded and stored again (subscribers drop the repeats).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass

import redis
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connections

from controlplane.live.selectors import clashing_events, highest_stored_seq
from controlplane.live.services import persist_events
from controlplane.live.streams import FORWARDED_LUA, events_message, forwarded_key, group_name
from workers.events import (
    KINDS,
    STREAMS_NEW,
    STREAMS_SET,
    EventWriter,
    parse_time,
    renumber_floor,
    seq_key,
    stream_of_key,
)

log = logging.getLogger(__name__)

GROUP = "relay"
# entries another relay read but never acknowledged (it died) are taken over after this long
CLAIM_IDLE_MS = 30_000
# websocket frames a second the relay's linger aims at, over all subscribers. bench/live_fanout.py on this
# 2-core machine (2026-12-07): at 2,500 ten clients x 500 events/s got 2,069 frames/s, a daphne at 63% of a
# core and p99 134 ms; at 500 they get 498 frames/s (16%, p99 27 ms) and one client's p99 falls from 24 ms
# (a fixed 20 ms linger) to 11 ms
FRAME_BUDGET_PER_S = 500
# a stream that had events in the last HWM_ACTIVE_S seconds gets its high-water mark re-sent every
# HWM_EVERY_S: a subscriber whose tail was dropped by the channel layer (over capacity) backfills from it
HWM_EVERY_S = 1.0
HWM_ACTIVE_S = 15.0
# every RESTORE_EVERY_S the relay checks that the streams it forwards (and the apps' active ones) still have
# their counters: a Redis that came back without its data has none, and guarded producers wait for them
RESTORE_EVERY_S = 1.0
FORWARDED_KEPT_S = 3600.0


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON an event may hold")


def _is_time(text) -> bool:
    try:
        return isinstance(text, str) and parse_time(text).tzinfo is not None
    except ValueError:
        return False


@dataclass(frozen=True)
class StoreBatch:
    """One stream's events as read (entry ids beside them), forwarded and waiting to be stored and acked."""

    key: bytes
    stream: str
    entry_ids: list
    events: list[dict]


class Relay:
    # the write of one batch; a class attribute so the bench's baseline relay can put the old one back
    persist = staticmethod(persist_events)

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        batch: int = 500,
        max_batch: int = 2000,
        block_ms: int = 500,
        linger_ms: float = 20.0,
        store_ahead: int = 4,
        periodic=(),
        on_stored=(),
        active_streams=(),
    ):
        self.redis = redis.Redis.from_url(
            redis_url or settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5
        )
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        # entries read per stream and round: ``batch``, doubled up to ``max_batch`` while a read comes back
        # full (a backlog), halved back when it does not: fewer, larger batches and frames while catching up
        self.batch = batch
        self.max_batch = max(batch, max_batch)
        self.count = batch
        self.block_ms = block_ms
        # after a round that read little, the next read waits until a linger after the previous one began,
        # so a trickle from many producers goes out as one frame per subscriber per linger instead of one
        # per append (50 clients x 500 appends/s would be 25,000 frames/s for one daphne); a read that comes
        # back full never waits. The linger follows the websocket frames the last round sent (one per
        # subscriber of each batch): FRAME_BUDGET_PER_S frames a second at most, up to linger_ms (its bound
        # on the latency added). One subscriber gets each append within a millisecond; 50 get a frame
        # every linger_ms.
        self.linger_max_s = linger_ms / 1000
        self.linger_s = self.linger_max_s
        self.round_frames = 0
        self.last_read = 0.0
        self.known: set[bytes] = set()
        self.layer = get_channel_layer()
        # one event loop for the relay's life: channels_redis keeps its connection pool per loop, and
        # async_to_sync would build a new loop (and new connections) for every batch
        self.loop = asyncio.new_event_loop()
        self.writer = EventWriter(self.redis)
        self.mark_forwarded = self.redis.register_script(FORWARDED_LUA)
        # stream -> (last seq forwarded, when), kept an hour: what a restored counter goes on from, and (those
        # forwarded within HWM_ACTIVE_S) the high-water marks sent to subscribers
        self.forwarded: dict[str, tuple[int, float]] = {}
        self.active_streams = list(active_streams)
        self.last_restore = 0.0
        self.last_hwm = 0.0
        self.stop = threading.Event()
        self.last_claim = 0.0
        # (interval_s, callable) run between reads: housekeeping that must happen even when no event flows
        self.periodic = [[interval, fn, 0.0] for interval, fn in periodic]
        # callables (stream, events) told about every stored batch (the jobs app keeps a job's progress)
        self.on_stored = list(on_stored)
        # our own pending entries (read, not acknowledged) are read again when this is set: at start (a
        # relay of the same name that died), after a failure, after claiming another relay's entries
        self.reread_pending = True
        # the store thread: ``store_ahead`` batches may wait for it (0: store in line, before the next read)
        self.store_ahead = store_ahead
        self.store_queue: queue.Queue[StoreBatch | None] = queue.Queue(maxsize=max(1, store_ahead))
        self.store_failure: BaseException | None = None
        self.queued_upto: dict[str, int] = {}  # stream -> highest seq handed to the store thread
        self.store_thread: threading.Thread | None = None
        if store_ahead > 0:
            self.store_thread = threading.Thread(target=self.store_loop, name="relay-store", daemon=True)
            self.store_thread.start()

    def discover(self) -> None:
        # the new-stream wake-ups are read beside the streams (a new one ends the blocking read: see handle)
        for key in (self.redis.smembers(STREAMS_SET) | {STREAMS_NEW.encode()}) - self.known:
            try:
                self.redis.xgroup_create(key, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self.known.add(key)

    def handle(self, response) -> int:
        """Forward and store (or hand to the store thread) what one XREADGROUP returned."""
        handled = 0
        for key, entries in response or []:
            if not entries:
                continue
            if key == STREAMS_NEW.encode():
                # a stream was added: the next round discovers it and reads at once (no linger)
                ids = [entry_id for entry_id, _ in entries]
                self.redis.xack(key, GROUP, *ids)
                self.redis.xdel(key, *ids)
                self.last_read = 0.0
                continue
            stream = stream_of_key(key)
            # each entry is one event's JSON (``workers.events``): the batch is parsed in one call, and
            # forwarded as the entries' own text joined, not encoded again
            raws, pairs = self.parsed(key, stream, entries)
            if not pairs:
                handled += len(entries)
                continue
            joined = b"[" + b",".join(raws) + b"]"
            if pairs[0][1]["seq"] <= self.queued_upto.get(stream, 0):
                # not after what the store thread holds (read again, or a restarted counter): checking
                # clashes against the database needs those stored first
                self.wait_stored()
            floor = self.restarted_counter_floor(stream, [event for _, event in pairs])
            moved = [(entry_id, event) for entry_id, event in pairs if event["seq"] <= floor]
            kept = [(entry_id, event) for entry_id, event in pairs if event["seq"] > floor]
            if kept:
                events = [event for _, event in kept]
                if len(kept) < len(pairs):
                    kept_raws = (raw for raw, (_, e) in zip(raws, pairs, strict=True) if e["seq"] > floor)
                    joined = b"[" + b",".join(kept_raws) + b"]"
                # forwarded first, then stored: subscribers do not wait for the database write (the
                # relay's biggest cost per event); one that resumes gets these from Redis, and a relay that
                # dies before storing them re-reads them unacknowledged (subscribers drop the repeats)
                # marked first: a socket that fills a gap before this batch reaches it reads these from Redis
                self.mark_forwarded(keys=[forwarded_key(stream)], args=[events[-1]["seq"]])
                self.round_frames += self.send(
                    group_name(stream), events_message(stream, events, encoded=joined.decode()), count=True
                )
                self.forwarded[stream] = (events[-1]["seq"], time.monotonic())
                batch = StoreBatch(key, stream, [entry_id for entry_id, _ in kept], events)
                if self.store_thread is None:
                    self.store([batch])
                else:
                    self.queued_upto[stream] = max(self.queued_upto.get(stream, 0), events[-1]["seq"])
                    self.store_queue.put(batch)  # blocks while store_ahead batches wait: back-pressure
            if moved:
                seqs = self.writer.renumber(stream, moved, floor, group=GROUP)
                log.warning(
                    "relay: %s: %d event(s) numbered by a restarted Redis counter (seq %d..%d) renumbered "
                    "to %d..%d; none of them dropped (what Redis lost before it was read is counted when the "
                    "job ends: controlplane.jobs.services.delivery)",
                    stream,
                    len(moved),
                    moved[0][1]["seq"],
                    moved[-1][1]["seq"],
                    seqs[0],
                    seqs[-1],
                )
            handled += len(entries)
        return handled

    def parsed(self, key, stream: str, entries) -> tuple[list[bytes], list[tuple]]:
        """The entries' raw JSON and ``(entry id, event)`` pairs, in order. A job's ranks publish with a
        credential that can append to their own stream only (``controlplane.live.credentials``), but what
        they append is theirs to write: an entry that is not an event of this very stream (no ``event``
        field, not JSON, another stream's name, no ``seq``) is dropped and acknowledged, with a warning,
        instead of stopping the relay or landing in another job's history."""
        raws = [fields.get(b"event") for _, fields in entries]
        try:
            events = (
                json.loads(b"[" + b",".join(raws) + b"]", parse_constant=_no_constant)
                if all(isinstance(r, bytes) for r in raws)
                else None
            )
        except ValueError:
            events = None
        if events is None or len(events) != len(raws):  # the slow path: one entry at a time
            events = []
            for raw in raws:
                try:
                    events.append(
                        json.loads(raw, parse_constant=_no_constant) if isinstance(raw, bytes) else None
                    )
                except ValueError:
                    events.append(None)
        good_raws, pairs, bad = [], [], []
        for (entry_id, _), raw, event in zip(entries, raws, events, strict=True):
            if (
                isinstance(event, dict)
                and event.get("stream") == stream
                and type(event.get("seq")) is int
                and event.get("kind") in KINDS
                and (event.get("step") is None or type(event.get("step")) is int)
                and isinstance(event.get("values", {}), dict)
                and _is_time(event.get("time"))
            ):
                good_raws.append(raw)
                pairs.append((entry_id, event))
            else:
                bad.append(entry_id)
        if bad:
            log.warning(
                "relay: %s: %d entr(ies) that are not events of this stream dropped", stream, len(bad)
            )
            self.redis.xack(key, GROUP, *bad)
            self.redis.xdel(key, *bad)
        return good_raws, pairs

    def store(self, batches: list[StoreBatch]) -> None:
        """Persist batches (one transaction), tell the listeners (once per stream), then acknowledge them:
        only a stored event is acked."""
        by_stream: dict[str, list[dict]] = {}
        for batch in batches:
            by_stream.setdefault(batch.stream, []).extend(batch.events)
        self.persist([event for events in by_stream.values() for event in events])
        for stream, events in by_stream.items():
            for fn in self.on_stored:
                try:
                    fn(stream, events)
                except Exception:  # noqa: BLE001 - a listener must not stop the relay
                    log.exception("relay: %s failed on %s", getattr(fn, "__name__", fn), stream)
        for batch in batches:
            try:
                self.redis.xack(batch.key, GROUP, *batch.entry_ids)
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # Redis lost its data since the batch was read (the stream is back, its group not yet):
                # there is nothing left to acknowledge
                log.info("relay: %s: nothing to acknowledge (%s)", batch.stream, exc)

    def store_loop(self) -> None:
        """The store thread: stores batches in the order they were read, all those waiting at once (a
        store that fell behind catches up in larger writes, with one listener call per stream). A batch
        that fails stays pending in Redis; the failure is raised in the relay's loop (``step``), which backs
        off and reads it again."""
        closing = False
        while not closing:
            batches = [self.store_queue.get()]
            while True:
                try:
                    batches.append(self.store_queue.get_nowait())
                except queue.Empty:
                    break
            closing = None in batches
            try:
                if stored := [batch for batch in batches if batch is not None]:
                    self.store(stored)
            except Exception as exc:  # noqa: BLE001 - handed to the relay's loop, which decides
                if self.store_failure is None:
                    self.store_failure = exc
                close_old_connections()  # a broken connection is opened again for the next batch
            finally:
                for _ in batches:
                    self.store_queue.task_done()
        connections.close_all()  # this thread's own connection

    def wait_stored(self) -> None:
        """Return once every batch handed to the store thread is stored (or has failed)."""
        if self.store_thread is not None:
            self.store_queue.join()
        self.queued_upto.clear()

    def close(self) -> None:
        """Store what was handed over, then end the store thread."""
        if self.store_thread is not None and self.store_thread.is_alive():
            self.store_queue.put(None)
            self.store_thread.join(timeout=30)
        self.loop.close()

    def send(self, group: str, message: dict, *, count: bool = False) -> int:
        """Send ``message`` to the group; with ``count``, return how many channels the group has (0 when not
        counted, or when the layer cannot say: the linger then stays at its bound)."""
        return self.loop.run_until_complete(self._send(group, message, count))

    async def _send(self, group: str, message: dict, count: bool) -> int:
        await self.layer.group_send(group, message)
        if not count:
            return 0
        # Channels has no API for a group's size: channels_redis keeps a group as a sorted set of its
        # channels (the one group_send reads); another layer gives no count and the full linger
        try:
            key = self.layer._group_key(group)
            connection = self.layer.connection(self.layer.consistent_hash(group))
        except AttributeError:
            return FRAME_BUDGET_PER_S
        return int(await connection.zcard(key))

    def send_high_water_marks(self) -> None:
        """Tell the subscribers of recently active streams the last seq forwarded (``live.hwm``)."""
        now = time.monotonic()
        if now - self.last_hwm < HWM_EVERY_S:
            return
        self.last_hwm = now
        for stream, (seq, at) in list(self.forwarded.items()):
            if now - at <= HWM_ACTIVE_S:
                self.send(group_name(stream), {"type": "live.hwm", "stream": stream, "seq": seq})

    def restore_counters(self) -> list[str]:
        """Give back their counters to the streams that lost them (Redis came back without its data): those
        this relay forwarded within the hour and the apps' active ones (``housekeeping.active_streams``),
        each numbered on from the highest seq stored or forwarded -- what a subscriber may have seen. Guarded
        producers wait for this (``workers.events``); returns the streams restored."""
        now = time.monotonic()
        if now - self.last_restore < RESTORE_EVERY_S:
            return []
        self.last_restore = now
        for stream, (_seq, at) in list(self.forwarded.items()):
            if now - at > FORWARDED_KEPT_S:
                del self.forwarded[stream]
        candidates = set(self.forwarded)
        for fn in self.active_streams:
            try:
                candidates.update(fn())
            except Exception:  # noqa: BLE001 - an app's listing must not stop the relay
                log.exception("relay: active streams of %s failed", getattr(fn, "__name__", fn))
        if not candidates:
            return []
        ordered = sorted(candidates)
        pipe = self.redis.pipeline(transaction=False)
        for stream in ordered:
            pipe.exists(seq_key(stream))
        missing = [stream for stream, present in zip(ordered, pipe.execute(), strict=True) if not present]
        restored = []
        if missing:
            self.wait_stored()  # what was forwarded is stored: the database's highest counts it
        for stream in missing:
            floor = max(highest_stored_seq(stream), self.forwarded.get(stream, (0, 0.0))[0])
            if floor == 0:
                continue  # nothing of it yet: its first event opens it (controlplane.live.services.publish)
            self.writer.open_stream(stream, floor)
            restored.append(stream)
            log.warning(
                "relay: %s had no counter (Redis came back without its data): numbering goes on after %d",
                stream,
                floor,
            )
        return restored

    def restarted_counter_floor(self, stream: str, events: list[dict]) -> int:
        """The highest seq already used for ``stream`` when some of ``events`` reuse stored numbers (Redis
        lost its counter); else the floor found before (0 when none): events at or below it are renumbered."""
        floor = renumber_floor(self.redis, stream)
        if clashing_events(stream, [e for e in events if e["seq"] > floor]):
            self.wait_stored()  # the highest stored seq must count every event already forwarded
            counter = int(self.redis.get(seq_key(stream)) or 0)
            floor = max(floor, highest_stored_seq(stream), counter)
        return floor

    def raise_store_failure(self) -> None:
        """Once the store thread has finished what it holds, raise its first failure (if any): the entries
        it did not acknowledge are read again by the next step."""
        if self.store_failure is None:
            return
        self.wait_stored()
        failure, self.store_failure = self.store_failure, None
        self.reread_pending = True
        raise failure

    def step(self) -> int:
        """One round: discover streams, re-deliver our own pending entries when needed, read new ones."""
        self.raise_store_failure()
        self.discover()
        if not self.known:
            time.sleep(self.block_ms / 1000)
            return 0
        if time.monotonic() - self.last_claim > CLAIM_IDLE_MS / 1000:
            self.last_claim = time.monotonic()
            for key in self.known:
                claimed = self.redis.xautoclaim(
                    key, GROUP, self.consumer, min_idle_time=CLAIM_IDLE_MS, count=self.batch
                )
                if claimed and claimed[1]:
                    self.reread_pending = True
        handled = 0
        if self.reread_pending:
            # what the store thread holds is pending too: once it is stored, what is pending is ours to redo
            self.wait_stored()
            pending = self.redis.xreadgroup(
                GROUP, self.consumer, {k: "0" for k in self.known}, count=self.count
            )
            handled = self.handle(pending)
            self.reread_pending = handled > 0  # read again (after these are stored) until none is left
        self.linger_s = min(self.linger_max_s, self.round_frames / FRAME_BUDGET_PER_S)
        self.round_frames = 0
        wait = self.last_read + self.linger_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self.last_read = time.monotonic()
        fresh = self.redis.xreadgroup(
            GROUP, self.consumer, {k: ">" for k in self.known}, count=self.count, block=self.block_ms
        )
        most = max((len(entries) for _, entries in fresh or []), default=0)
        if most >= self.count:
            self.count = min(self.count * 2, self.max_batch)
            self.last_read = 0.0  # behind: the next read does not wait
        elif most < self.count // 4:
            self.count = max(self.count // 2, self.batch)
        return handled + self.handle(fresh)

    def run_periodic(self) -> None:
        for entry in self.periodic:
            interval, fn, last = entry
            if time.monotonic() - last >= interval:
                entry[2] = time.monotonic()
                close_old_connections()
                t0 = time.monotonic()
                try:
                    fn()
                except Exception:  # noqa: BLE001 - housekeeping must not stop the relay
                    log.exception("relay: periodic %s failed", getattr(fn, "__name__", fn))
                took = time.monotonic() - t0
                if took > 0.05:
                    log.info("relay: periodic %s took %.0f ms", getattr(fn, "__name__", fn), took * 1000)

    def run_forever(self) -> None:
        log.info("relay %s reading %s", self.consumer, settings.REDIS_URL.split("@")[-1])
        backoff = 0.5
        try:
            while not self.stop.is_set():
                try:
                    self.step()
                    self.send_high_water_marks()
                    self.restore_counters()
                    self.run_periodic()
                    backoff = 0.5
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    log.warning("relay: Redis unavailable (%s); retrying in %.1fs", exc, backoff)
                    self.known.clear()
                    self.reread_pending = True
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 10)
                except redis.ResponseError as exc:
                    if "NOGROUP" not in str(exc):
                        raise
                    # Redis came back empty between two reads without the relay seeing the connection drop
                    # (a failover, or this process paused across the restart): its streams and groups are
                    # gone; find them again as after a reconnect, and read on
                    log.warning("relay: %s; Redis lost its streams, discovering them again", exc)
                    self.known.clear()
                    self.reread_pending = True
                except (OperationalError, InterfaceError) as exc:
                    # the database restarts: what was read stays unacknowledged in Redis and is read again
                    log.warning("relay: database unavailable (%s); retrying in %.1fs", exc, backoff)
                    self.reread_pending = True
                    close_old_connections()
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 10)
        finally:
            self.close()
