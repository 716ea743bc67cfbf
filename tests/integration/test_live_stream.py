"""A real Celery worker publishes; a real websocket client on a real daphne receives, in order, and
resumes from the last seq it saw."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from asgiref.sync import sync_to_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


async def recv_json(ws, timeout=20.0):
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def recv_events(ws, n, timeout=20.0, frames=None):
    """The next ``n`` events, from single-event frames or batch frames (``"type": "events"``); ``frames``
    (a list) gets the number of events of each frame."""
    events = []
    while len(events) < n:
        m = await recv_json(ws, timeout)
        got = m["events"] if m.get("type") == "events" else [m] if "seq" in m and "type" not in m else []
        if got and frames is not None:
            frames.append(len(got))
        events += got
    return events


class _Writer:
    """What ``until_forwarded`` reads through: a Redis client at ``url``."""

    def __init__(self, url: str):
        import redis

        self._redis = redis.Redis.from_url(url)


async def until_forwarded(writer, stream: str, seq: int, timeout: float = 20.0) -> None:
    from controlplane.live.streams import forwarded_key

    for _ in range(int(timeout / 0.05)):
        if int(await sync_to_async(writer._redis.get)(forwarded_key(stream)) or 0) >= seq:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the relay did not forward {stream} up to {seq} within {timeout:.0f} s")


def connect(stack, token):
    return websockets.connect(stack.ws_url, additional_headers={"Authorization": f"Token {token}"})


@pytest.fixture
def job_of_alice(make_member, token_for):
    from controlplane.jobs.models import TrainingJob

    alice = make_member("alice", "Team A")
    job = TrainingJob.objects.create(team=alice.teams.first(), name="j", config={})
    return job, token_for(alice)


async def test_worker_event_reaches_websocket_in_order_and_resumes(live_stack, job_of_alice):
    from controlplane.live.tasks import probe

    job, token = job_of_alice
    async with connect(live_stack, token) as ws:
        await ws.send(json.dumps({"action": "subscribe", "stream": job.stream, "last_seq": 0}))
        assert (await recv_json(ws)) == {"type": "subscribed", "stream": job.stream, "last_seq": 0}
        await sync_to_async(probe.apply_async)((job.stream, "first", 5), queue="default", ignore_result=False)
        first = await recv_events(ws, 5)
    assert [e["seq"] for e in first] == [1, 2, 3, 4, 5]
    assert [e["values"]["n"] for e in first] == [1, 2, 3, 4, 5]
    assert all(
        e["stream"] == job.stream and e["kind"] == "event" and e["values"]["source"] == "celery"
        for e in first
    )

    # published while the client is away
    result = await sync_to_async(probe.apply_async)(
        (job.stream, "missed", 3), queue="default", ignore_result=False
    )
    assert await sync_to_async(result.get)(timeout=20) == 8
    # the replay on subscribe holds what the relay has forwarded (the rest it forwards itself, after it)
    await until_forwarded(_Writer(live_stack.redis_url), job.stream, 8)

    async with connect(live_stack, token) as ws:
        await ws.send(json.dumps({"action": "subscribe", "stream": job.stream, "last_seq": 5}))
        missed = await recv_events(ws, 3)
        assert (await recv_json(ws))["type"] == "subscribed"
        await sync_to_async(probe.apply_async)((job.stream, "after", 1), queue="default", ignore_result=False)
        live = await recv_events(ws, 1)
    assert [e["seq"] for e in missed] == [6, 7, 8]
    assert [e["values"]["message"] for e in missed] == ["missed"] * 3
    assert live[0]["seq"] == 9


async def test_history_survives_redis_losing_the_stream(live_stack, job_of_alice):
    """The relay persists every event; a client asking from seq 0 after Redis dropped the stream
    still gets everything, from the database."""
    import redis

    from controlplane.live.models import StreamEvent
    from controlplane.live.tasks import probe
    from workers.events import stream_key

    job, token = job_of_alice
    result = await sync_to_async(probe.apply_async)(
        (job.stream, "kept", 4), queue="default", ignore_result=False
    )
    assert await sync_to_async(result.get)(timeout=20) == 4
    for _ in range(100):
        if await sync_to_async(StreamEvent.objects.filter(stream=job.stream).count)() == 4:
            break
        await asyncio.sleep(0.1)
    redis.Redis.from_url(live_stack.redis_url).xtrim(stream_key(job.stream), maxlen=1)

    async with connect(live_stack, token) as ws:
        await ws.send(json.dumps({"action": "subscribe", "stream": job.stream, "last_seq": 0}))
        replay = await recv_events(ws, 4)
    assert [e["seq"] for e in replay] == [1, 2, 3, 4]
    assert [e["values"]["n"] for e in replay] == [1, 2, 3, 4]


async def test_other_teams_stream_is_refused(live_stack, job_of_alice, make_member, token_for):
    job, _ = job_of_alice
    bob = await sync_to_async(make_member)("bob", "Team B")
    bob_token = await sync_to_async(token_for)(bob)
    async with connect(live_stack, bob_token) as ws:
        await ws.send(json.dumps({"action": "subscribe", "stream": job.stream}))
        answer = await recv_json(ws)
        await ws.send(json.dumps({"action": "subscribe", "stream": "job/not-a-number"}))
        bad = await recv_json(ws)
    assert answer["type"] == "error" and answer["code"] == "not_found"
    assert bad["type"] == "error" and bad["code"] == "bad_request"


async def test_anonymous_and_revoked_sockets_are_closed(live_stack, job_of_alice):
    from controlplane.accounts.models import ApiToken
    from controlplane.accounts.services import token_revoke

    _, token = job_of_alice
    # no credential and no Origin: the handshake itself is refused
    with pytest.raises(websockets.exceptions.InvalidStatus):
        async with websockets.connect(live_stack.ws_url) as ws:
            await recv_json(ws, 5)
    # an allowed Origin but no session: accepted, then closed with 4401
    with _closes_4401():
        async with websockets.connect(live_stack.ws_url, origin="http://127.0.0.1") as ws:
            await recv_json(ws, 5)
    with _closes_4401():
        async with websockets.connect(
            live_stack.ws_url, additional_headers={"Authorization": "Token ct_x_y"}
        ) as ws:
            await recv_json(ws, 5)
    row = await sync_to_async(ApiToken.objects.get)(user__username="alice")
    await sync_to_async(token_revoke)(token=row)
    with _closes_4401():
        async with connect(live_stack, token) as ws:
            await recv_json(ws, 5)


class _closes_4401:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        assert exc_type is not None and issubclass(exc_type, websockets.exceptions.ConnectionClosed), exc
        assert exc.rcvd.code == 4401
        return True


@pytest.fixture
def small_capacity_stack(django_db_blocker):
    """A stack whose channel layer holds 3 messages per websocket: any burst overflows it."""
    from tests.conftest import database_url_for_children, own_redis_db, start_stack, stop_stack

    with django_db_blocker.unblock():
        url = database_url_for_children()
    stack = start_stack(
        redis_url=own_redis_db(7),
        database_url=url,
        name="capacity",
        extra_env={"CHANNEL_CAPACITY": "3"},
    )
    try:
        stack.wait_healthy()
        yield stack
    finally:
        stop_stack(stack)


@pytest.mark.parametrize("batch", [False, True], ids=["per-event", "batch"])
async def test_the_tail_of_an_over_capacity_burst_reaches_every_subscriber(
    small_capacity_stack, job_of_alice, batch
):
    """A burst far beyond the channel layer's capacity per client, then silence: no later event will come
    to reveal a dropped tail, and still every client ends with every event, in order, once each (without
    the relay's high-water marks the clients wait forever for the dropped tail: checked)."""
    import redis

    from workers.events import EventWriter

    live_stack = small_capacity_stack
    job, token = job_of_alice
    burst, clients, chunk = 2000, 10, 2
    sockets = [await connect(live_stack, token).__aenter__() for _ in range(clients)]
    try:
        for ws in sockets:
            await ws.send(
                json.dumps({"action": "subscribe", "stream": job.stream, "last_seq": 0, "batch": batch})
            )
            assert (await recv_json(ws))["type"] == "subscribed"
        writer = EventWriter(redis.Redis.from_url(live_stack.redis_url))

        def publish_burst():  # many small appends: the relay forwards many small batches
            for start in range(0, burst, chunk):
                writer.publish_many(
                    job.stream, [("event", None, {"n": n}) for n in range(start, start + chunk)]
                )

        await sync_to_async(publish_burst)()
        received = await asyncio.gather(*(recv_events(ws, burst, timeout=30) for ws in sockets))
    finally:
        for ws in sockets:
            await ws.close()
    for events in received:
        assert [e["seq"] for e in events] == list(range(1, burst + 1))


async def test_nonsense_frames_get_an_error_and_keep_the_socket(live_stack, job_of_alice):
    job, token = job_of_alice
    async with connect(live_stack, token) as ws:
        for frame in ("not json", "[1, 2", b"\x00\x01binary"):
            await ws.send(frame)
            answer = await recv_json(ws)
            assert answer["type"] == "error" and answer["code"] == "bad_request", answer
        await ws.send(json.dumps({"action": "subscribe", "stream": job.stream, "last_seq": 10**30}))
        answer = await recv_json(ws)
        assert answer["type"] == "error" and "last_seq" in answer["message"]
        await ws.send(json.dumps({"action": "subscribe", "stream": job.stream, "last_seq": 0}))
        assert (await recv_json(ws))["type"] == "subscribed"  # still open, still serving


async def test_a_batched_subscription_gets_every_event_once_in_order_several_to_a_frame(
    live_stack, job_of_alice
):
    """``"batch": true``: the replay of what was missed and the live events come several to a frame
    (``{"type": "events", ...}``), in seq order without gaps or duplicates, and a client that resumes from
    the last seq of a batch gets exactly the rest."""
    import redis

    from workers.events import EventWriter

    job, token = job_of_alice
    writer = EventWriter(redis.Redis.from_url(live_stack.redis_url))
    writer.publish_many(job.stream, [("train", n, {"loss": 1.0 / n}) for n in range(1, 41)])
    # a socket replays from Redis only what the relay has forwarded (the rest it forwards itself)
    await until_forwarded(writer, job.stream, 40)
    frames: list[int] = []
    async with connect(live_stack, token) as ws:
        await ws.send(json.dumps({"action": "subscribe", "stream": job.stream, "batch": "yes"}))
        assert (await recv_json(ws))["code"] == "bad_request"
        await ws.send(json.dumps({"action": "subscribe", "stream": job.stream, "last_seq": 0, "batch": True}))
        replay = await recv_events(ws, 40, frames=frames)
        assert (await recv_json(ws)) == {"type": "subscribed", "stream": job.stream, "last_seq": 40}
        await sync_to_async(writer.publish_many)(
            job.stream, [("train", n, {"loss": 1.0 / n}) for n in range(41, 241)]
        )
        live = await recv_events(ws, 200, frames=frames)
    assert [e["seq"] for e in replay + live] == list(range(1, 241))
    assert [e["step"] for e in replay + live] == list(range(1, 241))
    assert frames[0] == 40 and len(frames) < 240, frames  # the replay is one frame; live ones batch too

    writer.publish_many(job.stream, [("train", n, {"loss": 0.0}) for n in range(241, 246)])
    async with connect(live_stack, token) as ws:
        await ws.send(
            json.dumps({"action": "subscribe", "stream": job.stream, "last_seq": 240, "batch": True})
        )
        rest = await recv_events(ws, 5)
    assert [e["seq"] for e in rest] == [241, 242, 243, 244, 245]
