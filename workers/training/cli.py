"""``cann-train train``: run the training runtime on this machine, without the control plane.

Writes the job config to a temporary file and starts ``torchrun`` (c10d rendezvous on a free local port,
the same command the control plane renders) with ``--nproc`` processes, then prints a summary. Exit codes:
0 ok, 2 invalid input (the message names the field), 1 the run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import uuid
from pathlib import Path

from workers.training import examples
from workers.training.options import add_option_flags, options_from_args
from workers.training.run_inputs import check_run_inputs

EXAMPLES = examples.DIR
SNAPSHOT_FLAGS = [
    "snapshot_every",
    "snapshot_dir",
    "snapshot_full_every",
    "snapshot_delta",
    "snapshot_keep",
    "snapshot_memory_every",
    "resume",
]
# the run options the job's flags may give (their flags, help and bounds: workers/training/options.py)
HF_FLAGS = ["hf_model", "tokenizer", "data_field", "val_fraction", "val_every", "save_hf"]
JOB_FLAGS = [
    "data",
    "steps",
    "lr",
    "seed",
    "device",
    "comm_hook",
    "profile_every",
    *HF_FLAGS,
    *SNAPSHOT_FLAGS,
]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="run training locally under torchrun and print a summary",
        description=__doc__.splitlines()[0],
    )
    run = add_job_arguments(p, steps=10)
    add_option_flags(run, ["profile_every"], defaults={"profile_every": 5})
    run.add_argument("--job-id", default=os.environ.get("CANN_TRAIN_JOB_ID"), help="publish to job/<id>")
    run.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    run.add_argument("--timeout", type=float, default=3600, help="seconds before the run is stopped")
    snap = p.add_argument_group("snapshots (asynchronous, incremental; docs/elastic.md)")
    add_option_flags(snap, SNAPSHOT_FLAGS)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=train_command)


def add_job_arguments(p: argparse.ArgumentParser, *, steps: int):
    """What to train and the run's basic flags (``train`` and ``elastic`` share them); returns the "run"
    argument group for the command's own run flags."""
    src = p.add_argument_group("what to train")
    src.add_argument("--plan", help="plan.json (its 'strategy'; its 'model' if present, else --model)")
    src.add_argument("--strategy", help="strategy.json")
    src.add_argument("--model", help=f"model.json (tiny examples: {EXAMPLES}/tiny-*.json)")
    src.add_argument("--training", help="training.json (global_batch_size, dtype, optimizer)")
    add_option_flags(src, ["hf_model"], notes={"hf_model": "without --model, the model is its config's"})
    src.add_argument("--seq-length", type=int, help="overrides model.seq_length (the training sequence)")
    add_option_flags(src, ["data", "tokenizer", "data_field", "val_fraction", "val_every"])
    run = p.add_argument_group("run")
    add_option_flags(run, ["steps"], defaults={"steps": steps})
    run.add_argument("--nproc", type=int, help="processes (default: tp*pp*dp*cp of the strategy)")
    run.add_argument("--global-batch-size", type=int, help="overrides training.global_batch_size")
    add_option_flags(run, ["lr", "seed", "device", "comm_hook", "save_hf"])
    return run


def build_job_config(args: argparse.Namespace):
    """The ``JobConfig`` these flags describe (raises ``ConfigError`` naming the field)."""
    from workers.training.config import ConfigError, JobConfig, read_json, strategy_from_plan

    model = None
    if args.plan:
        if args.strategy:
            raise ConfigError("--strategy", "give either --plan or --strategy, not both")
        plan = read_json(args.plan, "plan")
        strategy = strategy_from_plan(plan)
        model = plan.get("model") if isinstance(plan, dict) else None
    elif args.strategy:
        strategy = read_json(args.strategy, "strategy")
    else:
        raise ConfigError("--strategy", "one of --plan or --strategy is required")
    if args.model:
        model = read_json(args.model, "model")
    hf_model, seq_length = getattr(args, "hf_model", None), getattr(args, "seq_length", None)
    if model is None and hf_model:
        model = _model_of_checkpoint(hf_model, seq_length)
    if model is None:
        raise ConfigError("--model", "required (the plan has no 'model'; or give --hf-model)")
    if seq_length is not None and isinstance(model, dict):
        model = {**model, "seq_length": seq_length}
    training = read_json(args.training, "training") if args.training else {}
    if not isinstance(training, dict):
        raise ConfigError("training", "must be a JSON object")
    if args.global_batch_size is not None:
        training = {**training, "global_batch_size": args.global_batch_size}
    config = {"model": model, "strategy": strategy, "training": training}
    # every option a flag of this command gave (the table's: workers/training/options.py)
    config.update(options_from_args(args, [name for name in JOB_FLAGS if name in vars(args)]))
    if args.job_id and args.redis_url:
        config["job_id"], config["redis_url"] = str(args.job_id), args.redis_url
    if args.data is not None and not Path(args.data).exists():
        raise ConfigError("--data", f"{args.data} does not exist")
    cfg = JobConfig.from_dict(config)
    check_run_inputs(cfg)
    return cfg


def _model_of_checkpoint(directory: str, seq_length: int | None) -> dict:
    from workers.planner.specs import SpecError
    from workers.planner.specs.hf import spec_from_hf_config
    from workers.training.config import ConfigError

    try:
        return spec_from_hf_config(directory, seq_length=seq_length).to_dict()
    except SpecError as exc:
        raise ConfigError(exc.prefixed("hf_model").errors) from None


