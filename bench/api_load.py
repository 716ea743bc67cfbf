"""REST API under load (issue 16): ``--users`` concurrent clients on loopback against a server this bench
starts on a seeded database, measured per endpoint.

The stack is ``bench/harness.py``'s, as ``bench/live_fanout.py`` starts it (embedded Redis, a fresh migrated
SQLite database unless ``--database-url``, ``--web-procs`` daphne processes sharing one port), seeded the way ``make run`` seeds
it (``manage.py demo_setup``: the demo team, its knowledge base of plans, a queued demo job; no Celery
worker runs, so the job stays queued). Each user authenticates with an API token of the demo user
(``Authorization: Token ...``), keeps one HTTP/1.1 connection alive and cycles through the endpoints:

- ``GET /api/jobs/`` and ``GET /api/plans/`` (list, first page),
- ``GET /api/plans/<id>/`` (a plan of the team, a different one each time),
- ``POST /api/plans/evaluate/`` (the planner costs one strategy: GPT-3 on the 384-node contract cluster).

Each request waits for the previous answer of its user (a closed loop: ``--users`` requests in flight at
most). Printed per endpoint: requests, errors (anything but 2xx, or no answer), p50 / p99 / max latency
and requests per second.

    .venv/bin/python bench/api_load.py [--users 50] [--seconds 20] [--web-procs 1] [--json]
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


def main() -> int:
    ap = bench_parser(__doc__, json_flag=True)
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=20.0)
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
        ids = plan_ids(port, token)
        endpoints = ["jobs list", "plans list", "plan detail", "evaluate"]

        def calls(i):
            name = endpoints[i % len(endpoints)]
            if name == "jobs list":
                return name, "GET", "/api/jobs/", b""
            if name == "plans list":
                return name, "GET", "/api/plans/", b""
            if name == "plan detail":
                return name, "GET", f"/api/plans/{ids[(i // len(endpoints)) % len(ids)]}/", b""
            return name, "POST", "/api/plans/evaluate/", scenario

        samples = {n: [] for n in endpoints}
        errors = dict.fromkeys(endpoints, 0)

        async def load():
            stop_at = time.monotonic() + args.seconds
            await asyncio.gather(
                *(user_loop(port, token, calls, stop_at, samples, errors, u) for u in range(args.users))
            )

        t0 = time.monotonic()
        asyncio.run(load())
        elapsed = time.monotonic() - t0

    rows = []
    for name in endpoints:
        lat = sorted(samples[name])
        rows.append(
            {
                "endpoint": name,
                "requests": len(lat),
                "errors": errors[name],
                "p50_ms": quantile_ms(lat, 0.5),
                "p99_ms": quantile_ms(lat, 0.99),
                "max_ms": lat[-1] * 1000 if lat else float("nan"),
                "req_s": len(lat) / elapsed,
            }
        )
    if args.json:
        print(json.dumps({"users": args.users, "web_procs": args.web_procs, "plans": len(ids), "rows": rows}))
        return 0
    print(
        f"{args.users} users, {args.web_procs} daphne process(es), {elapsed:.0f} s, "
        f"{len(ids)} plans in the knowledge base"
    )
    print(
        f"{'endpoint':<12} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'req/s':>7}"
    )
    for r in rows:
        print(
            f"{r['endpoint']:<12} {r['requests']:>8} {r['errors']:>6} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['max_ms']:>8.1f} {r['req_s']:>7.1f}"
        )
    total = sum(r["requests"] for r in rows)
    print(
        f"{'all':<12} {total:>8} {sum(r['errors'] for r in rows):>6} {'':>8} {'':>8} {'':>8} {total / elapsed:>7.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
