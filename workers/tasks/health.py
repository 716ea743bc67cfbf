"""Tiny tasks that prove the worker path works end to end."""

from __future__ import annotations

import socket

from celery import shared_task


@shared_task(name="workers.tasks.health.ping")
def ping() -> dict:
    """Answered by any worker on the ``default`` queue; used by ``/healthz``."""
    return {"pong": True, "worker": socket.gethostname()}


@shared_task(name="workers.tasks.health.probe")
def probe(stream: str, message: str = "live probe") -> int:
    """Publish one ``event`` on a live stream from inside a worker; returns its seq.

    The dashboard's "Send live probe" button uses it to show the whole path working: API → Celery
    worker → Redis stream → relay → Channels group → websocket → page.
    """
    from controlplane.live.services import publish

    return publish(stream, "event", {"message": message, "source": "celery", "worker": socket.gethostname()})
