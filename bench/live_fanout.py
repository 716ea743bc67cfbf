"""Live fan-out under load (issue 16): training-rank publishers -> Redis stream -> relay -> channel layer ->
websocket consumer -> clients, all real processes on loopback, measured end to end.

The bench starts its own embedded Redis, a fresh SQLite database (``--database-url`` for another), the
relay (``manage.py relay``) and ``--web-procs`` daphne processes sharing one listening socket (the bench
binds it and hands it to each as ``--fd``: the kernel spreads the connections over them). Per config it
creates a job, opens the websocket clients (token-authenticated, as API clients are: ``Authorization:
Token ...``) in ``--client-procs`` processes, subscribes them to ``job/<id>``, and has ``--ranks``
:class:`workers.training.metrics.EventPublisher` instances (the runtime's own publisher, one per rank, each
batching on its thread) submit ``train`` events at the config's total rate for ``--seconds``. Each event
carries its publish time (``values.t_pub``, wall clock, taken when the rank submits it).

Measured, side by side for each delivery mode:

- **p50 / p99 / max latency**: receive time at the client - ``t_pub``, over every (client, event) pair.
- **lost**: events a client never received by ``--drain-s`` seconds after the last publish, summed over
  clients (every client is owed every event of the stream: no down-sampling), plus ``dup/order``:
  events received twice or out of ``seq`` order (goal 0 for all three). ``db missing``: published events
  not in the database (``StreamEvent``) at the end.
- **relay ev/s**: events the relay acknowledged (read, stored and forwarded) per second while publishing,
  from its Redis consumer group; **db rows/s**: ``StreamEvent`` rows written per second over the same window.
- **frames/s**: websocket frames the clients received per second.

Relays (``--relays``), each run in turn on the same stack: ``before`` is the relay as it was before issue
16's store work (``BaselineRelay``: the ORM's ``bulk_create``, each batch stored before the next read, 500
entries per read); ``after`` is ``manage.py relay`` as it is (multi-row ``INSERT ... ON CONFLICT DO NOTHING``
on a store thread that overlaps the next read and forward, reads growing to 2,000 entries while behind,
a linger between small reads that follows the frames the last round sent: up to 20 ms with many
subscribers, about 2 ms with one; a new stream wakes the relay's blocking read). Both have the rest of issue 16's relay (the clash check's range query,
batches forwarded as the entries' own JSON) and the same consumers.

Modes: ``per-event`` is the old frame format (one websocket frame per event, what a client that does not
ask for batches still gets); ``batch`` subscribes with ``"batch": true`` and gets one frame per relay
batch (``{"type": "events", "stream", "events": [...]}``, the format the browser's ``live.js`` asks for).

    .venv/bin/python bench/live_fanout.py [--configs 1x100,10x500,50x2000] [--relays before,after]
        [--modes batch] [--seconds 10] [--ranks 4] [--web-procs 1] [--client-procs 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from array import array
from datetime import datetime
from pathlib import Path

from harness import Stack, bench_parser, local_stack, quantile_ms, relay_acked, run_dir, start_relay

GOALS = (  # (clients, events/s, p99 ms at most, whose goal); each also: nothing lost, no duplicate or disorder
    (1, 100, 20.0, "issue 36"),
    (50, 2000, 1000.0, "issue 36"),
    (50, 2000, 50.0, "issue 16"),
)


# --- clients (own processes: the bench's clients must not share a core's GIL with what they measure) ----
async def _client_sockets(ws_url, token, stream, n, batch, ready, done_seq, results):
    import websockets

    sockets = []
    for _ in range(n):
        ws = await websockets.connect(
            ws_url,
            additional_headers={"Authorization": f"Token {token}"},
            max_size=2**24,
            open_timeout=60,
            ping_interval=None,  # keepalive pings are not what is measured; a loaded machine misses them
        )
        await ws.send(json.dumps({"action": "subscribe", "stream": stream, "last_seq": 0, "batch": batch}))
        answer = json.loads(await ws.recv())
        assert answer.get("type") == "subscribed", answer
        sockets.append(ws)
    ready.put(n)

    async def receive(ws):
        lat, last, got, dup, disorder, frames = array("d"), 0, 0, 0, 0, 0
        from_redis = array("d")  # receive time - the event's "time" (its append to Redis), every 10th event
        seen: set[int] = set()
        while True:
            try:
                raw = await asyncio.wait_for(ws.recv(), 0.5)
            except TimeoutError:
                target = done_seq.value
                if target and (len(seen) >= target or time.monotonic() > done_seq.deadline):
                    break
                continue
            now = time.time()
            frames += 1
            m = json.loads(raw)
            events = m["events"] if m.get("type") == "events" else ([m] if "seq" in m else [])
            for e in events:
                seq = e["seq"]
                if seq in seen:
                    dup += 1
                    continue
                if seq < last:
                    disorder += 1
                seen.add(seq)
                last = max(last, seq)
                got += 1
                lat.append(now - e["values"]["t_pub"])
                if seq % 10 == 0:
                    from_redis.append(
                        now - datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
                    )
            target = done_seq.value
            if target and len(seen) >= target:
                break
        await ws.close()
        return {
            "received": got,
            "dup": dup,
            "disorder": disorder,
            "frames": frames,
            "lat": lat.tobytes(),
            "from_redis": from_redis.tobytes(),
        }

    results.extend(await asyncio.gather(*(receive(ws) for ws in sockets)))


class _DoneSeq:
    """The last seq published (0 while publishing) and the drain deadline, polled by the client loops."""

    def __init__(self, shared, deadline):
        self.shared, self.deadline_shared = shared, deadline

    @property
    def value(self):
        return self.shared.value

    @property
    def deadline(self):
        return self.deadline_shared.value


def client_process(ws_url, token, stream, n, batch, ready, out, last_seq, deadline):
    results: list = []
    asyncio.run(
        _client_sockets(ws_url, token, stream, n, batch, ready, _DoneSeq(last_seq, deadline), results)
    )
    out.put(results)


# --- publishers: the runtime's EventPublisher, one per rank ----------------------------------------------
def publisher_process(redis_url, job_id, ranks, rate, seconds, start_at, out):
    from workers.training.metrics import EventPublisher

    pubs = [EventPublisher(redis_url, str(job_id)) for _ in range(ranks)]
    per_rank = rate / ranks

    def rank_loop(rank, pub):
        tick, sent = 0.005, 0
        while time.time() < start_at:
            time.sleep(0.001)
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < seconds:
            due = int(elapsed * per_rank) - sent
            for _ in range(due):
                sent += 1
                pub.submit(
                    "train",
                    {"t_pub": time.time(), "rank": rank, "loss": 2.5, "tps": 5631.0, "mfu": 0.41},
                    step=sent,
                )
            time.sleep(tick)

    threads = [threading.Thread(target=rank_loop, args=(r, p)) for r, p in enumerate(pubs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in pubs:
        p.close()
    out.put({"published": sum(p.published for p in pubs), "errors": sum(p.errors for p in pubs)})


# --- the relays: the stack's own (``manage.py relay``, "after") or issue 16's baseline ("before") -------
def relay_command(variant: str) -> list[str] | None:
    """The relay ``variant``'s command: ``after`` is the stack's own (``manage.py relay``), ``before`` this
    file's child process serving :class:`BaselineRelay`."""
    return None if variant == "after" else [sys.executable, __file__, "--serve-baseline-relay"]


