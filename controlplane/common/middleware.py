"""Turn an unreachable backing service into a clear 503 instead of a traceback; with DEBUG on, a page's
``Http404`` is still the app's 404 page; the Content-Security-Policy header."""

from __future__ import annotations

import functools
import logging

import kombu.exceptions
import redis
from django.conf import settings
from django.core.exceptions import DisallowedHost
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


# --- Content-Security-Policy -------------------------------------------------------------------------
# Hand-written rather than django-csp: the pages need one fixed policy (no inline scripts, so no nonces),
# two views relax it (the API docs, via ``csp_update``), and Django 6.0's built-in CSP takes a dict of the
# same shape (``SECURE_CSP``), so moving to it later is deleting this class.


def csp_update(**directives: list[str]):
    """A view decorator: add sources to the policy's directives for this view's responses only
    (``style_src=["'unsafe-inline'"]`` adds to ``style-src``)."""

    def decorate(view):
        @functools.wraps(view)
        def wrapped(request, *args, **kwargs):
            response = view(request, *args, **kwargs)
            response.csp_update = {k.replace("_", "-"): v for k, v in directives.items()}
            return response

        return wrapped

    return decorate


class ContentSecurityPolicyMiddleware:
    """``Content-Security-Policy`` from ``settings.SECURE_CSP`` (``SECURE_CSP_REPORT_ONLY``: the
    ``-Report-Only`` header) on every response that has none; ``connect-src`` also gets this host's
    websocket origin (``ws://`` or ``wss://`` as the request came in: ``'self'`` covers same-host websockets
    only in CSP Level 3 browsers)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        policy = settings.SECURE_CSP
        if not policy:
            return response
        header = (
            "Content-Security-Policy-Report-Only"
            if settings.SECURE_CSP_REPORT_ONLY
            else "Content-Security-Policy"
        )
        if header in response.headers:
            return response
        directives = {name: list(sources) for name, sources in policy.items()}
        for name, sources in getattr(response, "csp_update", {}).items():
            directives.setdefault(name, list(policy.get("default-src", []))).extend(sources)
        if "connect-src" in directives:
            try:
                host = request.get_host()
            except DisallowedHost:  # the 400 for a host not in ALLOWED_HOSTS
                host = None
            if host:
                directives["connect-src"].append(f"{'wss' if request.is_secure() else 'ws'}://{host}")
        response.headers[header] = "; ".join(
            " ".join([name, *sources]) for name, sources in directives.items()
        )
        return response
