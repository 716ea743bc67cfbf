"""Live events: one JSON object per event, kept in a Redis stream per object (``job/42``, ``search/7``).

Pure Python (redis-py only): training ranks, Celery tasks and the Channels relay all use this module,
and none of them needs Django to do so.

Event format (``shared/DESIGN.md``)::

    {"stream": "job/42", "seq": 118, "time": "2026-11-29T12:00:00.123Z",
     "kind": "train|telemetry|energy|risk|event|progress", "step": 118, "values": {...}}

``seq`` is assigned atomically by Redis (a Lua script increments a per-stream counter and appends the
entry in one step), so it increases by one per event even with several producers, and a client that
reconnects with the last ``seq`` it saw can be sent exactly what it missed.

A Redis that restarts without its data loses every counter. The control plane's producers append
*guarded* (``guarded=True``; a job's ranks when launched with :data:`GUARD_ENV` set): an append to a stream
whose counter is missing appends nothing and raises :class:`StreamNotReady`, and the producer keeps the event
and retries. The relay restores the counters of the streams it forwards and of the active jobs and
searches from the stored history and what it forwarded (:meth:`EventWriter.open_stream`), so numbering goes
on after the highest number any subscriber has seen: no number is used twice, none is skipped. An unguarded
producer (a standalone run, a script of the user's) starts again at 1 and reuses numbers the database
holds; the relay notices (a stored event with the same number but another time) and renumbers those
(:meth:`EventWriter.renumber`): each is appended again above every number already used and its old entry
removed, in one atomic step, so nothing is dropped and nothing is delivered twice.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

KINDS = frozenset({"train", "telemetry", "energy", "risk", "event", "progress"})
STREAM_NAME = re.compile(r"^(job|search)/[0-9]+$")
# Redis keys: the entries live in a stream, the last seq in a counter beside it.
KEY_PREFIX = "cann:stream:"
SEQ_PREFIX = "cann:seq:"
# every stream that ever received an event; the relay discovers streams here
STREAMS_SET = "cann:streams"
# an entry per stream added to STREAMS_SET: the relay's blocking read includes this stream, so a new stream's
# first events are read at once, not after the read it was blocked in ends (up to its block_ms: the tail of
# a new job's first second). Best effort: an ARGV, not a declared key, written with redis.pcall, so that a
# job's credential made before it existed still appends (EVALSHA refuses a declared key it may not touch).
STREAMS_NEW = "cann:streams:new"
# Streams are capped (approximate MAXLEN) so a long run cannot fill Redis; the relay persists every
# event to the database well before this many newer ones arrive.
MAX_LEN = 100_000

# KEYS[1] = counter, KEYS[2] = stream, KEYS[3] = set of streams, KEYS[4] = the event's publish token or "";
# ARGV[1] = event JSON without seq (ends with "}"), ARGV[2] = maxlen, ARGV[3] = token lifetime (s)
# A token already set means this event was appended before (a retry whose first reply was lost when Redis
# went down): its seq comes back and nothing is appended twice.
_APPEND_LUA = """
if KEYS[4] ~= '' then
  local done = redis.call('GET', KEYS[4])
  if done then return tonumber(done) end
end
if ARGV[4] == '1' and not redis.call('GET', KEYS[1]) then return -1 end
local seq = redis.call('INCR', KEYS[1])
local body = string.sub(ARGV[1], 1, -2) .. ',"seq":' .. seq .. '}'
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], seq .. '-1', 'event', body)
if redis.call('SADD', KEYS[3], KEYS[2]) == 1 then
  redis.pcall('XADD', ARGV[5], 'MAXLEN', '~', 1000, '*', 'stream', KEYS[2])
end
if KEYS[4] ~= '' then redis.call('SET', KEYS[4], seq, 'EX', ARGV[3]) end
return seq
"""
# ARGV[4] = "1": guarded (a missing counter: -1, nothing appended; GET, which a job's credential may run);
# ARGV[5] = the new-stream wake-ups (STREAMS_NEW)
GUARD_ENV = "CANN_TRAIN_EVENTS_GUARDED"
"""Set to 1 in the environment of a job's ranks launched by the control plane: their appends are guarded."""