def persist_with_orm(events: list[dict]) -> int:
    """``persist_events`` before issue 16: a model instance per event, ``bulk_create(ignore_conflicts)``."""
    from controlplane.live.models import StreamEvent
    from workers.events import parse_time

    rows = [
        StreamEvent(
            stream=e["stream"],
            seq=e["seq"],
            time=parse_time(e["time"]),
            kind=e["kind"],
            step=e.get("step"),
            values=e.get("values") or {},
        )
        for e in events
    ]
    StreamEvent.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
    return len(rows)


def serve_baseline_relay() -> None:
    """``manage.py relay`` (same periodic jobs and listeners) with the relay as it was before issue 16."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import close_old_connections

    from controlplane.live.management.commands import relay as relay_command
    from controlplane.live.relay import Relay

    class BaselineRelay(Relay):
        persist = staticmethod(persist_with_orm)

        def __init__(self, **kwargs):
            super().__init__(**kwargs, store_ahead=0, linger_ms=0, max_batch=500)

        def step(self):
            self.reread_pending = True  # it read its own pending entries every round
            return super().step()

        def handle(self, response):
            close_old_connections()  # and opened a new database connection per batch (CONN_MAX_AGE 0)
            return super().handle(response)

    relay_command.Relay = BaselineRelay  # the command builds its relay from this name
    call_command("relay")


def seed():
    """A team, a member and their API token (what an API client presents)."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from controlplane.accounts.models import Membership, Team
    from controlplane.accounts.services import team_create, token_issue

    user = get_user_model().objects.create_user(username="bench", password="bench-password-not-used")
    team = Team.objects.filter(name="Bench").first() or team_create(name="Bench")
    Membership.objects.create(team=team, user=user)
    return team, token_issue(user=user, name="live fan-out bench")[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_config(stack: Stack, team, token, clients, rate, mode, relay, args) -> dict:
    import redis

    from controlplane.jobs.models import TrainingJob
    from controlplane.live.models import StreamEvent

    job = TrainingJob.objects.create(team=team, name=f"fanout {clients}x{rate} {mode} {relay}", config={})
    stream = f"job/{job.pk}"
    r = redis.Redis.from_url(stack.redis_url)
    ctx = mp.get_context("spawn")
    ready, out, pub_out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    last_seq, deadline = ctx.Value("q", 0), ctx.Value("d", 0.0)
    nproc = max(1, min(args.client_procs, clients))
    shares = [clients // nproc + (i < clients % nproc) for i in range(nproc)]
    workers = [
        ctx.Process(
            target=client_process,
            args=(stack.ws_url, token, stream, n, mode == "batch", ready, out, last_seq, deadline),
        )
        for n in shares
    ]
    for w in workers:
        w.start()
    opened = 0
    while opened < clients:
        opened += ready.get(timeout=120)
    start_at = time.time() + 0.5
    pub = ctx.Process(
        target=publisher_process,
        args=(stack.redis_url, job.pk, args.ranks, rate, args.seconds, start_at, pub_out),
    )
    pub.start()
    while time.time() < start_at:
        time.sleep(0.01)
    t0, acked0, rows0 = time.monotonic(), relay_acked(r, stream), 0
    relay_pid = stack.procs["relay"].pid
    web_pids = [p.pid for name, p in stack.procs.items() if name.startswith("web")]
    relay_cpu0, web_cpu0 = cpu_seconds(relay_pid), sum(cpu_seconds(p) for p in web_pids)
    client_cpu0 = sum(cpu_seconds(w.pid) for w in workers)
    published = pub_out.get(timeout=args.seconds + 120)
    pub.join()
    window = time.monotonic() - t0
    acked1 = relay_acked(r, stream)
    unread = int(r.get(f"cann:seq:{stream}") or 0) - relay_acked(r, stream, read=True)
    relay_cpu = cpu_seconds(relay_pid) - relay_cpu0
    web_cpu = sum(cpu_seconds(p) for p in web_pids) - web_cpu0
    client_cpu = sum(cpu_seconds(w.pid) for w in workers) - client_cpu0
    rows1 = StreamEvent.objects.filter(stream=stream).count()
    total = int(r.get(f"cann:seq:{stream}") or 0)
    deadline.value = time.monotonic() + args.drain_s  # the client processes share CLOCK_MONOTONIC
    last_seq.value = total
    results = []
    for _ in workers:
        results.extend(out.get(timeout=args.drain_s + 120))
    for w in workers:
        w.join()
    stored_deadline = time.monotonic() + 30
    while (stored := StreamEvent.objects.filter(stream=stream).count()) < total and (
        time.monotonic() < stored_deadline
    ):
        time.sleep(0.2)
    lat = array("d")
    for res in results:
        lat.frombytes(res["lat"])
    lat = sorted(lat)
    from_redis = array("d")
    for res in results:
        from_redis.frombytes(res["from_redis"])
    from_redis = sorted(from_redis)

    return {
        "clients": clients,
        "rate": rate,
        "mode": mode,
        "relay": relay,
        "published": total,
        "publish_errors": published["errors"],
        "p50_ms": quantile_ms(lat, 0.50),
        "p99_ms": quantile_ms(lat, 0.99),
        "max_ms": lat[-1] * 1000 if lat else float("nan"),
        # the same from the event's append to Redis (its "time", ms resolution): without the time it waited
        # in the publishing rank's queue (EventPublisher batches on its own thread)
        "redis_p50_ms": quantile_ms(from_redis, 0.50),
        "redis_p99_ms": quantile_ms(from_redis, 0.99),
        "lost": sum(total - res["received"] for res in results),
        "dup_or_disorder": sum(res["dup"] + res["disorder"] for res in results),
        "db_missing": total - stored,
        "relay_ev_s": (acked1 - acked0) / window,
        "unread_at_end": unread,  # published, not read by the relay yet when the ranks stopped
        "db_rows_s": (rows1 - rows0) / window,
        "frames_s": sum(res["frames"] for res in results) / window,
        # CPU the relay spent per 1,000 events it acked, and the daphne processes' CPU share: what the
        # latency figures cost, readable even when other work on the machine moves the latencies
        "relay_cpu_ms_per_kev": 1e6 * relay_cpu / max(1, acked1 - acked0),
        "web_cpu_pct": 100 * web_cpu / window,
        "client_cpu_pct": 100 * client_cpu / window,  # the bench's own websocket clients, all processes
        "window_s": window,
    }


def main() -> int:
    ap = bench_parser(__doc__, json_flag=True)
    ap.add_argument("--configs", default="1x100,10x500,50x2000", help="CLIENTSxEVENTS_PER_S, comma separated")
    ap.add_argument("--modes", default="batch", help="per-event, batch or both, comma separated")
    ap.add_argument(
        "--relays",
        default="before,after",
        help="relay variants run in turn: before (issue 16's baseline), after",
    )
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument(
        "--drain-s", type=float, default=60.0, help="how long clients may take after the last publish"
    )
    ap.add_argument("--ranks", type=int, default=4, help="publishers (training ranks), sharing the rate")
    ap.add_argument("--web-procs", type=int, default=1, help="daphne processes behind the one port")
    ap.add_argument("--client-procs", type=int, default=2, help="processes the websocket clients run in")
    ap.add_argument("--database-url", default="")
    ap.add_argument("--serve-baseline-relay", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_baseline_relay:  # the bench's own child process: the baseline relay
        serve_baseline_relay()
        return 0
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    modes = args.modes.split(",")
    relays = args.relays.split(",")
    if unknown := set(relays) - {"before", "after"}:
        ap.error(f"--relays takes before and/or after, not {sorted(unknown)}")

    rows = []
    with local_stack(
        run_dir("live-fanout-"), database_url=args.database_url, web_procs=args.web_procs
    ) as stack:
        team, token = seed()
        for relay in relays:
            start_relay(stack, relay, relay_command(relay))
            for clients, rate in configs:
                for mode in modes:
                    rows.append(run_config(stack, team, token, clients, rate, mode, relay, args))
                    if not args.json:
                        print_row(rows[-1], header=len(rows) == 1)
    if args.json:
        print(json.dumps({"web_procs": args.web_procs, "rows": rows}, indent=2))
    else:
        print_summary(rows, args)
    return 0


COLUMNS = (
    ("clients", "{:>7}"),
    ("rate", "{:>6}"),
    ("mode", "{:>9}"),
    ("relay", "{:>6}"),
    ("published", "{:>9}"),
    ("p50_ms", "{:>9.1f}"),
    ("p99_ms", "{:>9.1f}"),
    ("max_ms", "{:>9.1f}"),
    ("redis_p50_ms", "{:>9.1f}"),
    ("redis_p99_ms", "{:>9.1f}"),
    ("lost", "{:>6}"),
    ("dup_or_disorder", "{:>9}"),
    ("db_missing", "{:>10}"),
    ("unread_at_end", "{:>8}"),
    ("relay_ev_s", "{:>10.0f}"),
    ("db_rows_s", "{:>9.0f}"),
    ("frames_s", "{:>9.0f}"),
    ("relay_cpu_ms_per_kev", "{:>11.0f}"),
    ("web_cpu_pct", "{:>8.0f}"),
    ("client_cpu_pct", "{:>11.0f}"),
)
HEADERS = (
    "clients",
    "ev/s",
    "mode",
    "relay",
    "published",
    "p50 ms",
    "p99 ms",
    "max ms",
    "Rp50 ms",
    "Rp99 ms",
    "lost",
    "dup/order",
    "db missing",
    "unread",
    "relay ev/s",
    "db rows/s",
    "frames/s",
    "relay ms/kev",
    "web cpu%",
    "client cpu%",
)


def print_row(row: dict, header: bool) -> None:
    if header:
        print(" ".join(f"{h:>{len(f.format(row[k]))}}" for h, (k, f) in zip(HEADERS, COLUMNS, strict=True)))
    print(" ".join(f.format(row[k]) for k, f in COLUMNS), flush=True)


def print_summary(rows: list[dict], args) -> None:
    print(
        f"\n{args.web_procs} daphne process(es), {args.ranks} publishing ranks, {args.seconds:.0f} s per config"
    )
    by = {(r["clients"], r["rate"], r["mode"], r["relay"]): r for r in rows}
    for (clients, rate, mode, relay), new in by.items():
        if relay != "after" or (old := by.get((clients, rate, mode, "before"))) is None:
            continue
        print(
            f"{clients} x {rate}/s {mode}: p99 {old['p99_ms']:.1f} -> {new['p99_ms']:.1f} ms "
            f"(p50 {old['p50_ms']:.1f} -> {new['p50_ms']:.1f}), lost {old['lost']} -> {new['lost']}, "
            f"relay {old['relay_ev_s']:.0f} -> {new['relay_ev_s']:.0f} ev/s, "
            f"db {old['db_rows_s']:.0f} -> {new['db_rows_s']:.0f} rows/s, relay CPU "
            f"{old['relay_cpu_ms_per_kev']:.0f} -> {new['relay_cpu_ms_per_kev']:.0f} ms per 1,000 events"
        )
    print(
        "goals, measured side by side (batch mode; each also asks for 0 lost and 0 duplicated or out of order):"
    )
    for clients, rate, p99_ms, whose in GOALS:
        for relay in ("before", "after"):
            row = by.get((clients, rate, "batch", relay))
            if row is None:
                continue
            met = row["p99_ms"] <= p99_ms and row["lost"] == 0 and row["dup_or_disorder"] == 0
            print(
                f"  {whose}: {clients} x {rate}/s p99 <= {p99_ms:.0f} ms ({relay}): measured p99 "
                f"{row['p99_ms']:.1f} ms, lost {row['lost']}, dup/order {row['dup_or_disorder']}: "
                f"{'met' if met else 'NOT met'}"
            )


if __name__ == "__main__":
    sys.exit(main())
