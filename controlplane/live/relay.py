"""The metric relay: reads every live stream from Redis, persists events in batches, forwards them to
the Channels group of the stream.

It reads through a Redis consumer group, so an event is acknowledged only after it is stored and sent:
a relay that dies mid-batch re-reads its pending events when it comes back (persisting is idempotent on
``(stream, seq)``), and several relays can share the work. Producers (training ranks, Celery tasks) know
nothing about Channels or the database: they only append to Redis (``workers.events``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections

from controlplane.live.services import persist_events
from controlplane.live.streams import group_name
from workers.events import STREAMS_SET, parse_entries, stream_of_key

log = logging.getLogger(__name__)

GROUP = "relay"
# entries another relay read but never acknowledged (it died) are taken over after this long
CLAIM_IDLE_MS = 30_000


class Relay:
    def __init__(self, *, redis_url: str | None = None, batch: int = 500, block_ms: int = 500, periodic=()):
        self.redis = redis.Redis.from_url(
            redis_url or settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5
        )
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self.batch = batch
        self.block_ms = block_ms
        self.known: set[bytes] = set()
        self.layer = get_channel_layer()
        self.stop = threading.Event()
        self.last_claim = 0.0
        # (interval_s, callable) run between reads: housekeeping that must happen even when no event flows
        self.periodic = [[interval, fn, 0.0] for interval, fn in periodic]

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
            events = parse_entries(entries)
            close_old_connections()
            persist_events(events)
            async_to_sync(self.layer.group_send)(
                group_name(stream_of_key(key)), {"type": "live.events", "events": events}
            )
            self.redis.xack(key, GROUP, *[entry_id for entry_id, _ in entries])
            handled += len(entries)
        return handled

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
                self.run_periodic()
                backoff = 0.5
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("relay: Redis unavailable (%s); retrying in %.1fs", exc, backoff)
                self.known.clear()
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10)
