"""The live websocket: authenticate, check the team owns the stream, join its group, forward events.

Protocol (JSON text frames)::

    client → {"action": "subscribe", "stream": "job/42", "last_seq": 17}    # last_seq optional, default 0
    client → {"action": "unsubscribe", "stream": "job/42"}
    server → {"type": "subscribed", "stream": "job/42", "last_seq": 23}     # after replaying 18..23
    server → {"stream": "job/42", "seq": 24, "time": ..., "kind": ..., "step": ..., "values": {...}}
    client → {"action": "subscribe", "stream": "job/42", "batch": true}     # events in batches instead:
    server → {"type": "events", "stream": "job/42", "events": [{"stream": "job/42", "seq": 24, ...}, ...]}
    server → {"type": "error", "stream": "job/42", "code": "not_found", "message": "..."}
    client → {"action": "watch", "feed": "jobs"}                             # a team feed (feeds.py)
    server → {"type": "watching", "feed": "jobs"}
    server → {"type": "notice", "feed": "jobs", "id": 42, "state": "running"}   # a job of your teams changed

Every stream is delivered in ``seq`` order without gaps or duplicates: on subscribe the consumer
replays what the client missed (from Redis, and from the database for events Redis no longer holds),
and a live event that arrives ahead of a gap triggers a backfill first. A Redis that comes back without
its data has lost the channel layer's groups too: every ``REJOIN_S`` the consumer joins its streams' groups
again; what the client missed meanwhile comes with the relay's next high-water mark of the stream.

A subscription with ``"batch": true`` gets the same events, in the same order, several to a frame: each
batch the relay read is one frame (encoded once by the relay, forwarded as it is), and a replay comes in
frames of up to ``MAX_FRAME_EVENTS``. At thousands of events a second that is what lets one server process
keep up with tens of sockets (``bench/live_fanout.py``); the browser's ``live.js`` asks for it.
"""

from __future__ import annotations

