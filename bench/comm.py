"""Gradient-communication benchmark (issues 6 and 17): every method side by side on the emulated network.

    sudo .venv/bin/python bench/comm.py [--steps 8] [--gbits 0.5,1,10] [--loss-steps 300] [--json out.json]
    sudo .venv/bin/python bench/comm.py --quick      # a few minutes: 1 Gbit/s, 4 methods, 4 + 60 steps

One run, three parts, all with the real runtime (one torchrun agent per emulated node namespace, gloo):

1. the >= 20M-parameter dense GPT (``examples/comm-20m.json``) on 2 nodes x 2 ranks at each link speed of
   ``--gbits`` (0.5, 1 and 10 Gbit/s), every fixed method and the ``adaptive`` controller: bytes, comm
   exposed/total, step time, tokens/s, loss -- ratios against dense, and the controller's switches;
2. DGC-level sparsity on the same model at ``--gbit`` (1 Gbit/s): top-k at 0.1 % density with DGC's
   momentum correction (m = 0.9, masking) and exponential warm-up (Lin et al. 2018), bytes per rank
   against dense fp32;
3. the loss after ``--loss-steps`` (300) steps on the stdlib-text task with the small model
   (``examples/comm-tiny.json``; 300 steps of the 20M model take ~15 min per method on 2 cores): dense,
   top-k 1 % (the comparison's setting), top-k 0.1 % DGC, adaptive;
4. the order buckets are sent in (``bench/comm_order.py``'s runs): DDP's reverse order against priority
   (first layers first, ByteScheduler / P3) and magnitude on the 20M model at ``--gbit``: exposed comm,
   step time, loss difference.

Then PASS / NOT MET per target of the issues, with the measured ratio. The network is rate-limited with tbf
only (this kernel has no netem qdisc): no latency is added, which the output says.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from harness import bench_parser

from workers.training.comm import netem
from workers.training.comm.compare import (
    DEFAULT_MODEL,
    EXAMPLES,
    TOPK_CLIP_NORM,
    Comparison,
    add_ratios,
    compare_methods,
    format_table,
    job_config,
    method_hook,
    method_row,
    run_on_network,
)

FIXED = ("dense", "fp16", "powersgd", "topk_ef", "sign_ef", "hierarchical", "hierarchical_topk")
ALL = (*FIXED, "adaptive")
QUICK = ("dense", "fp16", "topk_ef", "adaptive")
# DGC at its published low end (Lin et al. 2018: 99.9 % sparsity, momentum correction with m = 0.9 and
# masking, exponential warm-up from 25 % density) plus the local clipping the comparison uses for top-k
DGC_DENSITY = 0.001
# the adaptive controller as a job would name it: what ``cann-train comm-opt`` runs
ADAPTIVE = method_hook("adaptive", ranks_per_node=2, density=0.01)
DGC_MOMENTUM = 0.9


def dgc_spec(steps: int) -> str:
    """The ``topk_ef`` spec of the DGC row: warm-up over the default share of the run (the first half)."""
    from workers.training.comm.compression import DGC_WARMUP_START_DENSITY, default_warmup_steps

    return (
        f"topk_ef:density={DGC_DENSITY},momentum={DGC_MOMENTUM},clip_norm={TOPK_CLIP_NORM},"
        f"warmup=exponential,start_density={DGC_WARMUP_START_DENSITY},warmup_steps={default_warmup_steps(steps)}"
    )


# DGC's byte reduction at its low end: 270x (Lin et al. 2018, abstract: "reduce the communication bandwidth
# by 270x to 600x")
DGC_MIN_REDUCTION = 270.0
ADAPTIVE_LOSS_TOLERANCE = 0.01  # issue 17: within 1 % of dense at 300 steps
DGC_LOSS_TOLERANCE = 0.02  # issue 17: within 2 %
TOPK_LOSS_TOLERANCE = 0.03  # issue 6: within 3 %


def verdict(ok: bool) -> str:
    return "PASS" if ok else "NOT MET"


def run_spec(
    net, model: dict, hook: str, *, steps: int, gbit: float, timeout: float = 1800
) -> tuple[dict, dict]:
    """One custom hook spec with the runtime on ``net``: (the comparison row, rank 0's summary)."""
    cfg = job_config(model, world_size=4, hook=hook, steps=steps, inter_node_gbit=gbit)
    t0 = time.monotonic()
    summary = run_on_network(net, cfg, 2, timeout=timeout)
    row = method_row(summary)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row, summary


def switch_lines(summary: dict, limit: int = 6) -> list[str]:
    switches = summary.get("comm_switches") or []
    lines = [
        f"    step {s['step']} bucket {s['bucket']} ({s['first_param']}): {s['from']} -> {s['to']}: {s['reason']}"
        for s in switches[:limit]
    ]
    if len(switches) > limit:
        lines.append(f"    ... {len(switches) - limit} more switches")
    return lines or ["    no switch: it kept its starting level (dense)"]


def final_levels(summary: dict) -> str:
    """Each bucket's level after the run's last switch (``dense`` where it never switched)."""
    last: dict[int, str] = {}
    for s in summary.get("comm_switches") or []:
        last[s["bucket"]] = s["to"]
    return ", ".join(f"bucket {b}: {lvl}" for b, lvl in sorted(last.items())) or "all dense (no switch)"


def _target(text: str, measured: float, bound: float) -> dict:
    """A bound > 0 is a floor for ``measured``, a bound < 0 a ceiling of ``-bound``."""
    ok = measured <= -bound if bound < 0 else measured >= bound
    return {"target": text, "measured": measured, "pass": ok}


def speed_targets(runs: dict[float, Comparison], gbit: float) -> list[dict]:
    out = []
    if gbit in runs:
        m, params = runs[gbit].methods, runs[gbit].model["params"]
        if "topk_ef" in m and "dense" in m:
            out.append(
                _target(
                    f"top-k+EF 1%: >= 50x fewer gradient bytes than dense fp32 ({params / 1e6:.1f}M model)",
                    m["topk_ef"]["bytes_reduction_vs_dense"],
                    50.0,
                )
            )
            out.append(
                _target(
                    f"top-k+EF 1%: step time >= 1.5x faster than dense at {gbit:g} Gbit/s",
                    m["topk_ef"]["speedup_vs_dense"],
                    1.5,
                )
            )
        if "hierarchical" in m and "dense" in m:
            out.append(
                _target(
                    f"hierarchical dense: >= 1.3x faster than flat dense at {gbit:g} Gbit/s",
                    m["hierarchical"]["speedup_vs_dense"],
                    1.3,
                )
            )
    for link, run in runs.items():
        fixed = {k: v for k, v in run.methods.items() if k != "adaptive"}
        if "adaptive" not in run.methods or not fixed:
            continue
        for key, what in (("step_time_s", "steps 2-N"), ("step_time_steady_s", "second half, steady state")):
            if any(key not in r for r in run.methods.values()):
                continue
            best = min(fixed, key=lambda k: fixed[k][key])
            ratio = round(fixed[best][key] / run.methods["adaptive"][key], 3)
            out.append(
                _target(
                    f"adaptive at {link:g} Gbit/s, median of {what}: step time <= the best fixed method's "
                    f"({best}, {fixed[best][key]:.3f} s vs {run.methods['adaptive'][key]:.3f} s) "
                    "[ratio = best / adaptive, must be >= 1]",
                    ratio,
                    1.0,
                )
            )
    return out


def main() -> int:
    p = bench_parser(__doc__)
    p.add_argument("--steps", type=int, default=8, help="steps per method on the 20M model (first untimed)")
    p.add_argument("--gbits", default="0.5,1,10", help="link speeds of part 1, Gbit/s, comma-separated")
    p.add_argument("--gbit", type=float, default=1.0, help="link of parts 2 and 3")
    p.add_argument("--loss-steps", type=int, default=300)
    p.add_argument("--loss-model", default=str(EXAMPLES / "comm-tiny.json"))
    p.add_argument("--methods", help=f"part 1's methods, comma-separated (default: {','.join(ALL)})")
    p.add_argument("--parts", default="1,2,3,4", help="which parts to run (default 1,2,3,4)")
    p.add_argument("--quick", action="store_true", help="1 Gbit/s, dense/fp16/topk_ef/adaptive, 4 + 60 steps")
    p.add_argument("--json", help="write all figures here")
    args = p.parse_args()
    try:
        gbits = [float(x) for x in args.gbits.split(",") if x.strip()]
    except ValueError:
        print(
            f"bench/comm.py: --gbits must be numbers separated by commas, got {args.gbits!r}", file=sys.stderr
        )
        return 2
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip()) if args.methods else ALL
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    problems = []
    if not gbits or min(gbits) <= 0 or args.steps < 2 or args.loss_steps < 10:
        problems.append("need link speeds > 0, --steps >= 2 and --loss-steps >= 10")
    if set(methods) - set(ALL) or not methods:
        problems.append(f"--methods: choose from {', '.join(ALL)} (got {args.methods!r})")
    if not parts or parts - {"1", "2", "3", "4"}:
        problems.append(f"--parts: choose from 1,2,3,4 (got {args.parts!r})")
    if problems:
        print("bench/comm.py: " + "; ".join(problems), file=sys.stderr)
        return 2
    if args.quick:
        gbits, methods, args.steps, args.loss_steps = [args.gbit], QUICK, 4, 60
    reason = netem.unavailable_reason()
    if reason:
        print(f"bench/comm.py: cannot build the emulated network: {reason}", file=sys.stderr)
        return 3

    t_start = time.monotonic()
    model = json.loads(DEFAULT_MODEL.read_text())
    report: dict = {"links": {}}
    targets: list[dict] = []

    def progress(method, row):
        print(f"  {method}: step {row['step_time_s']:.3f} s ({row['wall_s']:.0f} s wall)", file=sys.stderr)

    runs: dict[float, Comparison] = {}
    for gbit in gbits if "1" in parts else ():
        print(
            f"\n== 1. {model['name']}, {gbit:g} Gbit/s: fixed methods and the adaptive controller", flush=True
        )
        switches = None
        with netem.TwoTierNetwork(nodes=2, inter_node_gbit=gbit) as net:
            fixed = tuple(m for m in methods if m != "adaptive")
            run = compare_methods(model, methods=fixed, steps=args.steps, progress=progress, net=net)
            if "adaptive" in methods:
                row, switches = run_spec(net, model, ADAPTIVE, steps=args.steps, gbit=gbit)
                progress("adaptive", row)
                run.methods["adaptive"] = {**row, "switches": len(switches.get("comm_switches", []))}
        add_ratios(run.methods)
        runs[gbit] = run
        print(format_table(run), flush=True)
        print(
            "steady state (median step s of the second half): "
            + ", ".join(f"{m} {r['step_time_steady_s']:.3f}" for m, r in run.methods.items()),
            flush=True,
        )
        if switches is not None:
            print("  adaptive's switches:\n" + "\n".join(switch_lines(switches)), flush=True)
            print(f"  adaptive's levels at the end: {final_levels(switches)}", flush=True)
        report["links"][str(gbit)] = {
            **run.to_dict(),
            "adaptive_switches": (switches or {}).get("comm_switches"),
        }
    targets += speed_targets(runs, args.gbit)

    if "2" in parts:
        spec = dgc_spec(args.steps)
        print(f"\n== 2. DGC-level sparsity, {model['name']}, {args.gbit:g} Gbit/s: {spec}", flush=True)
        with netem.TwoTierNetwork(nodes=2, inter_node_gbit=args.gbit) as net:
            dgc_row, _ = run_spec(net, model, spec, steps=args.steps, gbit=args.gbit)
        dense_bytes = dgc_row["dense_fp32_bytes"]
        reduction = dense_bytes / max(1, dgc_row["bytes_per_rank_per_step"])
        print(
            f"  top-k 0.1 % + momentum correction + warm-up: {dgc_row['bytes_per_rank_per_step']:,} bytes/rank in "
            f"the last step vs {dense_bytes:,} dense fp32 = {reduction:.0f}x fewer; step {dgc_row['step_time_s']:.3f} s",
            flush=True,
        )
        report["dgc"] = {**dgc_row, "bytes_reduction_vs_dense": round(reduction, 1)}
        targets.append(
            _target(
                f"top-k 0.1% + DGC momentum correction + warm-up: >= {DGC_MIN_REDUCTION:.0f}x "
                f"fewer bytes per rank ({model['name']})",
                round(reduction, 1),
                DGC_MIN_REDUCTION,
            )
        )

    if "3" in parts:
        loss_model = json.loads(Path(args.loss_model).read_text())
        print(
            f"\n== 3. loss after {args.loss_steps} steps, {loss_model['name']}, {args.gbit:g} Gbit/s",
            flush=True,
        )
        with netem.TwoTierNetwork(nodes=2, inter_node_gbit=args.gbit) as net:
            loss_run = compare_methods(
                loss_model,
                methods=("dense", "topk_ef"),
                steps=args.loss_steps,
                measure_link=False,
                progress=progress,
                net=net,
            )
            spec = dgc_spec(args.loss_steps)
            loss_run.methods["topk_dgc_0.1%"], _ = run_spec(
                net, loss_model, spec, steps=args.loss_steps, gbit=args.gbit
            )
            row, loss_switches = run_spec(net, loss_model, ADAPTIVE, steps=args.loss_steps, gbit=args.gbit)
            loss_run.methods["adaptive"] = {**row, "switches": len(loss_switches.get("comm_switches", []))}
        add_ratios(loss_run.methods)
        print(format_table(loss_run), flush=True)
        print("  adaptive's switches:\n" + "\n".join(switch_lines(loss_switches)), flush=True)
        report["loss"] = {**loss_run.to_dict(), "adaptive_switches": loss_switches.get("comm_switches")}
        lm, n = loss_run.methods, args.loss_steps
        targets += [
            _target(
                f"top-k+EF 1%: loss after {n} steps within 3% of dense ({loss_model['name']}) "
                "[ratio = |rel diff|, must be <= 0.03]",
                abs(lm["topk_ef"]["loss_rel_diff_vs_dense"]),
                -TOPK_LOSS_TOLERANCE,
            ),
            _target(
                f"top-k 0.1% DGC: loss after {n} steps within 2% of dense [ratio = |rel diff|, <= 0.02]",
                abs(lm["topk_dgc_0.1%"]["loss_rel_diff_vs_dense"]),
                -DGC_LOSS_TOLERANCE,
            ),
            _target(
                f"adaptive: loss after {n} steps within 1% of dense [ratio = |rel diff|, <= 0.01; signed "
                f"{lm['adaptive']['loss_rel_diff_vs_dense']:+.2%}]",
                abs(lm["adaptive"]["loss_rel_diff_vs_dense"]),
                -ADAPTIVE_LOSS_TOLERANCE,
            ),
        ]

    if "4" in parts:
        from comm_order import format_orders, measure_orders

        print(f"\n== 4. bucket order, {model['name']}, {args.gbit:g} Gbit/s", flush=True)
        order = measure_orders(model, gbit=args.gbit, steps=args.steps, bucket_mb=None, rounds=1)
        print(format_orders(order, model_name=model["name"], gbit=args.gbit, steps=args.steps, rounds=1))
        report["order"] = order["rows"]
        targets.append(
            _target(
                "priority order: exposed comm below DDP's reverse order [ratio = reverse / priority exposed]",
                round(1 / max(order["rows"]["priority"]["exposed_vs_reverse"], 1e-9), 3),
                1.0,
            )
        )

    print("\n== targets")
    for t in targets:
        print(f"  {verdict(t['pass']):<8} {t['target']}: measured {t['measured']:g}")
    first = next(iter(runs.values()), None)
    if first is not None and not first.network["latency_emulated"]:
        print(f"  note: {first.network['note']}")
    wall = time.monotonic() - t_start
    print(f"  bench wall time {wall / 60:.1f} min")
    report["targets"] = targets
    report["wall_s"] = round(wall, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
