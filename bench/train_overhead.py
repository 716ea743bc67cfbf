"""Training runtime overheads, measured side by side.

1. Metric publishing: the same single-rank run with events published to Redis (``job/<id>``) and without,
   alternated A/B/A/B. Reports the time the training thread spends building and handing over the events
   (the direct cost, target <= 2% of step time) and the step-time difference between the two (includes the background
   publisher thread competing for the CPU; noisy on a shared machine).
2. Throughput: tokens/s of one process against 2 and 4 data-parallel ranks, expert parallel over data or
   context-parallel ranks (same global batch, gloo on
   this machine's CPUs; with fewer cores than ranks, more ranks is slower, and the figure says so).

    .venv/bin/python bench/train_overhead.py [--steps 40] [--redis-url redis://127.0.0.1:6379/0] [--skip-scaling]

Without ``--redis-url`` (or ``REDIS_URL``) the bench starts an embedded Redis of its own (``bench/harness.py``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import uuid

from harness import ROOT, bench_parser, local_stack, scratch_dir, single_rank_rendezvous

from workers.devices import backend as device_mod

device_mod.prepare_environment()

EXAMPLES = ROOT / "workers" / "training" / "examples"


def make_config(strategy: dict, steps: int, **extra):
    from workers.training.config import JobConfig

    return JobConfig.from_dict(
        {
            "model": json.loads((EXAMPLES / "tiny-moe.json").read_text()),
            "strategy": strategy,
            "training": {"global_batch_size": 8},
            "steps": steps,
            "device": "cpu",
            **extra,
        }
    )


def publishing_overhead(steps: int, redis_url: str, rounds: int) -> dict:
    import redis
    import torch

    from workers.events import read_since, seq_key, stream_key
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    single_rank_rendezvous()
    job_id = str(800_000 + uuid.uuid4().int % 99_999)
    client = redis.Redis.from_url(redis_url)
    client.ping()
    trials = {"on": [], "off": []}
    submit_s, step_s, published = 0.0, 0.0, 0
    trainer = None
    try:
        for r in range(rounds):
            # ABBA order: neither mode always runs first (the first run of a round pays warm-up effects)
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                cfg = make_config(
                    {"micro_batch_size": 4}, steps, job_id=job_id, redis_url=redis_url, publish=mode == "on"
                )
                trainer = Trainer(cfg, rank=0, world_size=1)
                trainer.train()
                times = [r.step_time_s for r in trainer.history[2:]]  # skip warm-up steps
                trials[mode] += times
                if mode == "on":
                    submit_s += trainer.publish_seconds
                    step_s += sum(r.step_time_s for r in trainer.history)
                    published += trainer.publisher.published
        events = read_since(client, f"job/{job_id}")
    finally:
        if trainer is not None:
            trainer.close()
        client.delete(stream_key(f"job/{job_id}"), seq_key(f"job/{job_id}"))
    on, off = statistics.median(trials["on"]), statistics.median(trials["off"])
    return {
        "steps_per_trial": steps,
        "rounds": rounds,
        "events_published": published,
        "events_in_stream": len(events),
        "train_events_have_loss": all("loss" in e["values"] for e in events if e["kind"] == "train"),
        "step_time_median_on_s": on,
        "step_time_median_off_s": off,
        "submit_share_of_step_time_pct": 100 * submit_s / step_s,
        "ab_step_time_difference_pct": 100 * (on - off) / off,
    }


def scaling(steps: int) -> list[dict]:
    from workers.training.cli import run_local

    rows = []
    for name, strategy in (
        ("1 rank", {"micro_batch_size": 4}),
        ("2 ranks dp2", {"dp": 2, "micro_batch_size": 4}),
        ("2 ranks dp2 ep2", {"dp": 2, "ep": 2, "micro_batch_size": 4}),
        ("2 ranks cp2 ep2", {"cp": 2, "ep": 2, "micro_batch_size": 8}),
        ("4 ranks dp4", {"dp": 4, "micro_batch_size": 2}),
    ):
        cfg = make_config(strategy, steps)
        summary = run_local(cfg, cfg.world_size, timeout=600)
        rows.append(
            {"run": name, "tokens_per_s": summary["tokens_per_s"], "step_time_s": summary["step_time_s"]}
        )
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["vs_1_rank"] = row["tokens_per_s"] / base
    return rows


def main() -> int:
    parser = bench_parser(__doc__, json_flag=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL"),
        help="the Redis the events go to (default: $REDIS_URL, else an embedded one this bench starts)",
    )
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()

    with scratch_dir("cann-train-overhead-") as work, local_stack(work, redis_url=args.redis_url) as stack:
        pub = publishing_overhead(args.steps, stack.redis_url, args.rounds)
    rows = [] if args.skip_scaling else scaling(max(6, args.steps // 4))
    if args.json:
        print(json.dumps({"publishing": pub, "scaling": rows}))
        return 0
    print(
        f"cpu cores: {os.cpu_count()}, model tiny-moe (4 layers, hidden 64, 4 experts), global batch 8 x 32 tokens"
    )
    print("\nmetric publishing (1 rank, A/B alternated, median step times):")
    print(f"  step time with publishing      {pub['step_time_median_on_s'] * 1000:8.2f} ms")
    print(f"  step time without publishing   {pub['step_time_median_off_s'] * 1000:8.2f} ms")
    print(f"  A/B difference                 {pub['ab_step_time_difference_pct']:8.2f} %  (noise included)")
    ok = "ok" if pub["submit_share_of_step_time_pct"] <= 2 else "OVER TARGET"
    print(
        f"  training-thread cost           {pub['submit_share_of_step_time_pct']:8.3f} %  (target <= 2%: {ok})"
    )
    print(f"  events published / in stream   {pub['events_published']} / {pub['events_in_stream']}")
    if rows:
        print("\nthroughput (gloo, same global batch):")
        for row in rows:
            print(
                f"  {row['run']:<18} {row['tokens_per_s']:9.0f} tokens/s  "
                f"step {row['step_time_s'] * 1000:7.1f} ms  x{row['vs_1_rank']:.2f} vs 1 rank"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