def run_local(
    cfg, nproc: int, *, timeout: float = 3600, log_path: str | None = None, warm: bool = True
) -> dict:
    """Run ``cfg`` under torchrun on this machine; returns rank 0's summary. Raises ``RuntimeError``
    with the tail of the log when the run fails. ``warm``: torchrun's agent as ``workers.training.supervision.agent``
    runs it, forking the ranks from one import of the runtime instead of starting each as a new
    interpreter (``import workers.training.trainer`` is ~4 s of CPU here, paid once instead of per rank)."""
    from workers.training.launch import free_port, render_torchrun_command, torchrun_env
    from workers.training.supervision.supervisor import supervise

    with tempfile.TemporaryDirectory(prefix="cann-train-") as tmp:
        config_path, summary_path = Path(tmp) / "job.json", Path(tmp) / "summary.json"
        log = Path(log_path) if log_path else Path(tmp) / "torchrun.log"
        cfg.save(config_path)
        cmd = render_torchrun_command(
            str(config_path),
            nnodes=1,
            nproc_per_node=nproc,
            node_rank=0,
            rdzv_endpoint=f"127.0.0.1:{free_port()}",
            run_id=uuid.uuid4().hex[:12],
            max_restarts=0,
            warm=warm,
            summary_path=str(summary_path),
        )
        env = torchrun_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        log.write_bytes(b"")
        # the same supervisor as the web's workers: the ranks run in their own process group, which a
        # timeout or Ctrl-C stops as a whole (no orphan ranks)
        outcome = supervise(cmd, log_path=log, env=env, timeout_s=timeout)
        if outcome.timed_out:
            raise RuntimeError(f"run stopped after {timeout:.0f} s\n{_tail(log)}")
        if outcome.exit_code != 0 or not summary_path.exists():
            raise RuntimeError(f"torchrun exited with {outcome.exit_code}\n{_tail(log)}")
        return json.loads(summary_path.read_text())


_EXCEPTION_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Snapshot)): (.+)$"
)


def _tail(path: Path, lines: int = 25) -> str:
    """The log's last lines, after the first exception a rank raised (torchrun's own report of the failure
    comes last and would push it out)."""
    text = [ln for ln in path.read_text(errors="replace").splitlines() if "FutureWarning" not in ln]
    cause = next(
        (ln for ln in text if (m := _EXCEPTION_LINE.match(ln)) and "ChildFailedError" not in m.group(1)), None
    )
    return "\n".join(([f"first error: {cause}"] if cause else []) + text[-lines:])


def format_summary(s: dict) -> str:
    if not s.get("steps"):
        return f"{s['model']} on {s['world_size']} x {s['device']} ({s['strategy']}): {s.get('note', 'no steps')}"
    rows = [
        f"trained {s['model']} on {s['world_size']} x {s['device']} ({s['strategy']}), {s['steps']} steps",
        f"  loss          {s['loss_first']:.4f} -> {s['loss_last']:.4f}"
        + (f"   (validation {s['val_loss']:.4f})" if s.get("val_loss") is not None else ""),
        f"  tokens/s      {s['tokens_per_s']:.0f}   ({s['tokens_per_step']} tokens/step)",
        f"  step time     {s['step_time_s'] * 1000:.1f} ms",
    ]
    if "comm_s" in s:
        rows.append(
            f"  compute/comm  {s['compute_s'] * 1000:.1f} / {s['comm_s'] * 1000:.1f} ms (profiled step)"
        )
    if s.get("bubble_fraction"):
        rows.append(f"  bubble        {s['bubble_fraction']:.1%} (ideal schedule)")
    rows.append(f"  grad norm     {s['grad_norm_last']:.4f}")
    rows.append(f"  memory        {s['memory_GiB']:.2f} GiB (rank 0 peak)")
    if s.get("expert_load"):
        rows.append("  expert load   " + " ".join(f"{v:.2f}" for v in s["expert_load"]))
    resumed = s.get("resumed")
    if resumed:
        skipped = "".join(f"; skipped {k['name']} ({k['reason']})" for k in resumed["skipped"])
        rows.append(
            f"  resumed       from {resumed['from']} (step {resumed['step']}){skipped}"
            if resumed["from"]
            else f"  resumed       nothing usable, started from scratch{skipped}"
        )
    if s.get("snapshots"):
        snaps = s["snapshots"]
        full = [r["bytes_written"] for r in snaps if r["kind"] == "full" and r["bytes_written"]]
        sizes = f"full {max(full) / 1e6:.2f} MB" if full else ""
        for kind in ("delta", "log"):
            sized = sorted(r["bytes_written"] for r in snaps if r["kind"] == kind and r["bytes_written"])
            if sized:
                sizes += f", {kind} {sized[len(sized) // 2] / 1e6:.2f} MB (median)"
        rows.append(
            f"  snapshots     {len(snaps)} ({sizes}), stall {s['snapshot_stall_s_median'] * 1000:.1f} ms median"
        )
    return "\n".join(rows)


def train_command(args: argparse.Namespace) -> int:
    from workers.training.config import ConfigError

    try:
        cfg = build_job_config(args)
        nproc = args.nproc if args.nproc is not None else cfg.world_size
        if nproc != cfg.world_size:
            raise ConfigError(
                "--nproc", f"the strategy needs tp*pp*dp*cp = {cfg.world_size} processes, got --nproc {nproc}"
            )
    except ConfigError as exc:
        print(f"cann-train train: invalid input: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run_local(cfg, nproc, timeout=args.timeout)
    except RuntimeError as exc:
        print(f"cann-train train: run failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0
