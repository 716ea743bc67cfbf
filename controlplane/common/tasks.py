"""Tiny tasks that prove the worker path works end to end (``/healthz``, the dashboard's live probe)."""

from __future__ import annotations

import socket

from celery import shared_task

PING_KEY = "cann:ping:{nonce}"


@shared_task
def ping(nonce: str) -> str:
    """Answered by any worker on the ``default`` queue; used by ``/healthz``.

    The answer goes to a short-lived Redis key named after ``nonce`` rather than through Celery's
    result backend: the web process then never subscribes to result pub/sub, whose reconnect logic
    gives up for good ("the Celery application must be restarted") after one Redis outage.
    """
    from controlplane.common.redis import redis_client

    worker = socket.gethostname()
    redis_client().set(PING_KEY.format(nonce=nonce), worker, ex=30)
    return worker


@shared_task
def probe(stream: str, message: str = "live probe", count: int = 1) -> int:
    """Publish ``count`` ``event``s on a live stream from inside a worker; returns the last seq.

    The dashboard's "Send live probe" button uses it to show the whole path working: API → Celery
    worker → Redis stream → relay → Channels group → websocket → page.
    """
    from controlplane.live.services import publish

    seq = 0
    for i in range(count):
        values = {"message": message, "source": "celery", "worker": socket.gethostname(), "n": i + 1}
        seq = publish(stream, "event", values)
    return seq
