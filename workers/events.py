"""Live events: one JSON object per event, kept in a Redis stream per object (``job/42``, ``search/7``).

Pure Python (redis-py only): training ranks, Celery tasks and the Channels relay all use this module,
and none of them needs Django to do so.

Event format (``shared/DESIGN.md``)::

    {"stream": "job/42", "seq": 118, "time": "2026-11-29T12:00:00.123Z",
     "kind": "train|telemetry|energy|risk|event|progress", "step": 118, "values": {...}}

``seq`` is assigned atomically by Redis (a Lua script increments a per-stream counter and appends the
entry in one step), so it increases by one per event even with several producers, and a client that
reconnects with the last ``seq`` it saw can be sent exactly what it missed.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

KINDS = frozenset({"train", "telemetry", "energy", "risk", "event", "progress"})
STREAM_NAME = re.compile(r"^(job|search)/[0-9]+$")
# Redis keys: the entries live in a stream, the last seq in a counter beside it.
KEY_PREFIX = "cann:stream:"
SEQ_PREFIX = "cann:seq:"
# every stream that ever received an event; the relay discovers streams here
STREAMS_SET = "cann:streams"
# Streams are capped (approximate MAXLEN) so a long run cannot fill Redis; the relay persists every
# event to the database well before this many newer ones arrive.
MAX_LEN = 100_000

# KEYS[1] = counter, KEYS[2] = stream, KEYS[3] = set of streams;
# ARGV[1] = event JSON without seq (ends with "}"), ARGV[2] = maxlen
_APPEND_LUA = """
local seq = redis.call('INCR', KEYS[1])
local body = string.sub(ARGV[1], 1, -2) .. ',"seq":' .. seq .. '}'
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], seq .. '-1', 'event', body)
redis.call('SADD', KEYS[3], KEYS[2])
return seq
"""


class EventError(ValueError):
    """An event that does not follow the contract."""


def stream_key(stream: str) -> str:
    return KEY_PREFIX + stream


def seq_key(stream: str) -> str:
    return SEQ_PREFIX + stream


def validate_stream(stream: str) -> str:
    if not STREAM_NAME.match(stream):
        raise EventError(f"stream must look like 'job/<id>' or 'search/<id>', got {stream!r}")
    return stream


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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

    @staticmethod
    def _keys(stream: str) -> list[str]:
        return [seq_key(stream), stream_key(stream), STREAMS_SET]

    def publish(self, stream: str, kind: str, values: dict[str, Any], step: int | None = None) -> int:
        """Append one event; returns its ``seq``."""
        body = build_event(stream, kind, step, values)
        return int(self._append(keys=self._keys(stream), args=[body, MAX_LEN]))

    def publish_many(self, stream: str, events: list[tuple[str, int | None, dict[str, Any]]]) -> list[int]:
        """Append several ``(kind, step, values)`` events in one round trip; returns their seqs."""
        bodies = [build_event(stream, kind, step, values) for kind, step, values in events]
        pipe = self._redis.pipeline(transaction=False)
        for body in bodies:
            self._append(keys=self._keys(stream), args=[body, MAX_LEN], client=pipe)
        return [int(s) for s in pipe.execute()]


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
