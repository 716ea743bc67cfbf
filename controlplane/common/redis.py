"""One Redis client per process for the control plane, with short timeouts so a dead Redis answers
quickly (503) instead of hanging a request."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=settings.REDIS_TIMEOUT_S,
        socket_timeout=settings.REDIS_TIMEOUT_S,
        health_check_interval=30,
    )


class ServiceUnavailable(Exception):
    """A backing service (Redis, the database, a Celery worker) is down; answered with 503."""

    def __init__(self, service: str, detail: str):
        super().__init__(f"{service} is unavailable: {detail}")
        self.service = service
        self.detail = detail
