"""Request bodies are bounded where daphne receives them (controlplane/common/body_limit.py): over real
sockets to the real daphne of the session's stack, a body too large is a 413 with a message, before it is
read whole, and the web process does not grow by what was sent; a chunked body under the bound reaches the
API whole (it used to arrive empty)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import psutil
import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MiB = 2**20


def _connect(stack) -> socket.socket:
    url = urlsplit(stack.base_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=20)
    return sock


def _response(sock) -> tuple[int, dict, bytes]:
    """Status, headers and body of the one answer on ``sock`` (read until the server closes or the body ends)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)
    }
    length = int(headers.get("content-length", -1))
    while length < 0 or len(body) < length:
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        body += chunk
    return status, headers, body


def _rss(stack) -> int:
    return psutil.Process(stack.procs["web"].pid).memory_info().rss


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def test_a_declared_length_over_the_bound_is_refused_before_the_body_is_sent(live_stack):
    sock = _connect(live_stack)
    with sock:
        sock.sendall(
            b"POST /api/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (500 * MiB)
        )
        status, headers, body = _response(sock)  # nothing of the body sent: the answer comes anyway
    assert status == 413, body
    doc = json.loads(body)
    assert "larger than 4 MiB" in doc["detail"] and "without credentials" in doc["detail"], doc
    assert doc["limit_bytes"] == 4 * MiB and headers["content-type"] == "application/json"


def test_a_chunked_body_without_credentials_is_cut_at_the_bound_and_costs_the_server_nothing(live_stack):
    before = _rss(live_stack)
    sock = _connect(live_stack)
    piece = _chunk(b"x" * MiB)
    with sock:
        sock.sendall(
            b"POST /api/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(6):  # past the 4 MiB bound, the body unfinished
            sock.sendall(piece)
        status, _, body = _response(sock)
        assert status == 413 and "larger than 4 MiB" in json.loads(body)["detail"], body
        # what the client goes on sending is dropped, and soon the connection is cut: 500 MiB never arrive
        sent, cut = 6 * MiB, False
        started = time.monotonic()
        try:
            while sent < 500 * MiB and time.monotonic() - started < 60:
                sock.sendall(piece)
                sent += MiB
        except OSError:
            cut = True
    assert cut and sent < 64 * MiB, f"sent {sent / MiB:.0f} MiB without the connection being cut"
    grown = _rss(live_stack) - before
    assert grown < 32 * MiB, f"the web process grew by {grown / MiB:.0f} MiB"
    # and it goes on serving
    sock = _connect(live_stack)
    with sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert _response(sock)[0] in (200, 503)


def test_a_chunked_json_body_under_the_bound_reaches_the_api_whole(live_stack, make_member, token_for):
    token = token_for(make_member("alice", "Team A"))
    doc = json.dumps({"name": "chunked"}).encode()
    sock = _connect(live_stack)
    with sock:
        sock.sendall(
            b"POST /api/tokens/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Token %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" % token.encode()
            + _chunk(doc[:5]) + _chunk(doc[5:]) + b"0\r\n\r\n"
        )  # fmt: skip
        status, _, body = _response(sock)
    assert status == 201, body
    assert json.loads(body)["name"] == "chunked"


def test_with_credentials_the_bound_is_the_larger_one(live_stack, make_member, token_for):
    """A 6 MiB body with a token passes the edge (its bound is 64 MiB) and meets Django's own limit on a
    document (2.5 MiB), a 413 that says so; without credentials the same body is the edge's 413."""
    token = token_for(make_member("alice", "Team A"))
    body = b'{"name": "' + b"x" * (6 * MiB) + b'"}'
    answers = {}
    for who, auth in (("token", b"Authorization: Token %s\r\n" % token.encode()), ("anonymous", b"")):
        sock = _connect(live_stack)
        with sock:
            sock.sendall(
                b"POST /api/tokens/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + auth
                + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            )  # fmt: skip
            try:
                sock.sendall(body)
            except OSError:
                pass  # the edge answered and cut the rest
            answers[who] = _response(sock)
    status, _, text = answers["token"]
    assert status == 413 and "no contract document is" in json.loads(text)["detail"], text
    status, _, text = answers["anonymous"]
    assert status == 413 and "without credentials" in json.loads(text)["detail"], text
