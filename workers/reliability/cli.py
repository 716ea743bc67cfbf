"""``cann-train elastic``: train under faults and show what recovery cost, beside a run without faults.

Runs the job twice on this machine under torchrun (c10d rendezvous): once without faults (the reference,
same seed and data order) and once with ``--inject``'s faults, recovering by ``--recovery``:

- ``restart`` (default): torchrun restarts every rank (``--max-restarts``) and they continue from the newest
  good snapshot; the loss at every step must equal the reference's (bitwise for DDP on CPU).
- ``hot-swap``: data-parallel replicas under torchft; the survivors keep stepping while the killed replica
  is restarted and fetches the weights from a peer (its loss is compared, not required to be equal).

Exit codes: 0 ok, 2 invalid input (the message names the flag), 1 the run failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

LOSS_TOLERANCE = 1e-5
"""Relative loss difference still called a match for layouts whose reductions reorder (docs/elastic.md
measured at most 7.2e-7 absolute on losses around 5 when resharding)."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "elastic",
        help="train with injected faults, recover, and compare with a run without faults",
        description=__doc__.splitlines()[0],
    )
    from workers.training.cli import add_job_arguments
    from workers.training.options import add_option_flags

    run = add_job_arguments(p, steps=40)
    run.add_argument("--timeout", type=float, default=1800, help="seconds before each run is stopped")
    el = p.add_argument_group("recovery")
    el.add_argument("--recovery", choices=["restart", "hot-swap"], default="restart")
    el.add_argument(
        "--incremental",
        action="store_true",
        help="a full snapshot every 4, lossless deltas in between (default: every snapshot full)",
    )
    # the snapshot flags' help and bounds are the options table's (workers/training/options.py); this
    # command's defaults: a snapshot every 5 steps, deltas (with --incremental) XOR
    add_option_flags(
        el,
        ["snapshot_every", "snapshot_delta", "snapshot_keep", "snapshot_memory_every", "snapshot_dir"],
        defaults={
            "snapshot_every": 5,
            "snapshot_delta": "xor",
            "snapshot_keep": 3,
            "snapshot_memory_every": 0,
        },
    )
    el.add_argument("--max-restarts", type=int, default=10, help="torchrun restarts allowed (restart)")
    el.add_argument(
        "--hang-timeout", type=float, default=10.0, help="seconds without a committed step that mean a hang"
    )
    el.add_argument(
        "--inject",
        default="",
        help="faults, e.g. kill-rank@step=17,hang-rank@step=40,corrupt-snapshot@step=30 "
        "(workers/reliability/faults.py; hot-swap: kill-rank only; not drop-link, which needs the emulated "
        "two-tier network)",
    )
    el.add_argument("--no-reference", action="store_true", help="skip the run without faults")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(
        func=elastic_command,
        profile_every=0,
        job_id=None,
        redis_url=None,
        snapshot_full_every=None,
        resume=False,
    )


def run_elastic(
    cfg,
    nproc: int,
    *,
    run_dir: Path,
    max_restarts: int,
    hang_timeout_s: float,
    inject: str = "",
    timeout: float = 1800,
) -> dict:
    """Run ``cfg`` on this machine under torchrun with restarts and an :class:`ElasticWatch`; returns
    ``{"exit_code", "summary" (rank 0's, of the last restart), "report" (the watch's)}``."""
    from workers.reliability.elastic import ElasticWatch
    from workers.reliability.faults import FaultInjector
    from workers.training.launch import free_port, render_torchrun_command, torchrun_env

    run_dir.mkdir(parents=True, exist_ok=True)
    config_path, summary_path, log = run_dir / "job.json", run_dir / "summary.json", run_dir / "torchrun.log"
    cfg.save(config_path)
    summary_path.unlink(missing_ok=True)
    snapshot_dir = Path(cfg.snapshot_dir) if cfg.snapshot_dir else None
    injector = FaultInjector(inject, world_size=nproc, snapshot_dir=snapshot_dir) if inject else None
    watch = ElasticWatch(run_dir, hang_timeout_s=hang_timeout_s, snapshot_dir=snapshot_dir, injector=injector)
    cmd = render_torchrun_command(
        str(config_path),
        nnodes=1,
        nproc_per_node=nproc,
        node_rank=0,
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        run_id=uuid.uuid4().hex[:12],
        max_restarts=max_restarts,
        summary_path=str(summary_path),
        warm=True,
    )
    return run_watched(
        cmd, log=log, env=torchrun_env(), watch=watch, summary_path=summary_path, timeout=timeout
    )


