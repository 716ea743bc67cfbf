"""What fault-risk telemetry costs a training job, measured here (issue 14: at most 1% of step time).

Three figures, each measured in this run:

1. **Sampler**: one telemetry sample of this node (psutil, plus NVML and npu-smi where present; here they
   are absent) ``--samples`` times: CPU seconds per sample, and its share of the ``--interval`` s default
   interval (the sampler's own budget caps it at 1% of one core).
2. **Rank side**: what a rank adds to each step for the watch -- one step line appended to its file
   (``StepTimesWriter.record``), timed over many calls -- against the job's median step.
3. **Side by side on a real job**: the runtime on ``--ranks`` CPU ranks (tiny dense model, DDP over gloo,
   ranks forked by torchrun's agent), the node's :class:`NodeRiskWatch` (telemetry every
   ``--ab-interval`` s, step lines polled every 0.25 s, straggler scoring) switched on and off in alternating
   phases of ``--phase`` s; the median step time of each phase. The interval there is shorter than the
   default (1 s vs 5 s: five times the sampling cost) so that a cost could show at all; the phases'
   spread says how much of the difference is noise on this machine.

    .venv/bin/python bench/telemetry_cost.py [--ranks 2] [--phase 12] [--pairs 3] [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

from harness import bench_parser, scratch_dir, wait_until_training

from workers.reliability.local_job import launch, stop, straggler_job_config
from workers.reliability.risk_watch import NodeRiskWatch
from workers.reliability.telemetry.job import JobSignals
from workers.reliability.telemetry.sampler import TelemetrySampler, collectors_for_node
from workers.training.supervision.step_times import StepTimesReader, StepTimesWriter

BUDGET = 0.01  # issue 14: telemetry collection costs at most 1% of step time


def sampler_cost(samples: int) -> dict:
    sampler = TelemetrySampler(collectors_for_node(job=JobSignals()), node="bench")
    sampler.sample_once()  # primes the counters (rates need two readings)
    cpu, wall = [], []
    for _ in range(samples):
        s = sampler.sample_once()
        cpu.append(s.cost["cpu_s"])
        wall.append(s.cost["wall_s"])
        time.sleep(0.01)
    sampler.stop()
    return {
        "cpu_s_median": statistics.median(cpu),
        "wall_s_median": statistics.median(wall),
        "sources": sampler.active,
    }


def record_cost(tmp: Path, calls: int = 20000) -> float:
    w = StepTimesWriter(tmp, 0, restart=0)
    t0 = time.perf_counter()
    for step in range(calls):
        w.record(step, wait_s=0.001)
    seconds = (time.perf_counter() - t0) / calls
    w.close()
    return seconds


def side_by_side(args, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "job.json"
    config.write_text(json.dumps(straggler_job_config(args.ranks)))
    progress, log = work / "progress", work / "job.log"
    proc = launch(config, args.ranks, progress, log)
    phases = []
    events = {"telemetry": 0, "risk": 0}
    try:
        wait_until_training(proc, progress, args.ranks, log, min_step=5)
        for i in range(2 * args.pairs):
            on = i % 2 == 1
            start = time.time()
            watch = None
            if on:
                watch = NodeRiskWatch(
                    progress,
                    node="bench",
                    node_rank=0,
                    local_ranks=args.ranks,
                    telemetry_every_s=args.ab_interval,
                    publish=lambda kind, values, step: events.__setitem__(kind, events[kind] + 1),
                ).start()
                done = threading.Event()

                def poll(w=watch, d=done):
                    while not d.wait(0.25):
                        w.poll()

                poller = threading.Thread(target=poll, daemon=True)
                poller.start()
            time.sleep(args.phase)
            if on:
                done.set()
                poller.join()
                watch.stop()
            phases.append({"watch": on, "start": start, "end": time.time()})
    finally:
        stop(proc)
    lines = [d for d in StepTimesReader(progress).read_new() if d["rank"] == 0 and d.get("step_s")]
    for p in phases:
        # a second of margin at each end: a phase's first and last steps straddle the switch
        steps = [d["step_s"] for d in lines if p["start"] + 1.0 <= d["t"] < p["end"] - 0.5]
        p["steps"] = len(steps)
        p["median_step_s"] = statistics.median(steps) if steps else None
    return {"phases": phases, "events": events}


def main() -> int:
    parser = bench_parser(__doc__, json_flag=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--interval", type=float, default=5.0, help="the default telemetry interval")
    parser.add_argument("--ab-interval", type=float, default=1.0, help="telemetry interval in the on phases")
    parser.add_argument("--phase", type=float, default=12.0, help="seconds per phase")
    parser.add_argument("--pairs", type=int, default=3, help="off/on pairs")
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()

    with scratch_dir("cann-telemetry-cost-") as work:
        sampler = sampler_cost(args.samples)
        record_s = record_cost(work / "lines")
        ab = side_by_side(args, work / "job")
    off = [p["median_step_s"] for p in ab["phases"] if not p["watch"] and p["median_step_s"]]
    on = [p["median_step_s"] for p in ab["phases"] if p["watch"] and p["median_step_s"]]
    step_s = statistics.median(off + on)
    out = {
        "sampler": sampler,
        "sampler_cpu_share_at_default_interval": sampler["cpu_s_median"] / args.interval,
        "step_line_s": record_s,
        "step_line_share_of_step": record_s / step_s,
        "median_step_s_off": statistics.median(off),
        "median_step_s_on": statistics.median(on),
        "on_over_off": statistics.median(on) / statistics.median(off),
        "off_phase_spread": (max(off) - min(off)) / statistics.median(off),
        "ab": ab,
        "budget": BUDGET,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"telemetry cost on this machine ({', '.join(sampler['sources'])} present; budget {BUDGET:.0%})")
    print(
        f"  sampler: {sampler['cpu_s_median'] * 1e3:.2f} ms CPU ({sampler['wall_s_median'] * 1e3:.2f} ms wall) per"
        f" sample = {out['sampler_cpu_share_at_default_interval']:.3%} of one core every {args.interval:.0f} s"
    )
    print(
        f"  rank side: {record_s * 1e6:.1f} us per step line = {out['step_line_share_of_step']:.3%} of a "
        f"{step_s * 1e3:.1f} ms step"
    )
    print(
        f"  side by side ({args.ranks} ranks, telemetry every {args.ab_interval:.0f} s in the 'on' phases, "
        f"{args.phase:.0f} s phases):"
    )
    for p in ab["phases"]:
        ms = "-" if p["median_step_s"] is None else f"{p['median_step_s'] * 1e3:.2f} ms"
        print(f"    watch {'on ' if p['watch'] else 'off'}  median step {ms}  ({p['steps']} steps)")
    print(
        f"  on / off = {out['on_over_off']:.4f} (median of phase medians); the off phases alone spread "
        f"{out['off_phase_spread']:.2%}; {ab['events']['telemetry']} telemetry and {ab['events']['risk']} risk "
        "events built"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
