"""The relay in this process against the real test Redis and test database: batches handed to its store
thread are acknowledged only once stored, a batch read again is stored once, a batch the database refuses
stays pending and is stored when read again, and events renumbered after Redis lost its counter are not
lost to a batch still waiting for the store."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from tests.conftest import own_redis_db

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def relay_redis():
    """A Redis database of these tests' own: no stack's relay reads it."""
    import redis

    url = own_redis_db(12)
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url, client
    client.flushdb()


@pytest.fixture
def make_relay(relay_redis):
    from controlplane.live.relay import Relay

    made = []

    def make(**kwargs):
        made.append(Relay(**{"redis_url": relay_redis[0], "block_ms": 50, "linger_ms": 0, **kwargs}))
        return made[-1]

    yield make
    for relay in made:
        relay.close()


def publish(url: str, stream: str, first: int, n: int) -> list[int]:
    import redis

    from workers.events import EventWriter

    writer = EventWriter(redis.Redis.from_url(url))
    return writer.publish_many(stream, [("train", step, {"n": step}) for step in range(first, first + n)])


class Subscriber:
    """A channel of the real channel layer in the stream's group: what the relay forwarded."""

    def __init__(self, relay, stream: str):
        from controlplane.live.streams import group_name

        self.relay, self.group = relay, group_name(stream)
        self.channel = relay.loop.run_until_complete(relay.layer.new_channel())
        relay.loop.run_until_complete(relay.layer.group_add(self.group, self.channel))

    def seqs(self) -> list[int]:
        """The seqs of every event forwarded since the last call, in the order they came."""
        import json

        async def drain():
            got = []
            with contextlib.suppress(TimeoutError):
                while True:
                    message = await asyncio.wait_for(self.relay.layer.receive(self.channel), 0.3)
                    if message["type"] == "live.events":
                        got += [e["seq"] for e in json.loads(message["encoded"])]
            return got

        return self.relay.loop.run_until_complete(drain())


def stored(stream: str) -> list[tuple[int, int]]:
    from controlplane.live.models import StreamEvent

    return list(StreamEvent.objects.filter(stream=stream).order_by("seq").values_list("seq", "step"))


def pending(client, stream: str) -> int:
    from controlplane.live.relay import GROUP
    from workers.events import stream_key

    return client.xpending(stream_key(stream), GROUP)["pending"]


@contextlib.contextmanager
def database_write_lock():
    """Another connection holds the database's write lock (readers go on): the relay's writes wait."""
    from django.db import connection

    settings = connection.settings_dict
    if settings["ENGINE"].endswith("sqlite3"):
        import sqlite3

        other = sqlite3.connect(settings["NAME"], isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
    else:
        import psycopg

        from controlplane.live.models import StreamEvent

        other = psycopg.connect(
            dbname=settings["NAME"],
            user=settings["USER"],
            password=settings["PASSWORD"],
            host=settings["HOST"],
            port=settings["PORT"] or None,
        )
        other.execute(f"LOCK TABLE {StreamEvent._meta.db_table} IN EXCLUSIVE MODE")
    released = threading.Event()

    def release():
        if not released.is_set():
            released.set()
            other.rollback()
            other.close()

    try:
        yield release
    finally:
        release()


def test_a_batch_read_again_is_forwarded_again_and_stored_once(make_relay, relay_redis):
    url, client = relay_redis
    stream = "job/91001"
    relay = make_relay()
    subscriber = Subscriber(relay, stream)
    publish(url, stream, 1, 30)
    relay.step()
    relay.wait_stored()
    first = stored(stream)
    assert first == [(seq, seq) for seq in range(1, 31)] and pending(client, stream) == 0
    # the group hands every entry out again, as a relay that stored a batch and died before acking it
    # would have it read again
    from controlplane.live.relay import GROUP
    from workers.events import stream_key

    client.xgroup_setid(stream_key(stream), GROUP, id="0")
    relay.step()
    relay.wait_stored()
    assert stored(stream) == first  # once each, nothing renumbered
    assert pending(client, stream) == 0
    assert int(client.get(f"cann:seq:{stream}")) == 30
    assert subscriber.seqs() == list(range(1, 31)) * 2  # subscribers drop the repeats (consumers.py)


def test_a_batch_the_database_refuses_stays_pending_and_is_stored_when_read_again(
    make_relay, relay_redis, monkeypatch
):
    from django.db import OperationalError, connection

    url, client = relay_redis
    stream = "job/91002"
    # the store thread's connection gives up on a lock after 0.3 s instead of 30
    if connection.vendor == "sqlite":
        monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.3)
    else:
        monkeypatch.setitem(connection.settings_dict["OPTIONS"], "options", "-c lock_timeout=300")
    relay = make_relay()
    subscriber = Subscriber(relay, stream)
    publish(url, stream, 1, 40)
    with database_write_lock():
        relay.step()  # forwarded, handed to the store thread, which cannot write
        relay.wait_stored()
        assert isinstance(relay.store_failure, OperationalError), relay.store_failure
        assert subscriber.seqs() == list(range(1, 41))  # subscribers did not wait for the database
        assert stored(stream) == [] and pending(client, stream) == 40  # nothing acknowledged
    with pytest.raises(OperationalError):
        relay.step()  # raised in the relay's loop, which backs off (run_forever)
    relay.step()  # reads its pending entries again
    relay.wait_stored()
    assert stored(stream) == [(seq, seq) for seq in range(1, 41)]
    assert pending(client, stream) == 0
    assert subscriber.seqs() == list(range(1, 41))


