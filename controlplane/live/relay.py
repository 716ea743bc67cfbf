"""The metric relay: reads every live stream from Redis, persists events in batches, forwards them to
the Channels group of the stream.

It reads through a Redis consumer group, so an event is acknowledged only after it is stored and sent:
a relay that dies mid-batch re-reads its pending events when it comes back (persisting is idempotent on
``(stream, seq)``), and several relays can share the work. Producers (training ranks, Celery tasks) know
nothing about Channels or the database: they only append to Redis (``workers.events``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time

import redis
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from controlplane.live.selectors import clashing_events, highest_stored_seq
from controlplane.live.services import persist_events
from controlplane.live.streams import events_message, group_name
from workers.events import STREAMS_SET, EventWriter, parse_entries, renumber_floor, seq_key, stream_of_key

log = logging.getLogger(__name__)

GROUP = "relay"
# entries another relay read but never acknowledged (it died) are taken over after this long
CLAIM_IDLE_MS = 30_000
# a stream that had events in the last HWM_ACTIVE_S seconds gets its high-water mark re-sent every
# HWM_EVERY_S: a subscriber whose tail was dropped by the channel layer (over capacity) backfills from it
HWM_EVERY_S = 1.0
HWM_ACTIVE_S = 15.0


class Relay:
    def __init__(
        self,
        *,
        redis_url: str | None = None,
        batch: int = 500,
        block_ms: int = 500,
        periodic=(),
        on_stored=(),
    ):
        self.redis = redis.Redis.from_url(
            redis_url or settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5
        )
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self.batch = batch
        self.block_ms = block_ms
        self.known: set[bytes] = set()
        self.layer = get_channel_layer()
        # one event loop for the relay's life: channels_redis keeps its connection pool per loop, and
        # async_to_sync would build a new loop (and new connections) for every batch
        self.loop = asyncio.new_event_loop()
        self.writer = EventWriter(self.redis)
        self.high_water: dict[str, tuple[int, float]] = {}  # stream -> (last seq forwarded, when)
        self.last_hwm = 0.0
        self.stop = threading.Event()
        self.last_claim = 0.0
        # (interval_s, callable) run between reads: housekeeping that must happen even when no event flows
        self.periodic = [[interval, fn, 0.0] for interval, fn in periodic]
        # callables (stream, events) told about every stored batch (the jobs app keeps a job's progress)
        self.on_stored = list(on_stored)

    def discover(self) -> None:
        for key in self.redis.smembers(STREAMS_SET) - self.known:
            try:
                self.redis.xgroup_create(key, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self.known.add(key)

    def handle(self, response) -> int:
        handled = 0
        for key, entries in response or []:
            if not entries:
                continue
            stream = stream_of_key(key)
            close_old_connections()
            pairs = list(zip((entry_id for entry_id, _ in entries), parse_entries(entries), strict=True))
            floor = self.restarted_counter_floor(stream, [event for _, event in pairs])
            moved = [(entry_id, event) for entry_id, event in pairs if event["seq"] <= floor]
            kept = [(entry_id, event) for entry_id, event in pairs if event["seq"] > floor]
            if kept:
                events = [event for _, event in kept]
                # forwarded first, then stored: subscribers do not wait for the database write (the
                # relay's biggest cost per event); one that resumes gets these from Redis, and a relay that
                # dies before storing them re-reads them unacknowledged (subscribers drop the repeats)
                self.send(group_name(stream), events_message(stream, events))
                self.high_water[stream] = (events[-1]["seq"], time.monotonic())
                persist_events(events)
                for fn in self.on_stored:
                    try:
                        fn(stream, events)
                    except Exception:  # noqa: BLE001 - a listener must not stop the relay
                        log.exception("relay: %s failed on %s", getattr(fn, "__name__", fn), stream)
                self.redis.xack(key, GROUP, *[entry_id for entry_id, _ in kept])
            if moved:
                seqs = self.writer.renumber(stream, moved, floor, group=GROUP)
                log.warning(
                    "relay: %s: %d event(s) numbered by a restarted Redis counter (seq %d..%d) renumbered "
                    "to %d..%d; nothing dropped",
                    stream,
                    len(moved),
                    moved[0][1]["seq"],
                    moved[-1][1]["seq"],
                    seqs[0],
                    seqs[-1],
                )
            handled += len(entries)
        return handled

    def send(self, group: str, message: dict) -> None:
        self.loop.run_until_complete(self.layer.group_send(group, message))

    def send_high_water_marks(self) -> None:
        """Tell the subscribers of recently active streams the last seq forwarded (``live.hwm``)."""
        now = time.monotonic()
        if now - self.last_hwm < HWM_EVERY_S:
            return
        self.last_hwm = now
        for stream, (seq, at) in list(self.high_water.items()):
            if now - at > HWM_ACTIVE_S:
                del self.high_water[stream]
                continue
            self.send(group_name(stream), {"type": "live.hwm", "stream": stream, "seq": seq})

    def restarted_counter_floor(self, stream: str, events: list[dict]) -> int:
        """The highest seq already used for ``stream`` when some of ``events`` reuse stored numbers (Redis
        lost its counter); else the floor found before (0 when none): events at or below it are renumbered."""
        floor = renumber_floor(self.redis, stream)
        if clashing_events(stream, [e for e in events if e["seq"] > floor]):
            counter = int(self.redis.get(seq_key(stream)) or 0)
            floor = max(floor, highest_stored_seq(stream), counter)
        return floor

    def step(self) -> int:
        """One round: discover streams, re-deliver our own pending entries, then read new ones."""
        self.discover()
        if not self.known:
            time.sleep(self.block_ms / 1000)
            return 0
        if time.monotonic() - self.last_claim > CLAIM_IDLE_MS / 1000:
            self.last_claim = time.monotonic()
            for key in self.known:
                self.redis.xautoclaim(
                    key, GROUP, self.consumer, min_idle_time=CLAIM_IDLE_MS, count=self.batch
                )
        pending = self.redis.xreadgroup(GROUP, self.consumer, {k: "0" for k in self.known}, count=self.batch)
        handled = self.handle(pending)
        fresh = self.redis.xreadgroup(
            GROUP, self.consumer, {k: ">" for k in self.known}, count=self.batch, block=self.block_ms
        )
        return handled + self.handle(fresh)

    def run_periodic(self) -> None:
        for entry in self.periodic:
            interval, fn, last = entry
            if time.monotonic() - last >= interval:
                entry[2] = time.monotonic()
                close_old_connections()
                try:
                    fn()
                except Exception:  # noqa: BLE001 - housekeeping must not stop the relay
                    log.exception("relay: periodic %s failed", getattr(fn, "__name__", fn))

    def run_forever(self) -> None:
        log.info("relay %s reading %s", self.consumer, settings.REDIS_URL.split("@")[-1])
        backoff = 0.5
        while not self.stop.is_set():
            try:
                self.step()
                self.send_high_water_marks()
                self.run_periodic()
                backoff = 0.5
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("relay: Redis unavailable (%s); retrying in %.1fs", exc, backoff)
                self.known.clear()
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10)
            except (OperationalError, InterfaceError) as exc:
                # the database restarts: what was read stays unacknowledged in Redis and is read again
                log.warning("relay: database unavailable (%s); retrying in %.1fs", exc, backoff)
                close_old_connections()
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10)
