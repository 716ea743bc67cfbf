"""Which object a live stream belongs to, and who may read it."""

from __future__ import annotations

import json

from django.apps import apps

from workers.events import STREAM_NAME

# stream kind -> "app_label.Model" of the LongRunningJob it reports on
STREAM_OWNERS = {"job": "jobs.TrainingJob", "search": "planning.StrategySearch"}


FORWARDED_PREFIX = "cann:forwarded:"
"""``cann:forwarded:<stream>``: the highest seq the relay has forwarded to subscribers. A socket serves from
Redis nothing above it (the relay forwards the rest in a moment): an event a Redis that died held but the
relay never read is then seen by no one, and the relay, which restores a lost counter from what it
forwarded (``Relay.restore_counters``), never gives its number to another event a subscriber saw."""

# KEYS[1] = the forwarded key; ARGV[1] = seq: raised, never lowered (two relays may share a stream)
FORWARDED_LUA = """
local seq = tonumber(ARGV[1])
if tonumber(redis.call('GET', KEYS[1]) or '0') < seq then redis.call('SET', KEYS[1], seq) end
return 1
"""


def forwarded_key(stream: str) -> str:
    return FORWARDED_PREFIX + stream


def group_name(stream: str) -> str:
    """Channels group of a stream (group names allow only [a-zA-Z0-9-_.])."""
    return "stream." + stream.replace("/", ".")


def events_message(stream: str, events: list[dict], *, encoded: str | None = None) -> dict:
    """The relay's group message for one batch of a stream's events, in ``seq`` order. The batch is
    encoded to JSON once, here, and not by each subscriber: a consumer whose client takes batches and
    has every event before ``first_seq`` forwards ``encoded`` as it is (``batch_frame``); it decodes it
    only to skip events or fill a gap (``contiguous`` false: the batch itself has holes). ``encoded``:
    the events' JSON array when the caller holds it already (the relay joins the entries it read)."""
    first, last = events[0]["seq"], events[-1]["seq"]
    return {
        "type": "live.events",
        "stream": stream,
        "first_seq": first,
        "last_seq": last,
        "contiguous": last - first + 1 == len(events),
        "encoded": encoded
        if encoded is not None
        else json.dumps(events, separators=(",", ":"), allow_nan=False),
    }


def batch_frame(stream: str, encoded_events: str) -> str:
    """The websocket frame of several events of one stream, from their JSON array:
    ``{"type": "events", "stream": "job/42", "events": [...]}``."""
    return f'{{"type":"events","stream":{json.dumps(stream)},"events":{encoded_events}}}'


def owner_object(stream: str):
    """The job/search row of a stream, or None when the stream name or the object does not exist."""
    if not isinstance(stream, str) or not STREAM_NAME.match(stream):
        return None
    kind, pk = stream.split("/")
    model = apps.get_model(STREAM_OWNERS[kind])
    return model.objects.filter(pk=int(pk)).first()


def user_may_read(user, stream: str) -> bool:
    """True when the stream's object belongs to one of the user's teams."""
    if not user or not user.is_authenticated:
        return False
    obj = owner_object(stream)
    return obj is not None and obj.team.memberships.filter(user=user).exists()