# KEYS[1] = counter, KEYS[2] = stream, KEYS[3] = set of streams; ARGV[1] = floor, ARGV[2] = the new-stream
# wake-ups. The counter is raised to the floor (never lowered); returns the counter as it is now.
_OPEN_LUA = """
local floor = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
if current < floor then redis.call('SET', KEYS[1], floor) current = floor end
if redis.call('SADD', KEYS[3], KEYS[2]) == 1 then
  redis.pcall('XADD', ARGV[2], 'MAXLEN', '~', 1000, '*', 'stream', KEYS[2])
end
return current
"""
TOKEN_PREFIX = "cann:published:"
TOKEN_TTL_S = 3600  # a retry comes within seconds to minutes (a Redis restart); an hour is plenty


# KEYS[1] = counter, KEYS[2] = stream, KEYS[3] = renumber-floor hash;
# ARGV[1] = floor, ARGV[2] = group, ARGV[3] = maxlen, ARGV[4..] = pairs (old entry id, event JSON without seq)
# Every event the stream holds with seq <= floor belongs to the restarted counter: it moves above the floor.
_RENUMBER_LUA = """
local floor = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < floor then redis.call('SET', KEYS[1], floor) end
local known = tonumber(redis.call('HGET', KEYS[3], KEYS[2]) or '0')
if known < floor then redis.call('HSET', KEYS[3], KEYS[2], floor) end
local seqs = {}
for i = 4, #ARGV, 2 do
  local old_id, body = ARGV[i], ARGV[i + 1]
  local seq = redis.call('INCR', KEYS[1])
  local event = string.sub(body, 1, -2) .. ',"seq":' .. seq .. '}'
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], seq .. '-1', 'event', event)
  redis.call('XACK', KEYS[2], ARGV[2], old_id)
  redis.call('XDEL', KEYS[2], old_id)
  table.insert(seqs, seq)
end
return seqs
"""
# per stream: events with seq at or below this number were numbered by a restarted counter
RENUMBER_FLOORS = "cann:renumber-floors"


class EventError(ValueError):
    """An event that does not follow the contract."""


class StreamNotReady(RuntimeError):
    """A guarded append found the stream's counter missing (Redis came back without its data, or the stream
    was never opened): nothing was appended; keep the event and retry once the relay has restored it."""


def stream_key(stream: str) -> str:
    return KEY_PREFIX + stream


def seq_key(stream: str) -> str:
    return SEQ_PREFIX + stream


def validate_stream(stream: str) -> str:
    if not STREAM_NAME.match(stream):
        raise EventError(f"stream must look like 'job/<id>' or 'search/<id>', got {stream!r}")
    return stream


def now_iso() -> str:
    return unix_iso(time.time())


def unix_iso(t: float) -> str:
    """A ``time.time()`` as an event's ``time`` (what :func:`now_iso` gives at that moment)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """An event's ``time`` (``2026-11-29T12:00:00.123Z``) as an aware datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def build_event(stream: str, kind: str, step: int | None, values: dict[str, Any]) -> str:
    """The event as JSON, without ``seq`` (Redis assigns it)."""
    validate_stream(stream)
    if kind not in KINDS:
        raise EventError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    if not isinstance(values, dict):
        raise EventError("values must be a JSON object")
    return json.dumps(
        {"stream": stream, "time": now_iso(), "kind": kind, "step": step, "values": values},
        separators=(",", ":"),
        allow_nan=False,
    )


