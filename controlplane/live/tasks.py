"""The dashboard's live probe: a task that publishes on a live stream from inside a worker."""

from __future__ import annotations

import socket

from celery import shared_task

from controlplane.live.services import publish


@shared_task
def probe(stream: str, message: str = "live probe", count: int = 1) -> int:
    """Publish ``count`` ``event``s on a live stream from inside a worker; returns the last seq.

    The dashboard's "Send live probe" button uses it to show the whole path working: API → Celery
    worker → Redis stream → relay → Channels group → websocket → page.
    """
    seq = 0
    for i in range(count):
        values = {"message": message, "source": "celery", "worker": socket.gethostname(), "n": i + 1}
        seq = publish(stream, "event", values)
    return seq
