"""``/healthz``: is the database reachable, does Redis answer, does a Celery worker answer a ping?"""

from __future__ import annotations

import secrets
import time

from django.db import connection
from django.http import JsonResponse

from controlplane.common.redis import redis_client

CELERY_PING_TIMEOUT_S = 3.0


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
    from controlplane.common.tasks import PING_KEY, ping

    nonce = secrets.token_hex(8)
    key = PING_KEY.format(nonce=nonce)
    ping.apply_async((nonce,), queue="default", expires=CELERY_PING_TIMEOUT_S, ignore_result=True)
    deadline = time.monotonic() + CELERY_PING_TIMEOUT_S
    while time.monotonic() < deadline:
        if worker := redis_client().getdel(key):
            return f"worker {worker.decode()}"
        time.sleep(0.02)
    raise TimeoutError(f"no Celery worker answered on queue 'default' within {CELERY_PING_TIMEOUT_S:.0f}s")


def healthz(request):
    checks = {"database": _timed(_database), "redis": _timed(_redis)}
    if checks["redis"]["ok"]:
        checks["celery"] = _timed(_celery)
    else:
        checks["celery"] = {"ok": False, "detail": "not checked: the broker (Redis) is down", "ms": 0.0}
    healthy = all(c["ok"] for c in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks}, status=200 if healthy else 503
    )
