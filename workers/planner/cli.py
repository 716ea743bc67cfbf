"""``cann-train strategy``.

Exit codes: 0 ok, 2 invalid input (the message names the field), 3 nothing fits (the message names the
tightest constraint).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_INVALID, EXIT_NOTHING_FITS = 0, 2, 3


def register(subparsers) -> None:
    """Add the ``strategy`` subcommand."""
    p = subparsers.add_parser(
        "strategy",
        help="find the fastest parallel layout that fits (or evaluate a fixed one)",
        description="Search tp/pp/dp/ep/cp/vpp/micro-batch/recompute/ZeRO/SP for the fastest plan that fits "
        "in memory. Fields pinned in --strategy are kept; with every field pinned the plan is just evaluated.",
    )
    p.add_argument("--model", required=True, help="model.json")
    p.add_argument("--cluster", required=True, help="cluster.json")
    p.add_argument("--training", required=True, help="training.json")
    p.add_argument("--strategy", help="strategy.json with any subset of fields fixed (null/absent = search)")
    p.add_argument("--top", type=int, default=5, metavar="K", help="plans to list (default 5)")
    p.add_argument(
        "--objective",
        default="throughput",
        metavar="NAME",
        help="rank by throughput (default: tokens/s), memory_headroom (free memory per device), "
        "communication_volume (least bytes per device per step) or energy (tokens per kWh); ties go to "
        "throughput",
    )
    p.add_argument(
        "--max-memory-gib",
        type=float,
        metavar="GIB",
        help="reject plans whose predicted peak memory per device exceeds GIB",
    )
    p.add_argument(
        "--max-bubble-fraction",
        type=float,
        metavar="F",
        help="reject plans whose predicted pipeline bubble exceeds F of the step (0..1)",
    )
    p.add_argument(
        "--lose-nodes",
        type=int,
        default=0,
        metavar="N",
        help="what-if: search the cluster minus N nodes (implies --allow-idle-nodes)",
    )
    p.add_argument(
        "--allow-idle-nodes",
        action="store_true",
        help="when no layout uses every node, use the largest node count that has one (and say so)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--candidates", action="store_true", help="with --json: include the compact candidate list"
    )
    # accepted for compatibility with the seed's command line; all three are always on
    p.add_argument("--auto-search", action="store_true", help="(default) search every unpinned field")
    p.add_argument(
        "--topology-aware", action="store_true", help="(default) cost groups on the links they cross"
    )
    p.add_argument(
        "--moe-balancing", action="store_true", help="(default) scale EP traffic by the MoE imbalance"
    )
    p.set_defaults(func=run_strategy)


class InputError(Exception):
    """A file could not be read or parsed; ``field`` names the argument."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _load_json(path: str, arg: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(arg, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            arg, f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None


