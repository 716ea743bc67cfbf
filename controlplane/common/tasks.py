"""A tiny task that proves the worker path works end to end (a task published, taken and answered); probes
judge workers by their heartbeat instead (``controlplane.common.health``), and the live probe is the live
app's (:mod:`controlplane.live.tasks`)."""

from __future__ import annotations

import socket

from celery import shared_task

from controlplane.common.redis import redis_client

PING_KEY = "cann:ping:{nonce}"


@shared_task
def ping(nonce: str) -> str:
    """Answered by any worker on the ``default`` queue.

    The answer goes to a short-lived Redis key named after ``nonce`` rather than through Celery's
    result backend: the web process then never subscribes to result pub/sub, whose reconnect logic
    gives up for good ("the Celery application must be restarted") after one Redis outage.
    """
    worker = socket.gethostname()
    redis_client().set(PING_KEY.format(nonce=nonce), worker, ex=30)
    return worker
