"""A request body is bounded where it arrives, before it is read whole: 413 at the edge.

Why here and not in an ASGI middleware or Django setting: daphne (through Twisted's ``Request``) collects a
request's whole body before the application sees a byte of it, and then queues all of it for the application
at once; a chunked body has no length to check in advance, so a 500 MiB one cost the web process ~525 MB
before any authentication ran, and ended as a misleading 400 from Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``.
Neither daphne nor Twisted has a setting for this, so :func:`install` wraps daphne's ``WebRequest`` (the
per-request class its HTTP factory uses) where Twisted hands it the body: a declared ``Content-Length`` over
the bound is refused before anything is read, a chunked body as soon as it passes the bound. The refusal is
a 413 with a JSON ``detail``; the rest of the body is read and dropped (never kept) so that the client sees
the answer, up to :data:`DISCARD_MAX_BYTES`, and then the connection is cut. A chunked body under the bound
reaches the application with its length (Django's ASGI request reads no body without one).

Two bounds (settings ``MAX_REQUEST_BODY_BYTES`` and ``MAX_ANONYMOUS_BODY_BYTES``): a request that carries no
credential at all (no ``Authorization`` header, no session cookie) gets the small one, since nobody can be
held to it; one that carries a credential gets the larger one (the credential itself is checked later, by
Django: a made-up one only buys the larger bound, which is still a bound).
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger(__name__)

DISCARD_MAX_BYTES = 16 * 2**20
"""Bytes of a refused body read and dropped after the 413 so that the client reads it; then the cut."""

SESSION_COOKIE = b"sessionid="


def limit_for(headers) -> tuple[int, bool]:
    """(the bound for a request with these Twisted ``Headers``, whether it is the anonymous one)."""
    from django.conf import settings

    cookies = b";".join(headers.getRawHeaders(b"cookie") or [])
    credentialed = headers.hasHeader(b"authorization") or SESSION_COOKIE in cookies
    if credentialed:
        return settings.MAX_REQUEST_BODY_BYTES, False
    return settings.MAX_ANONYMOUS_BODY_BYTES, True


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def refusal(limit: int, anonymous: bool) -> bytes:
    """The 413 answer, whole (status line, headers, JSON body)."""
    detail = (
        f"The request body is larger than {_mib(limit)}, the most this server reads"
        + (" from a request without credentials; sign in or send a token" if anonymous else "")
        + "."
    )
    body = json.dumps({"detail": detail, "limit_bytes": limit}).encode()
    head = (
        b"HTTP/1.1 413 Content Too Large\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n"
        b"Connection: close\r\n\r\n" % len(body)
    )
    return head + body


def install() -> bool:
    """Bound daphne's request bodies in this process (idempotent); False where daphne is not installed."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:
        return False
    if getattr(WebRequest, "_cann_bounded", False):
        return True
    got_length = WebRequest.gotLength
    handle_chunk = WebRequest.handleContentChunk
    process = WebRequest.process

    def refuse(self) -> None:
        self._cann_refused = True
        self._cann_dropped = 0
        log.warning(
            "413 for %s %s: body over %s (%s)",
            self.method.decode(errors="replace"),
            self.uri.decode(errors="replace")[:200],
            _mib(self._cann_limit),
            "anonymous" if self._cann_anonymous else "with credentials",
        )
        transport = self.channel.transport
        transport.write(refusal(self._cann_limit, self._cann_anonymous))
        try:
            transport.loseWriteConnection()  # the answer and a FIN now; what the client still sends is dropped
        except AttributeError:  # a transport without half-close
            transport.loseConnection()

    def bounded_got_length(self, length):
        self._cann_limit, self._cann_anonymous = limit_for(self.requestHeaders)
        self._cann_received = 0
        self._cann_refused = False
        if length is not None and length > self._cann_limit:
            got_length(self, 0)  # nothing of it is kept
            refuse(self)
            return None
        return got_length(self, length)

    def bounded_handle_chunk(self, data):
        if getattr(self, "_cann_refused", False):
            self._cann_dropped += len(data)
            if self._cann_dropped > DISCARD_MAX_BYTES:
                self.channel.transport.abortConnection()
            return None
        self._cann_received = getattr(self, "_cann_received", 0) + len(data)
        if self._cann_received > getattr(self, "_cann_limit", float("inf")):
            refuse(self)
            return None
        return handle_chunk(self, data)

    def bounded_process(self):
        if getattr(self, "_cann_refused", False):  # answered already: the application never sees it
            self.channel.transport.loseConnection()
            return None
        if self.requestHeaders.hasHeader(b"transfer-encoding"):
            # Twisted took the chunks apart; without a length Django's ASGI request reads an empty body (a
            # chunked JSON document came out as "model: required"): say the length it has
            self.requestHeaders.removeHeader(b"transfer-encoding")
            self.requestHeaders.setRawHeaders(b"content-length", [b"%d" % getattr(self, "_cann_received", 0)])
        return process(self)

    WebRequest.gotLength = bounded_got_length
    WebRequest.handleContentChunk = bounded_handle_chunk
    WebRequest.process = bounded_process
    WebRequest._cann_bounded = True
    return True
