"""Probes. ``/livez`` (liveness): this web process answers, nothing else asked, so a probe that restarts on
failure restarts only a web process that is really stuck. ``/readyz`` (readiness; ``/healthz`` is the same):
the database is reachable, Redis answers, and a Celery worker that takes ``default`` tasks beat within
``WORKER_BEAT_STALE_S``.

A worker is judged by its heartbeat (:func:`start_worker_beat`, a thread of the worker's main process), not
by whether it answers a ping task: with every slot training, a ping waits behind hours of work, and the probe
called a healthy deployment dead (503 after 3 s).
"""

from __future__ import annotations

import json
import os
import threading
import time

from django.db import connection
from django.http import JsonResponse

from controlplane.common.redis import redis_client

WORKER_BEAT_KEY = "cann:worker-beat:{name}"
WORKER_BEAT_S = 5.0
"""How often a worker writes its heartbeat."""
WORKER_BEAT_STALE_S = 20.0
"""A heartbeat older than this is a worker gone (four beats missed)."""
WORKER_BEAT_TTL_S = 60
"""The heartbeat key expires: a worker gone for a minute is not listed at all."""
READY_QUEUE = "default"


def start_worker_beat(name: str, queues: list[str]) -> threading.Thread:
    """The worker's heartbeat, from a daemon thread of its main process (prefork children and busy task
    threads do not hold it up). A Redis outage is retried at the next beat."""

    def beat() -> None:
        key = WORKER_BEAT_KEY.format(name=name)
        while True:
            try:
                doc = {"name": name, "queues": queues, "pid": os.getpid(), "at": time.time()}
                redis_client().set(key, json.dumps(doc), ex=WORKER_BEAT_TTL_S)
            except Exception:  # noqa: BLE001, S110 - Redis away: the next beat tries again
                pass
            time.sleep(WORKER_BEAT_S)

    thread = threading.Thread(target=beat, name="worker-beat", daemon=True)
    thread.start()
    return thread


def worker_beats() -> list[dict]:
    """Every worker heartbeat Redis holds (newest first), each with its age in seconds."""
    client = redis_client()
    keys = list(client.scan_iter(match=WORKER_BEAT_KEY.format(name="*"), count=500))
    beats = []
    now = time.time()
    for raw in client.mget(keys) if keys else []:
        try:
            doc = json.loads(raw)
        except (TypeError, ValueError):
            continue
        doc["age_s"] = round(max(0.0, now - float(doc.get("at", 0))), 1)
        beats.append(doc)
    return sorted(beats, key=lambda d: d["age_s"])


def _timed(check):
    start = time.perf_counter()
    try:
        detail = check()
        ok = True
    except Exception as exc:  # noqa: BLE001 - a health check reports every failure, it never raises
        detail = f"{exc.__class__.__name__}: {exc}"
        ok = False
    return {"ok": ok, "detail": detail, "ms": round((time.perf_counter() - start) * 1000, 1)}


def _database():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return connection.vendor


def _redis():
    redis_client().ping()
    return "PONG"


def _celery():
    beats = worker_beats()
    live = [b for b in beats if b["age_s"] <= WORKER_BEAT_STALE_S and READY_QUEUE in b.get("queues", [])]
    if live:
        return f"{len(live)} worker(s) beating, newest {live[0]['name']} {live[0]['age_s']:.0f} s ago"
    if beats:
        newest = beats[0]
        raise TimeoutError(
            f"no worker on queue '{READY_QUEUE}' beat in the last {WORKER_BEAT_STALE_S:.0f} s "
            f"(newest heartbeat: {newest['name']}, {newest['age_s']:.0f} s ago)"
        )
    raise TimeoutError(f"no Celery worker on queue '{READY_QUEUE}' has a heartbeat: none is running")


def readyz(request):
    checks = {"database": _timed(_database), "redis": _timed(_redis)}
    if checks["redis"]["ok"]:
        checks["celery"] = _timed(_celery)
    else:
        checks["celery"] = {"ok": False, "detail": "not checked: the broker (Redis) is down", "ms": 0.0}
    healthy = all(c["ok"] for c in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks}, status=200 if healthy else 503
    )


healthz = readyz  # the name probes and the dashboard have used: readiness


def livez(request):
    """This process answers requests (nothing it depends on is asked)."""
    return JsonResponse({"status": "ok", "pid": os.getpid()})
