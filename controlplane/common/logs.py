"""Structured logs and the request id that ties web, task and training together.

``LOG_FORMAT=json`` (settings) writes one JSON object per line (``JsonFormatter``); the default stays the
plain line for people. Either way every record gets the current *log context*: the ``request_id`` of the
HTTP request being answered (``RequestIdMiddleware``: the caller's ``X-Request-ID`` when it is a sane token,
else a new one, echoed on the response), and the ``job_id`` / ``search_id`` a Celery task works on.

The request id travels on: a task enqueued while answering a request carries it in a message header
(``controlplane.celery``: ``before_task_publish`` copies it, ``task_prerun`` restores it in the worker), a
training launched by such a task gets it as ``CANN_TRAIN_REQUEST_ID`` in its environment, and the runtime's
lifecycle events say it (``values.request_id``, ``workers.training.metrics.EventPublisher``).

The formatter is the standard library's ``logging.Formatter`` with ``json.dumps``: a dozen lines do it, and a
library (python-json-logger) would be one more dependency for the same output.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType

REQUEST_ID_HEADER = "X-Request-ID"
# the Celery message header and the training environment variable that carry it on
TASK_HEADER = "cann_request_id"
RUNTIME_ENV = "CANN_TRAIN_REQUEST_ID"
# a caller's id is kept when it is a short token (a UUID, a proxy's or a load balancer's id); anything else
# (spaces, control characters, 1 KB of text) is replaced, so it is safe in a header, a log line and a label
SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
CONTEXT_KEYS = ("request_id", "job_id", "search_id", "comparison_id")

# the context is replaced, never changed in place (``bind``): a read-only empty default
log_context: contextvars.ContextVar[Mapping] = contextvars.ContextVar(
    "cann_train_log_context", default=MappingProxyType({})
)


def current_request_id() -> str | None:
    return log_context.get().get("request_id")


def bind(**values) -> contextvars.Token:
    """Add ``values`` (``None`` ones left out) to the log context; ``log_context.reset(token)`` undoes it."""
    return log_context.set({**log_context.get(), **{k: v for k, v in values.items() if v is not None}})


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id_from(header: str | None) -> str:
    """The caller's request id when it is sane, else a new one."""
    return header if header and SANE_REQUEST_ID.match(header) else new_request_id()


def runtime_env() -> dict[str, str]:
    """The training runtime's environment for the current request id (empty when there is none)."""
    request_id = current_request_id()
    return {RUNTIME_ENV: request_id} if request_id else {}


class RequestIdMiddleware:
    """Take the request's ``X-Request-ID`` (or make one), keep it in the log context while the request is
    answered and send it back on the response."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))
        token = bind(request_id=request.request_id)
        try:
            response = self.get_response(request)
        finally:
            log_context.reset(token)
        response[REQUEST_ID_HEADER] = request.request_id
        return response


class LogContextFilter(logging.Filter):
    """Puts the log context on every record (``record.request_id`` etc., ``"-"`` when unset, so a plain
    format string may name them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = log_context.get()
        for key in CONTEXT_KEYS:
            if not hasattr(record, key):
                setattr(record, key, context.get(key, "-"))
        return True


# attributes every LogRecord has: what is left over came from ``extra={...}``
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", *CONTEXT_KEYS}


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time level logger message``, the log context keys that are set, the
    fields passed with ``extra=`` and ``exc_info`` as ``exception`` text."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = log_context.get()
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            value = context.get(key) if value in (None, "-") else value
            if value is not None:
                out[key] = value
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)
