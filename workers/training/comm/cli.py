"""``cann-train comm-opt``: compare gradient-communication methods on the emulated two-tier network.

Runs the same model and data under each method (real runtime, one torchrun agent per emulated node) and
prints, per method: gradient bytes sent per rank per step, communication time (exposed / total), step
time, tokens/s and the loss after N steps, each next to dense. Needs root and iproute2 (network
namespaces). Exit codes: 0 ok, 2 invalid input, 3 the emulated network cannot be built here, 1 a run
failed.

The seed's flags map onto these: ``--gradient-bucketing`` = DDP bucket size chosen from the link (the
default; ``--bucket-cap-mb`` overrides), ``--adaptive-compression`` = top-k density warm-up (25 % ->
``--density`` over the first fifth of the steps), ``--overlap`` = exposed vs total comm time (always
reported).
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    from workers.training.comm.compare import DEFAULT_MODEL
    from workers.training.comm_methods import COMPARE_DEFAULT_METHODS, COMPARE_METHODS

    p = subparsers.add_parser(
        "comm-opt",
        help="compare gradient compression / hierarchical all-reduce on an emulated network",
        description=__doc__.splitlines()[0],
    )
    src = p.add_argument_group("what to train (default: dp only, ZeRO-0: DDP comm hooks)")
    src.add_argument("--plan", help="plan.json: its 'model' (and micro_batch_size)")
    src.add_argument("--model", help=f"model.json (default: {DEFAULT_MODEL.name}, 20.7M params)")
    src.add_argument("--micro-batch-size", type=int, help="sequences per rank per step (default 1)")
    src.add_argument(
        "--strategy",
        help="S.json: any subset of the strategy fields (tp, pp, cp, ep, zero_stage, sequence_parallel, ...; "
        "a plan's or an example's 'strategy' object also works); dp = nodes x ranks-per-node / (tp*pp*cp). "
        "Every method runs under that layout",
    )
    net = p.add_argument_group("emulated network")
    net.add_argument("--nodes", type=int, default=2)
    net.add_argument("--ranks-per-node", type=int, default=2)
    net.add_argument("--inter-node-gbit", type=float, default=1.0, help="per-node uplink, Gbit/s (default 1)")
    run = p.add_argument_group("comparison")
    run.add_argument(
        "--methods",
        default=",".join(COMPARE_DEFAULT_METHODS),
        help=f"comma-separated, from {','.join(COMPARE_METHODS)} (default: %(default)s)",
    )
    run.add_argument("--steps", type=int, default=20)
    run.add_argument("--density", type=float, default=0.01, help="top-k density (default 0.01)")
    run.add_argument("--bucket-cap-mb", type=float, help="DDP bucket size (default: chosen from the link)")
    run.add_argument("--lr", type=float)
    run.add_argument("--timeout", type=float, default=900, help="seconds per method before it is stopped")
    run.add_argument(
        "--gradient-bucketing", action="store_true", help="(seed flag) bucket size from the link"
    )
    run.add_argument("--adaptive-compression", action="store_true", help="(seed flag) top-k density warm-up")
    run.add_argument("--overlap", action="store_true", help="(seed flag) exposed vs total comm: always shown")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=comm_opt_command)


def _model_from_args(args) -> tuple[dict, int]:
    from workers.training.comm.compare import DEFAULT_MODEL
    from workers.training.config import ConfigError, parse_model, read_json, strategy_from_plan

    micro = args.micro_batch_size
    model = None
    if args.plan:
        plan = read_json(args.plan, "plan")
        strategy = strategy_from_plan(plan)
        model = plan.get("model")
        if micro is None:
            micro = int(strategy.get("micro_batch_size") or 1)
    if args.model:
        model = read_json(args.model, "model")
    if model is None:
        if args.plan:
            raise ConfigError("--model", "required (the plan has no 'model')")
        model = read_json(DEFAULT_MODEL, "model")
    parse_model(model)  # names the bad field
    return model, micro or 1


def _strategy_from_args(args) -> dict | None:
    """The ``--strategy`` file's fields (a bare strategy object, or a document with a 'strategy' object:
    a plan or a runtime example)."""
    from workers.training.config import ConfigError, read_json

    if not args.strategy:
        return None
    doc = read_json(args.strategy, "strategy")
    if isinstance(doc, dict) and isinstance(doc.get("strategy"), dict):
        doc = doc["strategy"]
    if not isinstance(doc, dict):
        raise ConfigError("strategy", f"{args.strategy} must hold a JSON object of strategy fields")
    return doc


def comm_opt_command(args: argparse.Namespace) -> int:
    from workers.training.comm import netem
    from workers.training.comm.compare import compare_methods, format_table
    from workers.training.comm_methods import COMPARE_METHODS
    from workers.training.config import ConfigError

    try:
        model, micro = _model_from_args(args)
        methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
        unknown = [m for m in methods if m not in COMPARE_METHODS]
        if unknown or not methods:
            raise ConfigError("--methods", f"unknown {unknown}; choose from {', '.join(COMPARE_METHODS)}")
        if args.nodes < 2 or args.ranks_per_node < 1:
            raise ConfigError("--nodes", "need at least 2 nodes and 1 rank per node")
        if args.steps < 2:
            raise ConfigError("--steps", "need at least 2 steps (the first one is not timed)")
        if not 0 < args.density <= 1:
            raise ConfigError("--density", f"must be in (0, 1], got {args.density}")
        if args.inter_node_gbit <= 0:
            raise ConfigError("--inter-node-gbit", "must be > 0")
        strategy = _strategy_from_args(args)
        if strategy is not None:  # the runtime's own validation of each method's layout: exit 2 on a bad one
            from workers.training.comm.compare import check_layouts

            check_layouts(
                model,
                methods,
                world_size=args.nodes * args.ranks_per_node,
                ranks_per_node=args.ranks_per_node,
                density=args.density,
                steps=args.steps,
                micro_batch_size=micro,
                inter_node_gbit=args.inter_node_gbit,
                strategy=strategy,
            )
    except ConfigError as exc:
        print(f"cann-train comm-opt: invalid input: {exc}", file=sys.stderr)
        return 2
    reason = netem.unavailable_reason()
    if reason:
        print(f"cann-train comm-opt: cannot build the emulated network: {reason}", file=sys.stderr)
        return 3

    def progress(method, row):
        if not args.json:
            print(
                f"  {method}: step {row['step_time_s']:.3f} s, loss {row['loss_last']:.4f}", file=sys.stderr
            )

    try:
        result = compare_methods(
            model,
            nodes=args.nodes,
            ranks_per_node=args.ranks_per_node,
            inter_node_gbit=args.inter_node_gbit,
            methods=methods,
            steps=args.steps,
            density=args.density,
            warmup_steps=max(1, args.steps // 5) if args.adaptive_compression else 0,
            micro_batch_size=micro,
            bucket_cap_mb=args.bucket_cap_mb,
            lr=args.lr,
            timeout=args.timeout,
            progress=progress,
            strategy=strategy,
        )
    except ConfigError as exc:
        print(f"cann-train comm-opt: invalid input: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, netem.NetworkUnavailable) as exc:
        print(f"cann-train comm-opt: run failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_dict()) if args.json else format_table(result))
    return 0