class EventWriter:
    """Appends events to Redis streams. Works with a plain or pipelined redis-py client."""

    def __init__(self, redis_client):
        self._redis = redis_client
        self._append = redis_client.register_script(_APPEND_LUA)
        self._renumber = redis_client.register_script(_RENUMBER_LUA)
        self._open = redis_client.register_script(_OPEN_LUA)

    @staticmethod
    def _keys(stream: str, token: str | None = None) -> list[str]:
        return [seq_key(stream), stream_key(stream), STREAMS_SET, TOKEN_PREFIX + token if token else ""]

    def publish(
        self,
        stream: str,
        kind: str,
        values: dict[str, Any],
        step: int | None = None,
        token: str | None = None,
        guarded: bool = False,
    ) -> int:
        """Append one event; returns its ``seq``. ``token`` (unique per event, the same on a retry) makes
        the append idempotent: a retry of an event Redis already holds returns its seq, appending nothing.
        ``guarded``: :class:`StreamNotReady` (nothing appended) when the stream's counter is missing."""
        body = build_event(stream, kind, step, values)
        seq = int(
            self._append(
                keys=self._keys(stream, token),
                args=[body, MAX_LEN, TOKEN_TTL_S, "1" if guarded else "0", STREAMS_NEW],
            )
        )
        if seq < 0:
            raise StreamNotReady(f"{stream}: its counter is missing (Redis lost its data?); not appended")
        return seq

    def publish_many(
        self,
        stream: str,
        events: list[tuple[str, int | None, dict[str, Any]] | tuple[str, int | None, dict, str]],
        *,
        guarded: bool = False,
    ) -> list[int]:
        """Append several ``(kind, step, values)`` or ``(kind, step, values, token)`` events in one round trip
        (not a transaction: a connection lost midway may leave some appended); returns their seqs. Retrying
        a batch with the same tokens appends only the events Redis does not hold yet. ``guarded``:
        :class:`StreamNotReady` when the counter was missing for any of them (retry the batch, with its
        tokens: those appended are not appended again)."""
        pipe = self._redis.pipeline(transaction=False)
        for kind, step, values, *token in events:
            body = build_event(stream, kind, step, values)
            keys = self._keys(stream, token[0] if token else None)
            self._append(
                keys=keys,
                args=[body, MAX_LEN, TOKEN_TTL_S, "1" if guarded else "0", STREAMS_NEW],
                client=pipe,
            )
        seqs = [int(s) for s in pipe.execute()]
        if any(s < 0 for s in seqs):
            raise StreamNotReady(
                f"{stream}: its counter is missing (Redis lost its data?); {sum(s < 0 for s in seqs)} of "
                f"{len(seqs)} event(s) not appended"
            )
        return seqs

    def open_stream(self, stream: str, floor: int) -> int:
        """Give ``stream`` a counter of at least ``floor`` (the highest seq already used: the next event gets
        ``floor + 1``), and list it among the streams; guarded appends may then go ahead. Returns the counter."""
        return int(
            self._open(
                keys=[seq_key(stream), stream_key(stream), STREAMS_SET], args=[int(floor), STREAMS_NEW]
            )
        )

    def renumber(self, stream: str, entries: list[tuple[str, dict]], floor: int, *, group: str) -> list[int]:
        """Move ``entries`` (``(entry id, event)`` pairs read by consumer group ``group``) above ``floor``, the
        highest seq already used for ``stream``: each gets a new seq, its old entry is acknowledged and
        deleted, atomically. Returns the new seqs, in order."""
        args: list = [int(floor), group, MAX_LEN]
        for entry_id, event in entries:
            body = {k: v for k, v in event.items() if k != "seq"}
            args += [entry_id, json.dumps(body, separators=(",", ":"), allow_nan=False)]
        seqs = self._renumber(keys=[seq_key(stream), stream_key(stream), RENUMBER_FLOORS], args=args)
        return [int(s) for s in seqs]


def renumber_floor(redis_client, stream: str) -> int:
    """Events of ``stream`` numbered at or below this were numbered by a restarted counter (0: none)."""
    return int(redis_client.hget(RENUMBER_FLOORS, stream) or 0)


def parse_entries(entries) -> list[dict]:
    """Events from the ``[(id, {field: value})]`` that XRANGE / XREAD return (bytes or str fields)."""
    return [
        json.loads(fields[b"event"] if b"event" in fields else fields["event"]) for _id, fields in entries
    ]


def since_range(last_seq: int) -> str:
    """The exclusive XRANGE start that selects events with ``seq > last_seq`` (entry id = ``<seq>-1``)."""
    return f"({int(last_seq)}-1"


def read_since(redis_client, stream: str, last_seq: int = 0, count: int | None = None) -> list[dict]:
    """Events of ``stream`` with ``seq > last_seq``, oldest first."""
    key = stream_key(validate_stream(stream))
    return parse_entries(redis_client.xrange(key, min=since_range(last_seq), max="+", count=count))


def stream_of_key(key: bytes | str) -> str:
    key = key.decode() if isinstance(key, bytes) else key
    return key[len(KEY_PREFIX) :]