def run_watched(
    cmd: list[str], *, log: Path, env: dict, watch, summary_path: Path, timeout: float, cwd=None
) -> dict:
    """A node's torchrun ``cmd`` on this machine under the supervisor, ``watch`` (an :class:`ElasticWatch`)
    polling it, its output in ``log``: ``{"exit_code", "timed_out", "log_tail", "summary" (rank 0's, of the last
    restart, from ``summary_path``), "report" (the watch's), "all_snapshots", "timeline"}``. ``cann-train
    elastic`` (our runtime) and ``cann-train launch`` (a user's script) both run this way."""
    from workers.training.supervision.supervisor import supervise

    env = {**env, **watch.env}
    env.setdefault("OMP_NUM_THREADS", "1")
    log.write_bytes(b"")
    outcome = supervise(
        cmd, log_path=log, env=env, cwd=cwd, timeout_s=timeout, on_poll=watch.poll, poll_every_s=0.1
    )
    watch.finish()
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return {
        "exit_code": outcome.exit_code,
        "timed_out": outcome.timed_out,
        "log_tail": outcome.log_tail,
        "summary": summary,
        "report": watch.report(),
        "all_snapshots": watch.snapshots_seen,
        "timeline": watch.timeline.events,  # rank 0's timeline as the watch read it (no second read)
    }


def compare_losses(losses: dict[int, float], reference: dict[int, float]) -> dict:
    common = sorted(set(losses) & set(reference))
    diffs = [abs(losses[s] - reference[s]) for s in common]
    worst = max(diffs, default=None)
    scale = max((abs(reference[s]) for s in common), default=1.0)
    return {
        "steps_compared": len(common),
        "loss_max_abs_diff": worst,
        "loss_bitwise_equal": bool(common) and all(losses[s] == reference[s] for s in common),
        "loss_matches_reference": bool(common) and worst <= LOSS_TOLERANCE * max(1.0, scale),
    }


def snapshot_figures(snapshots: list[dict], stalls_s: list[float]) -> dict:
    full = [s["bytes_written"] for s in snapshots if s.get("kind") == "full" and s.get("bytes_written")]
    delta = [  # XOR deltas and gradient logs: what is written between two full snapshots
        s["bytes_written"] for s in snapshots if s.get("kind") in ("delta", "log") and s.get("bytes_written")
    ]
    return {
        "count": len(snapshots),
        "stall_ms_median": round(statistics.median(stalls_s) * 1000, 3) if stalls_s else None,
        "bytes_full": max(full) if full else None,
        "bytes_delta_median": int(statistics.median(delta)) if delta else None,
    }


def elastic_result(run: dict, reference: dict | None, *, recovery: str) -> dict:
    """The ``--json`` document of a restart-recovery run (and its reference)."""
    report = run["report"]
    events = report.get("timeline", [])
    stalls = [e["stall_s"] for e in events if e.get("event") == "step" and e.get("stall_s")]
    losses = {int(k): v for k, v in report["losses"].items()}
    faults = [
        {
            "kind": f["kind"],
            "step": f["step"],
            "rto_s": f.get("rto_s"),
            "steps_lost": f.get("steps_lost"),
            "resumed_from_step": f.get("resumed_from_step"),
            "tier": f.get("tier"),
            "skipped": f.get("skipped", []),
            "message": f["message"],
            "at_unix": f["fault_unix"],
        }
        for f in report["faults"]
    ] + [
        {
            "kind": e["kind"],
            "step": e["step"],
            "rto_s": None,
            "steps_lost": 0,
            "message": e["detail"],
            "at_unix": e["fired_unix"],
        }  # fmt: skip
        for e in report["events"]
    ]
    out = {
        "recovery": recovery,
        "steps": max(losses) if losses else 0,
        "restarts": report["restarts"],
        "faults": sorted(faults, key=lambda f: f["at_unix"]),
        "snapshots": snapshot_figures(run["all_snapshots"], stalls),
        "goodput": report["goodput"]["goodput"],
        "goodput_detail": report["goodput"],
        "loss_last": losses[max(losses)] if losses else None,
        "faults_not_fired": report.get("faults_not_fired", []),
    }
    if reference is not None:
        ref = {int(k): v for k, v in reference["report"]["losses"].items()}
        out["reference_loss_last"] = ref[max(ref)] if ref else None
        out.update(compare_losses(losses, ref))
        out["reference_goodput"] = reference["report"]["goodput"]["goodput"]
    return out