def run_strategy(args: argparse.Namespace) -> int:
    from .search import search, search_allowing_idle_nodes, without_nodes
    from .specs import SpecError, Strategy, load_inputs

    try:
        model_d = _load_json(args.model, "--model")
        cluster_d = _load_json(args.cluster, "--cluster")
        training_d = _load_json(args.training, "--training")
        strategy_d = _load_json(args.strategy, "--strategy") if args.strategy else {}
        model, cluster, training = load_inputs(model_d, cluster_d, training_d)
        try:
            fixed = Strategy.from_dict(strategy_d)
        except SpecError as exc:
            raise exc.prefixed("strategy") from None
        if args.top < 1:
            raise InputError("--top", f"must be >= 1, got {args.top}")
        if args.lose_nodes:
            cluster = without_nodes(cluster, args.lose_nodes)
        ranking = {
            "objective": args.objective,
            "constraints": {
                "max_memory_GiB_per_device": args.max_memory_gib,
                "max_bubble_fraction": args.max_bubble_fraction,
            },
        }
        if args.lose_nodes or args.allow_idle_nodes:
            result, cluster = search_allowing_idle_nodes(
                model, cluster, training, fixed=fixed, top_k=args.top, **ranking
            )
        else:
            result = search(model, cluster, training, fixed, top_k=args.top, **ranking)
    except InputError as exc:
        print(f"cann-train strategy: invalid input: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except SpecError as exc:
        print(f"cann-train strategy: invalid input: {exc}", file=sys.stderr)
        return EXIT_INVALID

    if args.json:
        print(json.dumps(result.to_dict(with_candidates=args.candidates), indent=1))
    else:
        print(format_result(result, model, cluster, training))
    if result.best is None:
        print(f"cann-train strategy: nothing fits: {result.stats['tightest']}", file=sys.stderr)
        return EXIT_NOTHING_FITS
    return EXIT_OK


def _layout(s) -> str:
    return (
        f"{s.tp:>3} {s.pp:>3} {s.dp:>4} {s.ep:>3} {s.cp:>3} {s.vpp:>3} {s.micro_batch_size:>4} "
        f"{s.recompute[:4]:>4} {s.zero_stage:>4} {'y' if s.sequence_parallel else 'n':>2}"
    )


def format_result(result, model, cluster, training) -> str:
    """The human-readable table of the top plans and the breakdown of the best."""
    st = result.stats
    params = model.parameter_count()["total"]
    lines = [
        f"{model.name} ({params / 1e9:,.1f}B params{', MoE' if model.moe else ''}) on {cluster.name}: "
        f"{cluster.num_devices} x {cluster.device.name}, global batch {training.global_batch_size} x "
        f"{model.seq_length} tokens, {training.dtype}",
        f"searched {st['evaluated']:,} layouts in {st['seconds']:.2f} s: {st['feasible']:,} fit"
        + (f", Pareto front {st.get('pareto_size', 0)}" if result.best else "")
        + (" (cancelled)" if st.get("cancelled") else ""),
    ]
    if st.get("objective", "throughput") != "throughput" or st.get("constraints"):
        limits = ", ".join(f"{k} <= {v:g}" for k, v in st.get("constraints", {}).items())
        lines.append(
            f"ranked by {st.get('objective', 'throughput')}" + (f"; limits: {limits}" if limits else "")
        )
    if st.get("note"):
        lines.append(f"note: {st['note']}")
    if st["rejected"]:
        lines.append("rejected: " + "; ".join(f"{k}: {v:,}" for k, v in st["rejected"].items()))
    if result.best is None:
        return "\n".join(lines)  # the tightest constraint goes to stderr with exit code 3
    lines.append("")
    head = (
        f"{'#':>2}  {'tp':>3} {'pp':>3} {'dp':>4} {'ep':>3} {'cp':>3} {'vpp':>3} {'mbs':>4} {'rcmp':>4} {'zero':>4} "
        f"{'sp':>2} | {'step s':>8} {'tokens/s':>11} {'MFU':>5} {'mem GiB':>7} {'bubble':>6} {'exp.comm s':>10}"
    )
    lines.append(head)
    lines.append("-" * len(head))
    for i, plan in enumerate(result.top, 1):
        p = plan.predicted
        lines.append(
            f"{i:>2}  {_layout(plan.strategy)} | {p['step_time_s']:8.3f} {p['tokens_per_s']:11,.0f} "
            f"{p['mfu']:5.3f} {p['memory_GiB_per_device']['total']:7.1f} {p['bubble_fraction']:6.3f} "
            f"{p['exposed_comm_s']:10.3f}"
        )
    p = result.best.predicted
    m = p["memory_GiB_per_device"]
    c = p["comm_s"]
    lines += [
        "",
        "best plan breakdown:",
        f"  step {p['step_time_s']:.3f} s = compute {p['compute_s']:.3f} + TP/CP/EP comm {p['inline_comm_s']:.3f} "
        f"+ bubble {p['bubble_s']:.3f} + PP p2p {c['pp']:.3f} + DP exposed {p['dp_exposed_s']:.3f} "
        f"+ optimizer {p['optimizer_s']:.3f}  ({p['num_micro_batches']} micro-batches per replica)",
        f"  throughput {p['tokens_per_s']:,.0f} tokens/s; model {p['model_tflops_per_device']:.1f} TFLOP/s/device "
        f"(MFU {p['mfu']:.3f}), hardware {p['hardware_tflops_per_device']:.1f} TFLOP/s/device with recompute",
        f"  memory/device GiB: params {m['params']:.2f}, grads {m['grads']:.2f}, optimizer {m['optimizer']:.2f}, "
        f"activations {m['activations']:.2f}, total {m['total']:.2f} of {cluster.device.memory_GiB:g} "
        f"(headroom {p['memory_headroom_GiB']:.2f})",
        f"  comm s: tp {c['tp']:.3f}, pp {c['pp']:.3f}, dp {c['dp']:.3f}, ep {c['ep']:.3f}, cp {c['cp']:.3f}; "
        f"exposed {p['exposed_comm_s']:.3f}; {p['comm_volume_GB_per_device']:.1f} GB/device/step",
        f"  bubble fraction {p['bubble_fraction']:.3f}; scaling efficiency "
        + (
            f"{p['scaling_efficiency']:.3f} (per-device throughput vs the smallest device count that fits)"
            if p.get("scaling_efficiency") is not None
            else p.get("scaling_efficiency_note", "not computed")
        ),
    ]
    if place := p.get("placement"):
        blind = place.get("topology_blind") or {}
        lines.append(
            f"  placement {place['order']}: {place['cross_switch_GB_per_step']:.3f} GB/device/step across "
            f"switches; topology-blind {blind.get('order')}: {blind.get('cross_switch_GB_per_step', 0):.3f} GB, "
            f"{blind.get('step_time_s', 0):.3f} s/step" + (f" ({place['note']})" if place.get("note") else "")
        )
    if (split := result.best.strategy.layers_per_stage) is not None:
        from .search import stage_split_text

        lines.append(
            f"  layers per stage (first to last): {stage_split_text(split)}; step time and memory are the "
            "slowest and the largest stage's"
        )
    return "\n".join(lines)
