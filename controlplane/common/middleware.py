"""Turn an unreachable backing service into a clear 503 instead of a traceback; with DEBUG on, a page's
``Http404`` is still the app's 404 page."""

from __future__ import annotations

import logging

import kombu.exceptions
import redis
from django.conf import settings
from django.db import OperationalError
from django.http import Http404, JsonResponse
from django.template.response import SimpleTemplateResponse

from controlplane.common import errors
from controlplane.common.redis import ServiceUnavailable

log = logging.getLogger(__name__)

UNAVAILABLE_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    kombu.exceptions.OperationalError,  # Celery could not reach its broker
    OperationalError,
    ServiceUnavailable,
)


def describe_unavailable(exc: Exception) -> tuple[str, str]:
    if isinstance(exc, ServiceUnavailable):
        return exc.service, exc.detail
    if isinstance(exc, redis.exceptions.RedisError | kombu.exceptions.OperationalError):
        return (
            "Redis",
            f"cannot reach {settings.REDIS_URL.split('@')[-1]} ({exc.__class__.__name__}). Is Redis running? Set REDIS_URL to point at it.",
        )
    return "The database", f"{exc}. Check DATABASE_URL."


class ServiceUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exc):
        if not isinstance(exc, UNAVAILABLE_ERRORS):
            return None
        service, detail = describe_unavailable(exc)
        log.warning("503 for %s: %s: %s", request.path, service, detail)
        if request.path.startswith("/api/") or "application/json" in request.headers.get("Accept", ""):
            return JsonResponse(
                {"detail": f"{service} is unavailable: {detail}", "service": service}, status=503
            )
        response = SimpleTemplateResponse(
            "unavailable.html", {"service": service, "detail": detail}, status=503
        )
        return response.render()


class AppNotFoundPageMiddleware:
    """With DEBUG on, Django answers an ``Http404`` with its technical "Page not found" page and never calls
    ``handler404``; DEBUG is `make run`'s default, so a user opening a deleted job got the yellow debug
    page. An ``Http404`` raised by a page view is the app's 404 page in both modes (``errors``); the API
    keeps DRF's JSON (DRF handles its own ``Http404`` before this sees it), and a URL that matches no
    pattern keeps Django's debug page under DEBUG, whose list of the URL patterns is the developer's clue.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exc):
        if settings.DEBUG and isinstance(exc, Http404):
            return errors.page_not_found(request, exc)
        return None