import asyncio
import json
import logging

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane.accounts.selectors import teams_of
from controlplane.live.feeds import FEEDS, feed_group
from controlplane.live.selectors import stored_events
from controlplane.live.streams import batch_frame, forwarded_key, group_name, user_may_read
from workers.events import STREAM_NAME, parse_entries, since_range, stream_key

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
MAX_SUBSCRIPTIONS = 50
MAX_SEQ = 2**63 - 1  # Redis stream ids are 64-bit
MAX_FRAME_EVENTS = 500  # events in one frame of a batched replay
REJOIN_S = 5.0  # how often a socket joins its groups again (a Redis that lost its data lost them too)


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # accept, then close with a code of our own, so a client can tell "sign in again" apart from
            # a network failure (a refused handshake only shows up as 1006)
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.last_sent: dict[str, int] = {}
        self.batched: set[str] = set()  # streams whose events go out several to a frame
        self.feed_groups: set[str] = set()
        self.redis = aioredis.Redis.from_url(
            settings.REDIS_URL,
            socket_connect_timeout=settings.REDIS_TIMEOUT_S,
            socket_timeout=settings.REDIS_TIMEOUT_S,
        )
        self.keeper = asyncio.create_task(self.keep_subscriptions())
        await self.accept()

    async def disconnect(self, code):
        if getattr(self, "keeper", None) is not None:
            self.keeper.cancel()
        for stream in list(getattr(self, "last_sent", {})):
            await self.channel_layer.group_discard(group_name(stream), self.channel_name)
        for group in list(getattr(self, "feed_groups", ())):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "redis", None) is not None:
            await self.redis.aclose()

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """A frame that is not JSON text gets an error message; the socket stays open."""
        if text_data is None:
            return await self.send_error(None, "bad_request", "Send JSON text frames, not binary ones.")
        try:
            content = await self.decode_json(text_data)
        except ValueError:
            return await self.send_error(None, "bad_request", "That frame is not JSON; send a JSON object.")
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            return await self.send_error(None, "bad_request", "Send a JSON object with an 'action'.")
        action, stream = content.get("action"), content.get("stream")
        if action in {"watch", "unwatch"}:
            return await self.watch(content.get("feed"), on=action == "watch")
        if action not in {"subscribe", "unsubscribe"}:
            return await self.send_error(
                stream, "bad_request", "action must be 'subscribe', 'unsubscribe', 'watch' or 'unwatch'."
            )
        if not isinstance(stream, str) or not STREAM_NAME.match(stream):
            return await self.send_error(
                stream, "bad_request", "stream must look like 'job/<id>' or 'search/<id>'."
            )
        if action == "unsubscribe":
            self.last_sent.pop(stream, None)
            self.batched.discard(stream)
            await self.channel_layer.group_discard(group_name(stream), self.channel_name)
            return await self.send_json({"type": "unsubscribed", "stream": stream})
        last_seq = content.get("last_seq", 0)
        if isinstance(last_seq, bool) or not isinstance(last_seq, int) or not 0 <= last_seq <= MAX_SEQ:
            return await self.send_error(
                stream,
                "bad_request",
                f"last_seq must be an integer from 0 to {MAX_SEQ} (a seq you received).",
            )
        batch = content.get("batch", False)
        if not isinstance(batch, bool):
            return await self.send_error(stream, "bad_request", "batch must be true or false.")
        await self.subscribe(stream, last_seq, batch=batch)

    async def subscribe(self, stream: str, last_seq: int, *, batch: bool = False):
        if stream not in self.last_sent and len(self.last_sent) >= MAX_SUBSCRIPTIONS:
            return await self.send_error(
                stream, "too_many", f"At most {MAX_SUBSCRIPTIONS} streams per connection."
            )
        if not await database_sync_to_async(user_may_read)(self.scope["user"], stream):
            # same answer for "does not exist" and "another team's": existence is not leaked
            return await self.send_error(
                stream, "not_found", f"No stream {stream} among your teams' jobs and searches."
            )
        await self.channel_layer.group_add(group_name(stream), self.channel_name)
        self.last_sent[stream] = last_seq
        if batch:
            self.batched.add(stream)
        else:
            self.batched.discard(stream)
        await self.send_missed(stream, upto=None)
        await self.send_json({"type": "subscribed", "stream": stream, "last_seq": self.last_sent[stream]})

    async def keep_subscriptions(self):
        """Every ``REJOIN_S``: join the subscribed streams' groups (and feeds) again -- a Redis that came back
        without its data has none. What the client missed meanwhile comes with the relay's next high-water
        mark of the stream (``live_hwm``: every second while the stream is active), from the database and
        what the relay forwarded since."""
        while True:
            await asyncio.sleep(REJOIN_S)
            try:
                for group in [*self.feed_groups, *(group_name(stream) for stream in self.last_sent)]:
                    await self.channel_layer.group_add(group, self.channel_name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: the next round tries again
                log.info("live socket: rejoin skipped (%s)", exc)

    async def watch(self, feed, *, on: bool):
        """Join (or leave) the feed groups of every team of the user."""
        if feed not in FEEDS:
            return await self.send_error(None, "bad_request", f"feed must be one of {sorted(FEEDS)}.")
        team_ids = await database_sync_to_async(_team_ids)(self.scope["user"])
        for team_id in team_ids:
            group = feed_group(feed, team_id)
            if on:
                await self.channel_layer.group_add(group, self.channel_name)
                self.feed_groups.add(group)
            else:
                await self.channel_layer.group_discard(group, self.channel_name)
                self.feed_groups.discard(group)
        await self.send_json({"type": "watching" if on else "unwatched", "feed": feed})

    async def feed_notice(self, message):
        """Group message of a team feed: ``{"type": "feed.notice", "feed": "jobs", "notice": {...}}``."""
        await self.send_json({**message["notice"], "type": "notice", "feed": message["feed"]})

    async def send_missed(self, stream: str, upto: int | None, forwarded: int = 0):
        """Send events after ``last_sent[stream]`` (up to and excluding ``upto``) from Redis, filling any
        older gap from the database. Nothing above what the relay has forwarded comes from Redis
        (``streams.FORWARDED_PREFIX``): the relay forwards those itself, and an event it never read may be
        lost with Redis and its number given to another. ``forwarded``: what the caller knows was forwarded
        (a batch or high-water mark the relay sent)."""
        after = self.last_sent[stream]
        forwarded = max(forwarded, int(await self.redis.get(forwarded_key(stream)) or 0))
        cap = forwarded if upto is None else min(upto - 1, forwarded)
        events = (
            parse_entries(await self.redis.xrange(stream_key(stream), min=since_range(after), max=f"{cap}-1"))
            if cap > after
            else []
        )
        first_in_redis = events[0]["seq"] if events else upto
        if first_in_redis is None or first_in_redis > after + 1:
            older = await database_sync_to_async(stored_events)(
                stream, after_seq=after, before_seq=first_in_redis
            )
            events = older + events
        await self.deliver(stream, events)

    async def deliver(self, stream: str, events: list[dict]):
        """Send the events (in ``seq`` order) that come after ``last_sent[stream]``: one frame each, or
        frames of up to ``MAX_FRAME_EVENTS`` for a batched subscription."""
        fresh, last = [], self.last_sent[stream]
        for event in events:
            if event["seq"] > last:
                fresh.append(event)
                last = event["seq"]
        if not fresh:
            return
        self.last_sent[stream] = last
        if stream not in self.batched:
            for event in fresh:
                await self.send_json(event)
            return
        for start in range(0, len(fresh), MAX_FRAME_EVENTS):
            chunk = fresh[start : start + MAX_FRAME_EVENTS]
            await self.send(text_data=batch_frame(stream, json.dumps(chunk, separators=(",", ":"))))

    async def live_events(self, message):
        """Group message from the relay: one batch of a stream (``streams.events_message``)."""
        stream = message["stream"]
        if stream not in self.last_sent or message["last_seq"] <= self.last_sent[stream]:
            return
        if (
            stream in self.batched
            and message["contiguous"]
            and message["first_seq"] == self.last_sent[stream] + 1
        ):
            # the common case: the next events, all of them: the relay's encoding goes out as it is
            self.last_sent[stream] = message["last_seq"]
            return await self.send(text_data=batch_frame(stream, message["encoded"]))
        run: list[dict] = []
        for event in json.loads(message["encoded"]):
            last = run[-1]["seq"] if run else self.last_sent[stream]
            if event["seq"] <= last:
                continue
            if event["seq"] > last + 1:  # a gap before it (the channel layer dropped a batch): fill it
                await self.deliver(stream, run)
                run = []
                await self.send_missed(stream, upto=event["seq"], forwarded=message["last_seq"])
            run.append(event)
        await self.deliver(stream, run)

    async def live_hwm(self, message):
        """The relay's periodic high-water mark of a recently active stream: when it is ahead of what this
        client got (the channel layer dropped the tail of a burst, and no later event came to show the
        gap), send what is missing from Redis / the database."""
        stream, seq = message["stream"], message["seq"]
        if stream in self.last_sent and seq > self.last_sent[stream]:
            await self.send_missed(stream, upto=seq + 1, forwarded=seq)

    async def send_error(self, stream, code: str, message: str):
        await self.send_json({"type": "error", "stream": stream, "code": code, "message": message})


def _team_ids(user) -> list[int]:
    return list(teams_of(user).values_list("pk", flat=True))