def elastic_command(args: argparse.Namespace) -> int:
    from workers.training.cli import build_job_config
    from workers.training.config import ConfigError
    from workers.training.supervision.fault_plan import DROP_LINK_NEEDS_NETEM, parse_faults

    try:
        for flag in ("steps", "max_restarts"):
            if getattr(args, flag) < (1 if flag == "steps" else 0):
                raise ConfigError(f"--{flag.replace('_', '-')}", f"must be >= 0, got {getattr(args, flag)}")
        if args.hang_timeout <= 0:
            raise ConfigError("--hang-timeout", f"must be > 0 seconds, got {args.hang_timeout}")
        try:
            faults = parse_faults(args.inject)
        except ValueError as exc:
            raise ConfigError("--inject", str(exc)) from None
        if any(f.kind == "drop-link" for f in faults):
            raise ConfigError(
                "--inject", DROP_LINK_NEEDS_NETEM + "; this command runs every rank on this machine"
            )
        if args.recovery == "hot-swap" and any(f.kind != "kill-rank" for f in faults):
            raise ConfigError("--inject", "hot-swap recovery takes kill-rank faults only")
        if args.recovery == "restart" and faults and not args.snapshot_every:
            raise ConfigError("--snapshot-every", "restart recovery needs snapshots (K >= 1)")
        # the snapshot flags are this command's to apply (the reference runs without snapshots)
        plain = argparse.Namespace(
            **{
                **vars(args),
                "snapshot_every": None,
                "snapshot_keep": None,
                "snapshot_dir": None,
                "snapshot_memory_every": None,
                "snapshot_delta": None,
            }
        )
        base = build_job_config(plain)
        nproc = args.nproc if args.nproc is not None else base.world_size
        if nproc != base.world_size:
            raise ConfigError("--nproc", f"the strategy needs {base.world_size} processes, got {nproc}")
    except ConfigError as exc:
        print(f"cann-train elastic: invalid input: {exc}", file=sys.stderr)
        return 2
    if args.recovery == "hot-swap":
        return _hot_swap(args, base, nproc, faults)
    with tempfile.TemporaryDirectory(prefix="cann-train-elastic-") as tmp:
        root = Path(tmp)
        snapshot_dir = Path(args.snapshot_dir) if args.snapshot_dir else root / "snapshots"
        cfg = _with(
            base,
            snapshot_every=args.snapshot_every,
            snapshot_dir=str(snapshot_dir),
            snapshot_full_every=4 if args.incremental else 1,
            snapshot_delta=args.snapshot_delta,
            snapshot_keep=args.snapshot_keep,
            snapshot_memory_every=args.snapshot_memory_every,
        )
        reference = None
        t0 = time.monotonic()
        if not args.no_reference:
            ref_cfg = _with(base, snapshot_every=0, snapshot_dir=None)
            reference = run_elastic(
                ref_cfg,
                nproc,
                run_dir=root / "reference",
                max_restarts=0,
                hang_timeout_s=args.hang_timeout,
                timeout=args.timeout,
            )
            if reference["exit_code"] != 0:
                print(
                    f"cann-train elastic: the reference run failed:\n{reference['log_tail']}", file=sys.stderr
                )
                return 1
        run = run_elastic(
            cfg,
            nproc,
            run_dir=root / "faulty",
            max_restarts=args.max_restarts,
            hang_timeout_s=args.hang_timeout,
            inject=args.inject,
            timeout=args.timeout,
        )
        run["report"]["timeline"] = run["timeline"]
        result = elastic_result(run, reference, recovery="restart")
        result["wall_s"] = round(time.monotonic() - t0, 2)
        if run["exit_code"] != 0:
            result["error"] = (
                f"the run failed (exit {run['exit_code']}) after {result['restarts']} restart(s)"
            )
            print(json.dumps(result) if args.json else format_result(result))
            print(run["log_tail"], file=sys.stderr)
            return 1
    print(json.dumps(result) if args.json else format_result(result))
    return 0


