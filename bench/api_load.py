"""REST API under load (issues 16, 36): ``--users`` concurrent clients on loopback against a server this
bench starts on a seeded database, one endpoint at a time, each against the framework's floor measured in the
same run.

The stack is ``bench/harness.py``'s, as ``bench/live_fanout.py`` starts it (embedded Redis, a fresh migrated
SQLite database unless ``--database-url``, ``--web-procs`` daphne processes sharing one port), seeded the way
``make run`` seeds it (``manage.py demo_setup``: the demo team, its knowledge base of plans, a queued demo
job; no Celery worker runs) plus ``--jobs`` finished jobs of the demo team, each with a run summary and the
events a 300-step run leaves (300 train, 30 energy, 30 risk). Each user authenticates with an API token of the
demo user, keeps one HTTP/1.1 connection alive and repeats one request, waiting for each answer (a closed
loop: ``--users`` requests in flight at most), for ``--seconds`` per endpoint:

- the floor: ``GET /api/me/`` (authentication and DRF, one small object: what any request costs),
- ``GET /api/jobs/?limit=20``, ``GET /api/jobs/<id>/`` (a different job each time),
- ``GET /api/plans/?limit=20``, ``GET /api/plans/<id>/``, ``GET /api/models/``, ``GET /api/clusters/``,
- ``POST /api/plans/evaluate/`` (the planner costs one strategy: work, not a list; no goal).

Before a GET endpoint is timed, each distinct request of it is made once, alone (the warm-up: a first
request fills what the process keeps, an ended job's cached detail, a page's cached rows; its slowest is
printed). The goal is for the endpoint as it serves once warm: a cold process's first second is slower
(41 never-viewed jobs opened at once by 50 users: p99 1.3-1.4 s in the first 2 s, 2026-12-07).

Printed per endpoint: requests, errors (anything but 2xx, or no answer), p50 / p99 latency, requests per
second and that as a share of the floor's, against the goal (issue 36): every list and detail endpoint at
>= 50% of the floor's throughput and p99 <= 1 s at 50 users; and the warm-up's slowest first request.

    .venv/bin/python bench/api_load.py [--users 50] [--seconds 10] [--jobs 40] [--web-procs 1] [--json]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from harness import ROOT, bench_parser, local_stack, quantile_ms, run_dir


class Connection:
    """One keep-alive HTTP/1.1 connection (requests with a body in JSON, answers with Content-Length or
    chunked)."""

    def __init__(self, port: int, token: str):
        self.port, self.token = port, token
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Token {self.token}\r\nAccept: application/json\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            data = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            data = b""
            while size := int((await self.reader.readline()).strip(), 16):
                data += await self.reader.readexactly(size)
                await self.reader.readline()
            await self.reader.readline()
        else:
            data = await self.reader.read()
        if (
            headers.get("connection", "").lower() == "close"
            or "content-length" not in headers
            and (headers.get("transfer-encoding") != "chunked")
        ):
            await self.close()
        return status, data

    async def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = self.reader = None


async def user_loop(port, token, calls, stop_at, samples, errors, offset):
    conn = Connection(port, token)
    i = offset
    while time.monotonic() < stop_at:
        name, method, path, body = calls(i)
        i += 1
        t0 = time.perf_counter()
        try:
            status, _ = await asyncio.wait_for(conn.request(method, path, body), 60)
            ok = 200 <= status < 300
        except (OSError, ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            ok = False
            await conn.close()
        samples[name].append(time.perf_counter() - t0)
        if not ok:
            errors[name] += 1
    await conn.close()


def plan_ids(port: int, token: str) -> list[int]:
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/plans/?limit=200", headers={"Authorization": f"Token {token}"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        page = json.loads(r.read())
    return [p["id"] for p in page["results"]]


def demo_token(env) -> str:
    import subprocess

    out = subprocess.run(
        [sys.executable, "manage.py", "api_token", "create", "demo", "--name", "api load bench"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def seed_jobs(count: int, steps: int = 300) -> list[int]:
    """``count`` succeeded jobs of the demo team with what a ``steps``-step run stores: its run summary and its
    train, energy and risk events (written through the ORM into the stack's database)."""
    import django

    django.setup()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from controlplane.common.models import JobState
    from controlplane.jobs.models import TrainingJob
    from controlplane.live.models import StreamEvent
    from workers.training.examples import example

    team = get_user_model().objects.get(username="demo").teams.first()
    now = timezone.now()
    config = {"model": example("tiny-dense.json"), "strategy": {"dp": 2}, "steps": steps, "device": "cpu"}
    ids = []
    for j in range(count):
        losses = [round(5.5 - 3 * i / steps, 4) for i in range(steps)]
        job = TrainingJob.objects.create(
            team=team, name=f"load {j}", config=config, nproc_per_node=2, attempts=1,
            state=JobState.SUCCEEDED, progress=1.0, started_at=now - timedelta(minutes=10), finished_at=now,
            measured={"steps": steps, "tokens_per_s": 5200.0, "step_time_s": 0.098, "loss_first": losses[0],
                      "loss_last": losses[-1], "losses": losses, "step_times_s": [0.098] * steps},
        )  # fmt: skip
        rows = []
        seq = 0
        for step in range(1, steps + 1):
            seq += 1
            values = {"attempt": 1, "loss": losses[step - 1], "step_time_s": 0.098, "tokens_per_s": 5200.0}
            rows.append(
                StreamEvent(stream=job.stream, seq=seq, time=now, kind="train", step=step, values=values)
            )
            if step % 10 == 0:
                seq += 1
                rows.append(StreamEvent(stream=job.stream, seq=seq, time=now, kind="energy", step=step, values={
                    "attempt": 1, "kwh": step * 1e-6, "kwh_it": step * 9e-7, "kgco2e": step * 2e-7,
                    "power_w": 40.0, "tokens": step * 512, "method": "rapl", "estimate": False}))  # fmt: skip
                seq += 1
                rows.append(StreamEvent(stream=job.stream, seq=seq, time=now, kind="risk", step=step, values={
                    "attempt": 1, "node": "node0", "node_rank": 0, "risk": 0.1, "level": "low", "ranks": []}))  # fmt: skip
        StreamEvent.objects.bulk_create(rows)
        ids.append(job.pk)
    return ids


def main() -> int:
    ap = bench_parser(__doc__, json_flag=True)
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=10.0, help="per endpoint")
    ap.add_argument("--jobs", type=int, default=40, help="finished jobs with events seeded beside the demo")
    ap.add_argument("--web-procs", type=int, default=1, help="daphne processes behind the one port")
    ap.add_argument("--database-url", default="")
    args = ap.parse_args()

    from workers.planner.examples import contract

    scenario = json.dumps(
        {
            "model": contract("model.json"),
            "cluster": contract("cluster.json"),
            "training": contract("training.json"),
            "strategy": {**contract("strategy.json"), "dp": 48},
        }
    ).encode()
    with local_stack(
        run_dir("api-load-"), database_url=args.database_url, web_procs=args.web_procs, demo=True
    ) as stack:
        token = demo_token(stack.env)
        port = stack.port
        plans = plan_ids(port, token)
        jobs = seed_jobs(args.jobs)
        # (name, method, path for the i-th request, body, a list or detail the goal applies to)
        endpoints = [
            ("floor /api/me/", "GET", lambda i: "/api/me/", b"", False),
            ("jobs list", "GET", lambda i: "/api/jobs/?limit=20", b"", True),
            ("job detail", "GET", lambda i: f"/api/jobs/{jobs[i % len(jobs)]}/", b"", True),
            ("plans list", "GET", lambda i: "/api/plans/?limit=20", b"", True),
            ("plan detail", "GET", lambda i: f"/api/plans/{plans[i % len(plans)]}/", b"", True),
            ("models list", "GET", lambda i: "/api/models/", b"", True),
            ("clusters list", "GET", lambda i: "/api/clusters/", b"", True),
            ("evaluate", "POST", lambda i: "/api/plans/evaluate/", scenario, False),
        ]
        rows = []
        for name, method, path, body, goal in endpoints:
            samples = {name: []}
            errors = {name: 0}

            def calls(i, name=name, method=method, path=path, body=body):
                return name, method, path(i), body

            async def load(calls=calls, samples=samples, errors=errors):
                stop_at = time.monotonic() + args.seconds
                await asyncio.gather(
                    *(user_loop(port, token, calls, stop_at, samples, errors, u) for u in range(args.users))
                )

            async def warm_up(method=method, path=path, body=body) -> float:
                conn, slowest = Connection(port, token), 0.0
                for p in dict.fromkeys(path(i) for i in range(max(len(jobs), len(plans)))):
                    t = time.perf_counter()
                    await conn.request(method, p, body)
                    slowest = max(slowest, time.perf_counter() - t)
                await conn.close()
                return slowest

            warm_s = asyncio.run(warm_up()) if method == "GET" else float("nan")
            t0 = time.monotonic()
            asyncio.run(load())
            elapsed = time.monotonic() - t0
            lat = sorted(samples[name])
            rows.append(
                {
                    "endpoint": name,
                    "goal": goal,
                    "requests": len(lat),
                    "errors": errors[name],
                    "p50_ms": quantile_ms(lat, 0.5),
                    "p99_ms": quantile_ms(lat, 0.99),
                    "req_s": len(lat) / elapsed,
                    "warm_up_slowest_ms": warm_s * 1000,
                }
            )
    floor = rows[0]["req_s"]
    for r in rows:
        r["share_of_floor"] = r["req_s"] / floor if floor else float("nan")
        r["meets"] = (
            (r["share_of_floor"] >= 0.5 and r["p99_ms"] <= 1000 and not r["errors"]) if r["goal"] else None
        )
    if args.json:
        print(
            json.dumps(
                {
                    "users": args.users,
                    "web_procs": args.web_procs,
                    "plans": len(plans),
                    "jobs": len(jobs),
                    "rows": rows,
                }
            )
        )
        return 0
    print(
        f"{args.users} users, {args.web_procs} daphne process(es), {args.seconds:.0f} s per endpoint, "
        f"{len(plans)} plans, {len(jobs) + 1} jobs (each seeded one with 360 events)"
    )
    print("1st ms: the slowest first request of the warm-up (each distinct request once, alone, untimed)")
    print(
        f"{'endpoint':<15} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7} {'of floor':>8} "
        f"{'1st ms':>7}  goal (>= 50% of floor, p99 <= 1 s)"
    )
    for r in rows:
        verdict = "" if r["meets"] is None else ("meets" if r["meets"] else "misses")
        print(
            f"{r['endpoint']:<15} {r['requests']:>8} {r['errors']:>6} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['req_s']:>7.1f} {r['share_of_floor'] * 100:>7.0f}% {r['warm_up_slowest_ms']:>7.0f}  {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
