"""An emulated two-tier network for tests and benchmarks: one Linux network namespace per "node".

Topology: a switch namespace holds a bridge; each node namespace has one veth (``ctnet0``) to it, with
its own address (``10.77.0.<i+1>/24``). Both directions of every node's uplink are rate-limited with
``tc`` (the node side shapes what the node sends, the switch side what it receives), like one NIC per
node. Ranks of one node run inside that node's namespace and talk to each other over the namespace's
local routes (loopback); only traffic between nodes crosses the shaped links.

Latency needs the ``netem`` qdisc; where the kernel lacks it (``Specified qdisc kind is unknown``),
the link is shaped with ``tbf`` only and ``latency_emulated`` is False (logged, not hidden).

gloo inside a namespace: set ``GLOO_SOCKET_IFNAME=ctnet0`` so gloo binds to the veth address and
advertises it to peers, and put the rendezvous store on node 0's veth address (``MASTER_ADDR``), which
ranks in other namespaces can reach. ``node_env(i)`` returns both.

Namespaces are named ``ct-<pid>-n<i>`` / ``ct-<pid>-sw``; they are removed on exit, also after an
exception, and namespaces left by dead processes (``ct-<pid>-*`` whose pid is gone) are removed at start.
Needs root and iproute2 (``ip``, ``tc``).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

IFNAME = "ctnet0"
SUBNET = "10.77.0"
_NS_RE = re.compile(r"^ct-(\d+)-")
_NETWORKS = itertools.count()


class NetworkUnavailable(RuntimeError):
    """Not root, or iproute2 missing: the emulated network cannot be built here."""


def unavailable_reason() -> str:
    """Why the emulated network cannot be built here ("" if it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) not found; apt-get install iproute2"
    return ""


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def list_namespaces() -> list[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> list[str]:
    """Delete ``ct-<pid>-*`` namespaces whose creating process is gone; returns their names."""
    removed = []
    for name in list_namespaces():
        m = _NS_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    if removed:
        log.info("netem: removed stale namespaces %s", removed)
    return removed


@dataclass
class Node:
    index: int
    namespace: str
    address: str
    ifname: str = IFNAME


@dataclass
class TwoTierNetwork:
    """Context manager: ``with TwoTierNetwork(nodes=2, inter_node_gbit=1.0, latency_ms=0.5) as net:``."""

    nodes: int = 2
    inter_node_gbit: float = 1.0
    latency_ms: float = 0.0
    # the pid (for remove_stale_namespaces) and a per-network tag: two comparisons in one process (a
    # threads-pool Celery worker) must not ask for the same namespace names
    prefix: str = field(default_factory=lambda: f"ct-{os.getpid()}-{next(_NETWORKS)}-")
    node_list: list[Node] = field(default_factory=list, init=False)
    latency_emulated: bool = field(default=False, init=False)
    qdisc: str = field(default="", init=False)
    _created: list[str] = field(default_factory=list, init=False)
    _procs: list[subprocess.Popen] = field(default_factory=list, init=False)

    # -- lifecycle
    def __enter__(self) -> TwoTierNetwork:
        reason = unavailable_reason()
        if reason:
            raise NetworkUnavailable(reason)
        if self.nodes < 1 or self.inter_node_gbit <= 0:
            raise ValueError("need nodes >= 1 and a positive inter-node rate")
        remove_stale_namespaces()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    @property
    def namespaces(self) -> list[str]:
        return [n.namespace for n in self.node_list]

    def _netns(self, name: str) -> None:
        _sh("ip", "netns", "add", name)
        self._created.append(name)
        _sh("ip", "-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._netns(self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.nodes):
            ns = f"{self.prefix}n{i}"
            self._netns(ns)
            # create both ends in the switch namespace (unique names there), then move one into the node
            node_end, switch_end = f"tmp{i}", f"up{i}"
            _sh("ip", "-n", self.switch, "link", "add", node_end, "type", "veth", "peer", "name", switch_end)
            _sh("ip", "-n", self.switch, "link", "set", node_end, "netns", ns)
            _sh("ip", "-n", ns, "link", "set", node_end, "name", IFNAME)
            _sh("ip", "-n", self.switch, "link", "set", switch_end, "master", "br0")
            _sh("ip", "-n", self.switch, "link", "set", switch_end, "up")
            address = f"{SUBNET}.{i + 1}"
            _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", IFNAME)
            _sh("ip", "-n", ns, "link", "set", IFNAME, "up")
            self._shape(ns, IFNAME)  # node -> switch
            self._shape(self.switch, switch_end)  # switch -> node
            self.node_list.append(Node(i, ns, address))

    def _shape(self, ns: str, dev: str) -> None:
        rate = f"{self.inter_node_gbit * 1000:.3f}mbit"
        if self.latency_ms > 0 and self.qdisc != "tbf":
            netem = [
                "delay",
                f"{self.latency_ms / 2:.3f}ms",
                "rate",
                rate,
                "limit",
                "100000",
            ]  # one-way = RTT/2
            proc = _sh(
                "ip",
                "netns",
                "exec",
                ns,
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "netem",
                *netem,
                check=False,
            )
            if proc.returncode == 0:
                self.latency_emulated, self.qdisc = True, "netem"
                return
            log.warning(
                "netem qdisc unavailable (%s): shaping rate only, no added latency", proc.stderr.strip()
            )
        # Token bucket: the burst must hold a GSO super-packet (64 KiB) and ~2 ms at the rate.
        rate_bytes = self.inter_node_gbit * 1e9 / 8
        burst = max(128 * 1024, int(rate_bytes * 0.002))
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
            "burst", str(burst), "latency", "100ms")  # fmt: skip
        self.qdisc = "tbf"

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()  # only processes this network started
                proc.wait(timeout=10)
        self._procs.clear()
        for name in reversed(self._created):
            _sh("ip", "netns", "del", name, check=False)
        self._created.clear()

    # -- running things inside a node
    def node_env(self, index: int) -> dict[str, str]:
        """Environment for a rank on node ``index``: gloo's interface and the store on node 0."""
        return {"GLOO_SOCKET_IFNAME": IFNAME, "MASTER_ADDR": self.node_list[0].address}

    def command(self, index: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.node_list[index].namespace, *argv]

    def popen(self, index: int, argv: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside node ``index`` (killed at exit if still running, and with the thread that
        started it)."""
        from workers.training.supervision.supervisor import die_with_parent

        full_env = {**os.environ, **self.node_env(index), **(env or {})}
        # the death signal survives `ip netns exec`'s exec: when the process (or Celery worker thread) that
        # started a node's ranks dies, they die too instead of training on, unsupervised, for minutes
        kwargs.setdefault("preexec_fn", die_with_parent)
        proc = subprocess.Popen(self.command(index, argv), env=full_env, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, index: int, argv: list[str], env: dict | None = None, timeout: float = 120, **kwargs):
        """Run ``argv`` inside node ``index`` to completion; returns the CompletedProcess."""
        proc = self.popen(
            index, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # -- measurements
    def measure_gbit(self, src: int, dst: int, megabytes: float = 32.0, port: int = 5201) -> float:
        """Goodput of one TCP stream from node ``src`` to node ``dst`` (same index: node loopback), Gbit/s."""
        host = "127.0.0.1" if src == dst else self.node_list[dst].address
        receiver = self.popen(
            dst, [sys.executable, "-c", _RECEIVER, host, str(port)], stdout=subprocess.PIPE, text=True
        )
        try:
            self._wait_listening(dst, host, port)
            sent = self.run(
                src, [sys.executable, "-c", _SENDER, host, str(port), str(int(megabytes * 2**20))]
            )
            if sent.returncode != 0:
                raise RuntimeError(f"sender failed: {sent.stderr.strip()}")
            out, _ = receiver.communicate(timeout=120)
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait()
        nbytes, seconds = out.split()
        return int(nbytes) * 8 / float(seconds) / 1e9

    def measure_rtt_ms(self, src: int, dst: int, rounds: int = 50, port: int = 5202) -> float:
        """Median TCP round trip of a 1-byte ping-pong between two nodes, in ms."""
        host = self.node_list[dst].address
        echo = self.popen(dst, [sys.executable, "-c", _ECHO, host, str(port)])
        try:
            self._wait_listening(dst, host, port)
            out = self.run(src, [sys.executable, "-c", _PING, host, str(port), str(rounds)])
            if out.returncode != 0:
                raise RuntimeError(f"ping failed: {out.stderr.strip()}")
            return float(out.stdout.strip())
        finally:
            if echo.poll() is None:
                echo.kill()
                echo.wait()

    def _wait_listening(self, index: int, host: str, port: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
        while time.monotonic() < deadline:
            if self.run(index, [sys.executable, "-c", probe], timeout=10).returncode == 0:
                return
            time.sleep(0.2)
        raise TimeoutError(f"nothing listening on {host}:{port} in node {index}")


_RECEIVER = textwrap.dedent(
    """
    import socket, sys, time
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(4)
    while True:  # the first connections are readiness probes: skip the empty ones
        conn, _ = srv.accept()
        first = conn.recv(1 << 20)
        if first:
            break
        conn.close()
    total, t0 = len(first), time.perf_counter()
    while True:
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        total += len(chunk)
    print(total, time.perf_counter() - t0)
    """
)
_SENDER = textwrap.dedent(
    """
    import socket, sys
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    block, left = b"x" * (1 << 20), int(sys.argv[3])
    while left > 0:
        n = min(left, len(block)); s.sendall(block[:n]); left -= n
    s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
    """
)
_ECHO = textwrap.dedent(
    """
    import socket, sys
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(4)
    while True:
        conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            b = conn.recv(1)
            if not b:
                break
            conn.sendall(b)
        conn.close()
    """
)
_PING = textwrap.dedent(
    """
    import socket, statistics, sys, time
    s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(int(sys.argv[3])):
        t0 = time.perf_counter(); s.sendall(b"p"); s.recv(1); times.append(time.perf_counter() - t0)
    print(statistics.median(times) * 1e3)
    """
)
