"""A batch of events retried after Redis went down mid-reply (the appends done, the answer lost) is stored
once: each event's publish token makes its append idempotent (workers/events.py). The chaos test's
persistent Redis restart stored a train step twice before."""

from __future__ import annotations

import os
import random

import redis

from workers.events import EventWriter, read_since


def test_a_retried_batch_appends_each_event_once_and_answers_the_same_seqs():
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    writer = EventWriter(client)
    stream = f"job/{random.randrange(10**8, 10**9)}"
    first = [("train", 1, {"loss": 2.0}, "tok-a"), ("train", 2, {"loss": 1.9}, "tok-b")]
    seqs = writer.publish_many(stream, first)
    # the retry: the same events (same tokens) and one that arrived meanwhile
    again = writer.publish_many(stream, [*first, ("train", 3, {"loss": 1.8}, "tok-c")])
    assert again[:2] == seqs and again[2] == seqs[1] + 1
    events = read_since(client, stream)
    assert [(e["step"], e["seq"]) for e in events] == [(1, seqs[0]), (2, seqs[1]), (3, again[2])]
    # events without a token keep appending as before (the control plane's own publishes)
    assert writer.publish(stream, "event", {"state": "running"}) == again[2] + 1
    assert writer.publish(stream, "event", {"state": "running"}, token="tok-d") == again[2] + 2
    assert writer.publish(stream, "event", {"state": "running"}, token="tok-d") == again[2] + 2
    assert len(read_since(client, stream)) == 5