def test_events_of_a_restarted_counter_are_renumbered_past_a_batch_still_waiting_for_the_store(
    make_relay, relay_redis
):
    """Redis loses its data while the store thread still holds a batch: the new events reuse its numbers.
    The relay waits for that batch to be stored before checking for clashes, so the new events move above
    it instead of being dropped as re-deliveries of it."""
    url, client = relay_redis
    stream = "job/91003"
    relay = make_relay()
    publish(url, stream, 1, 50)
    with database_write_lock() as release:
        relay.step()  # seqs 1..50 forwarded; their write waits for the lock
        client.flushdb()  # Redis restarts empty: counter, stream and consumer group gone
        relay.known.clear()
        assert publish(url, stream, 101, 30) == list(range(1, 31))
        threading.Timer(0.5, release).start()
        relay.step()
    for _ in range(5):  # the renumbered entries are read in the following rounds
        relay.step()
    relay.wait_stored()
    rows = stored(stream)
    assert [seq for seq, _ in rows] == list(range(1, 81)), rows
    assert [step for _, step in rows] == list(range(1, 51)) + list(range(101, 131))
    assert pending(client, stream) == 0


def test_a_backlog_is_read_in_growing_batches(make_relay, relay_redis):
    url, client = relay_redis
    stream = "job/91004"
    relay = make_relay()
    subscriber = Subscriber(relay, stream)
    for first in range(1, 3001, 500):
        publish(url, stream, first, 500)
    rounds = 0
    started = time.monotonic()
    while len(stored(stream)) < 3000 and time.monotonic() - started < 30:
        relay.step()
        relay.wait_stored()
        rounds += 1
    assert len(stored(stream)) == 3000 and pending(client, stream) == 0
    assert subscriber.seqs() == list(range(1, 3001))
    assert rounds <= 4, rounds  # 500, 1000, then the remaining 1,500 (a fixed 500 takes 6)


def test_a_new_stream_ends_the_read_the_relay_is_blocked_in(make_relay, relay_redis):
    """A job's first events are read at once, not after the blocking read on the known streams times out
    (``workers.events.STREAMS_NEW``: its first append wakes the relay)."""
    url, _client = relay_redis
    known, new = "job/91010", "job/91011"
    relay = make_relay(block_ms=5000)
    publish(url, known, 1, 1)
    relay.step()  # discovers and reads the known stream
    relay.step()  # the wake-up of its first append
    subscriber = Subscriber(relay, new)
    timer = threading.Timer(0.3, publish, args=(url, new, 1, 3))
    timer.start()
    started = time.monotonic()
    relay.step()  # blocked reading the known stream (5 s) until the new one's first append
    woken = time.monotonic() - started
    timer.join()
    relay.step()
    relay.wait_stored()
    assert woken < 2.5, f"the read waited {woken:.1f} s for its block to end"
    assert subscriber.seqs() == [1, 2, 3]
    assert [seq for seq, _ in stored(new)] == [1, 2, 3]


def test_the_linger_follows_the_frames_a_round_sent(make_relay, relay_redis):
    """One subscriber: a batch goes out within a couple of milliseconds of the read before; many: the relay
    lingers up to its bound, one frame per subscriber per linger (``FRAME_BUDGET_PER_S``)."""
    from controlplane.live.relay import FRAME_BUDGET_PER_S
    from controlplane.live.streams import group_name

    url, _client = relay_redis
    stream = "job/91012"
    relay = make_relay(linger_ms=20)
    subscriber = Subscriber(relay, stream)
    publish(url, stream, 1, 2)
    relay.step()  # one batch, one subscriber: one frame
    publish(url, stream, 3, 2)
    relay.step()
    assert relay.linger_s == pytest.approx(1 / FRAME_BUDGET_PER_S)
    for _ in range(29):  # 30 subscribers: 30 frames a batch, more than the bound allows
        channel = relay.loop.run_until_complete(relay.layer.new_channel())
        relay.loop.run_until_complete(relay.layer.group_add(group_name(stream), channel))
    publish(url, stream, 5, 2)
    relay.step()
    publish(url, stream, 7, 2)
    relay.step()
    assert relay.linger_s == pytest.approx(0.020)
    relay.wait_stored()
    assert subscriber.seqs() == list(range(1, 9))


def test_a_jobs_own_credential_wakes_the_relay_and_one_made_before_the_wake_ups_still_appends(relay_redis):
    from urllib.parse import urlsplit, urlunsplit

    import redis

    from controlplane.live import credentials
    from workers.events import STREAMS_NEW, EventWriter

    url, client = relay_redis
    new_url, why = credentials.publisher_url("job/91013", url)
    assert why is None
    EventWriter(redis.Redis.from_url(new_url)).publish("job/91013", "train", {"n": 1}, step=1, token="t91013")
    assert [fields[b"stream"] for _, fields in client.xrange(STREAMS_NEW)] == [b"cann:stream:job/91013"]
    # a credential as publisher_url made them before STREAMS_NEW: its appends go on, without the wake-up
    user, password = "cann-test-old-credential", "an-old-credential"
    old_keys = ["~cann:stream:job/91014", "~cann:seq:job/91014", "~cann:streams", "~cann:published:*"]
    acl = ["reset", "on", f">{password}", *old_keys, "-@all", *credentials.PUBLISH_COMMANDS]
    client.execute_command("ACL", "SETUSER", user, *acl)
    parts = urlsplit(url)
    old_url = urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))
    old = EventWriter(redis.Redis.from_url(old_url))
    try:
        assert old.publish("job/91014", "train", {"n": 1}, step=1, token="t91014") == 1
        assert client.xlen(STREAMS_NEW) == 1
    finally:
        client.execute_command("ACL", "DELUSER", user, credentials.username("job/91013"))
