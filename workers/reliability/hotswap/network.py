"""Where hot swap's servers listen: torchft binds ``[::]`` (all interfaces) by default; these bind the
Manager's gRPC server and the checkpoint HTTP server to the node's address only."""

from __future__ import annotations

import contextlib
import ipaddress


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextlib.contextmanager
def manager_server_bound_to(host: str):
    """torchft's ``Manager`` starts its gRPC server on ``[::]`` (all interfaces) with no way to say
    otherwise; this binds it to ``host`` for the ``Manager`` built inside the block."""
    import torchft.manager as tm

    original = tm.ManagerServer

    def bound(**kwargs):
        kwargs["bind"] = f"{url_host(host)}:0"
        return original(**kwargs)

    tm.ManagerServer = bound
    try:
        yield
    finally:
        tm.ManagerServer = original


def bound_http_transport(host: str, timeout):
    """torchft's ``HTTPTransport`` (the checkpoint server a healing peer fetches from) listening on
    ``host`` only, and advertising it (torchft binds ``("", 0)`` on IPv6 and advertises the host name)."""
    import socket
    from http.server import ThreadingHTTPServer

    import torchft.checkpointing.http_transport as ht

    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class BoundServer(ThreadingHTTPServer):
        address_family = family
        request_queue_size = 1024  # as torchft's server

        def __init__(self, _address, handler):
            super().__init__((host, 0), handler)

    class BoundHTTPTransport(ht.HTTPTransport):
        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            return f"http://{url_host(host)}:{port}/checkpoint/"

    original = ht._IPv6HTTPServer
    ht._IPv6HTTPServer = BoundServer
    try:
        return BoundHTTPTransport(timeout=timeout, num_chunks=0)
    finally:
        ht._IPv6HTTPServer = original
