"""Gradient-communication order (issue 17, "Order and overlap"): DDP's reverse order against priority (first
layers first, ByteScheduler / P3) and magnitude (largest norm first), side by side on the emulated network.

    sudo .venv/bin/python bench/comm_order.py [--gbit 1] [--steps 8] [--bucket-mb 5] [--rounds 1] [--json out.json]

Every row is the real runtime (``cann-train comm-opt``'s runner: one torchrun agent per emulated node, 2
nodes x 2 ranks, gloo, tbf-shaped inter-node link) training ``examples/comm-20m.json`` from the same seed on
the same data, AdamW, ``grad_clip`` 0 in every row (the priority modes update layer by layer before a global
norm exists; clipping off everywhere keeps the rows the same computation). ``reverse`` is plain DDP with
torch's all-reduce hook (timed); ``priority`` / ``magnitude`` are ``workers.training.comm.priority``, with
partitions of the same size as DDP's buckets (the planner's choice for the link, or ``--bucket-mb``).

Figures are rank 0's: comm seconds exposed (the training thread waited for gradients: DDP's end-of-backward
wait; for the priority modes the waits in the next forward) and total (ready -> reduced, summed over
buckets), the median step time of the steps after the first, and the losses (ordering is lossless: the
largest relative difference from reverse is printed). With ``--rounds`` > 1 the orders run interleaved and
each figure is the median over the rounds (the machine is shared).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from harness import bench_parser

from workers.training.comm import netem
from workers.training.comm.compare import DEFAULT_MODEL, job_config, method_row, run_on_network
from workers.training.config import JobConfig

ORDERS = ("reverse", "priority", "magnitude")
NODES, RANKS_PER_NODE = 2, 2  # bench/comm.py's layout: 4 ranks, two per emulated node


def order_config(model: dict, order: str, *, steps: int, gbit: float, bucket_mb: float | None) -> JobConfig:
    """The comparison's job (``compare.job_config``) with ``comm_order`` and clipping off."""
    base = job_config(
        model,
        world_size=NODES * RANKS_PER_NODE,
        hook="allreduce" if order == "reverse" else None,
        steps=steps,
        inter_node_gbit=gbit,
        bucket_cap_mb=bucket_mb,
    ).to_dict()
    base.update(comm_order=order, grad_clip=0.0)
    if order != "reverse":
        base["comm_hook"] = None
    return JobConfig.from_dict(base)


def measure_orders(model: dict, *, gbit: float, steps: int, bucket_mb: float | None, rounds: int) -> dict:
    """Every order on one emulated network (interleaved over ``rounds``): per order the medians of rank 0's
    comm exposed / total, step time and tokens/s, its losses, and its ratios against ``reverse``."""
    runs: dict[str, list[dict]] = {o: [] for o in ORDERS}
    with netem.TwoTierNetwork(nodes=NODES, inter_node_gbit=gbit) as net:
        for r in range(rounds):
            for order in ORDERS:
                cfg = order_config(model, order, steps=steps, gbit=gbit, bucket_mb=bucket_mb)
                summary = run_on_network(net, cfg, RANKS_PER_NODE, timeout=900)
                row = method_row(summary)
                row["losses"] = summary["losses"]
                runs[order].append(row)
                print(
                    f"  round {r + 1} {order}: step {row['step_time_s']:.3f} s, exposed {row['comm_s_exposed']:.3f} s",
                    file=sys.stderr,
                    flush=True,
                )
        qdisc, latency = net.qdisc, net.latency_emulated
    rows = {}
    for order, rs in runs.items():
        rows[order] = {
            k: round(statistics.median(x[k] for x in rs), 4)
            for k in ("comm_s_exposed", "comm_s_total", "step_time_s", "tokens_per_s")
        }
        rows[order].update(bucket_cap_mb=rs[0]["bucket_cap_mb"], losses=rs[0]["losses"], rounds=len(rs))
    ref = rows["reverse"]
    for row in rows.values():
        row["speedup_vs_reverse"] = round(ref["step_time_s"] / row["step_time_s"], 3)
        row["exposed_vs_reverse"] = round(row["comm_s_exposed"] / max(ref["comm_s_exposed"], 1e-9), 3)
        row["loss_max_rel_diff_vs_reverse"] = max(
            abs(a - b) / abs(b) for a, b in zip(row["losses"], ref["losses"], strict=True)
        )
    return {"rows": rows, "qdisc": qdisc, "latency_emulated": latency}


def format_orders(result: dict, *, model_name: str, gbit: float, steps: int, rounds: int) -> str:
    rows = result["rows"]
    ref = rows["reverse"]
    lines = [
        f"comm order: {model_name} on {NODES} nodes x {RANKS_PER_NODE} ranks (gloo, cpu), {gbit:g} Gbit/s "
        f"({result['qdisc']}; latency emulated: {'yes' if result['latency_emulated'] else 'no'}), {steps} steps, "
        f"AdamW, grad_clip 0, buckets/partitions {ref['bucket_cap_mb']} MB, median of {rounds} round(s)",
        f"{'order':<10} {'comm exposed s':>14} {'comm total s':>12} {'step s':>7} {'speed-up':>8} "
        f"{'exposed vs rev':>14} {'loss last':>9} {'max |dloss|/loss':>16}",
    ]
    for order, row in rows.items():
        lines.append(
            f"{order:<10} {row['comm_s_exposed']:>14.3f} {row['comm_s_total']:>12.3f} {row['step_time_s']:>7.3f} "
            f"{row['speedup_vs_reverse']:>7.3f}x {row['exposed_vs_reverse']:>13.3f}x {row['losses'][-1]:>9.4f} "
            f"{row['loss_max_rel_diff_vs_reverse']:>16.2e}"
        )
    lines.append(
        "exposed: the training thread's wait for gradients per step (reverse: DDP's end-of-backward wait; "
        "priority/magnitude: the next forward's waits, stage by stage); total: ready -> reduced, summed over "
        "buckets."
    )
    return "\n".join(lines)


def main() -> int:
    p = bench_parser(__doc__)
    p.add_argument("--gbit", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=8, help="steps per run (the first is not timed)")
    p.add_argument(
        "--bucket-mb", type=float, default=None, help="bucket = partition size (default: planner's)"
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--json")
    args = p.parse_args()
    reason = netem.unavailable_reason()
    if reason:
        print(f"bench/comm_order.py: cannot build the emulated network: {reason}", file=sys.stderr)
        return 3
    model = json.loads(Path(args.model).read_text())
    t0 = time.monotonic()
    result = measure_orders(
        model, gbit=args.gbit, steps=args.steps, bucket_mb=args.bucket_mb, rounds=args.rounds
    )
    print(
        format_orders(result, model_name=model["name"], gbit=args.gbit, steps=args.steps, rounds=args.rounds)
    )
    print(f"bench wall time {(time.monotonic() - t0) / 60:.1f} min")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": result["rows"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