def _with(cfg, **changes):
    """``cfg`` with ``changes``, validated again (``JobConfig`` is immutable in spirit)."""
    from workers.training.config import JobConfig

    return JobConfig.from_dict({**cfg.to_dict(), **changes})


def _hot_swap(args, cfg, nproc: int, faults) -> int:
    try:
        from workers.reliability.hotswap import run_hot_swap
    except ImportError:
        print("cann-train elastic: hot-swap recovery is not built in this checkout", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cann-train-hotswap-") as tmp:
        try:
            result = run_hot_swap(
                cfg,
                nproc,
                steps=args.steps,
                inject=[("kill-replica", f.step) for f in faults],
                run_dir=Path(tmp),
                timeout_s=args.timeout,
            )
        except ValueError as exc:
            print(f"cann-train elastic: invalid input: {exc}", file=sys.stderr)
            return 2
    result["recovery"] = "hot-swap"
    print(json.dumps(result) if args.json else format_hot_swap(result))
    return 0


def format_hot_swap(r: dict) -> str:
    rows = [f"{r['steps']} steps on {r['replicas']} replicas, recovery hot-swap"]
    for f in r["faults"]:
        rto = f"{f['rto_s']:.2f} s" if f.get("rto_s") is not None else "-"
        back = f"{f['rejoin_s']:.2f} s" if f.get("rejoin_s") is not None else "not back before the end"
        rows.append(
            f"  replica {f['replica']} killed at step {f['step']}: survivors' next committed step after {rto}, "
            f"replica back after {back}, {f['steps_lost']} step(s) lost"
        )
    g = r.get("goodput") or {}
    if g.get("goodput") is not None:
        rows.append(f"  goodput {g['goodput']:.1%} of {g['wall_s']:.1f} s")
    rows.append(
        f"  loss {r['loss_last']:.6f}; state checksums equal after the rejoin: {r['checksums_equal_after_rejoin']}"
    )
    return "\n".join(rows)


def format_result(r: dict) -> str:
    rows = [f"{r['steps']} steps, {r['restarts']} restart(s), recovery {r['recovery']}"]
    for f in r["faults"]:
        rto = (
            f"recovered in {f['rto_s']:.2f} s, {f['steps_lost']} step(s) lost"
            if f.get("rto_s") is not None
            else ""
        )
        rows.append(f"  fault {f['kind']:<18} at step {f['step']}: {rto}  ({f['message']})")
    for fault in r.get("faults_not_fired", []):
        rows.append(f"  fault {fault} never fired: the run ended before the injector saw its step")
    s = r["snapshots"]
    if s["count"]:
        rows.append(
            f"  snapshots {s['count']}, stall {s['stall_ms_median']} ms median, full {s['bytes_full']:,} B"
            + (f", delta {s['bytes_delta_median']:,} B (median)" if s["bytes_delta_median"] else "")
        )
    g = r["goodput_detail"]
    rows.append(
        f"  goodput {r['goodput']:.1%} of {g['wall_s']:.1f} s: "
        + ", ".join(f"{k[:-2].replace('_', ' ')} {v:.2f} s" for k, v in g["badput"].items())
    )
    if "reference_loss_last" in r:
        same = "bitwise equal" if r["loss_bitwise_equal"] else f"max diff {r['loss_max_abs_diff']:.2e}"
        rows.append(
            f"  loss {r['loss_last']:.6f} vs {r['reference_loss_last']:.6f} without faults "
            f"({r['steps_compared']} steps compared, {same})"
        )
    return "\n".join(rows)
