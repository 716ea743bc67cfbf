"""``cann-train launch``: your own training script (it imports the SDK, ``cann_train``) under the platform's
supervision, here or on a control plane.

    cann-train launch --nproc 2 --snapshot-every 5 -- examples/sdk/ddp_loop.py --steps 30
    cann-train launch --nproc 2 --snapshot-every 5 --inject kill-rank@step=12 --json -- train.py
    cann-train launch --server http://cp:8000 --token ct_... --nproc 2 -- /data/team/train.py --lr 3e-4

Here: torchrun (restarts from the script's own snapshots, ``--max-restarts``) watched by the recovery engine
(:class:`~workers.reliability.elastic.ElasticWatch`: dead and hung ranks, faults timed, goodput), with the
fault plan of ``--inject`` and the ranks' environment scrubbed as a worker scrubs it. With ``--server``: the
same request as ``POST /api/jobs/`` with an ``entrypoint`` (the script's path as the control plane's nodes see
it, under its code directories). Exit codes: 0 the script ended well, 1 it failed, 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run your own training script (cann_train SDK) under cann-train's supervision",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nproc", type=int, default=1, help="processes (ranks) on this node (default 1)")
    p.add_argument(
        "--module", action="store_true", help="the first argument after -- is a module (python -m)"
    )
    p.add_argument("--workdir", help="where the ranks run (default: the script's directory)")
    p.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="a variable for the ranks"
    )
    p.add_argument(
        "--snapshot-every", type=int, default=0, help="run.snapshot_due(step) every N steps (0: never)"
    )
    p.add_argument("--snapshot-dir", help="default: <run-dir>/snapshots")
    p.add_argument("--steps", type=int, help="the steps the script means to run (run.steps)")
    p.add_argument("--hyperparameters", help="a JSON object: run.hyperparameters")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"))
    p.add_argument("--inject", default="", help="faults: kill-rank@step=N, hang-rank@step=N[:rank=R], ...")
    p.add_argument("--max-restarts", type=int, help="default 3 with snapshots, else 0")
    p.add_argument("--hang-timeout", type=float, default=60.0, help="seconds without a committed step")
    p.add_argument("--run-dir", help="default: ./cann-train-launch/<id>")
    p.add_argument("--timeout", type=float, default=3600.0, help="stop the run after this many seconds")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--server", default=None, help="submit to this control plane instead (its URL)")
    p.add_argument("--token", default=None, help="its API token (CANN_TRAIN_TOKEN)")
    p.add_argument("--name", default=None, help="the job's name on the control plane")
    p.add_argument(
        "program", nargs=argparse.REMAINDER, help="-- script.py ARGS... (or a module with --module)"
    )
    p.set_defaults(func=main)


def _entrypoint(args) -> dict:
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        raise ValueError("give the script after --: cann-train launch [options] -- train.py ARGS...")
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--env {item!r}: NAME=VALUE")
        env[name] = value
    head, rest = program[0], program[1:]
    entry = {"args": rest, "env": env, "nproc_per_node": args.nproc}
    if args.module:
        entry.update(module=head, workdir=str(Path(args.workdir or ".").resolve()))
    else:
        entry["script"] = str(Path(head).resolve())
        if args.workdir:
            entry["workdir"] = str(Path(args.workdir).resolve())
    return entry


def main(args) -> int:
    from workers.training.config import ConfigError

    try:
        entry = _entrypoint(args)
        hyper = json.loads(args.hyperparameters) if args.hyperparameters else {}
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"cann-train launch: {exc}", file=sys.stderr)
        return 2
    if args.server:
        return _submit(args, entry, hyper)
    if entry.get("script") and not Path(entry["script"]).is_file():
        print(f"cann-train launch: {entry['script']} is not a file", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or Path("cann-train-launch") / uuid.uuid4().hex[:8]).resolve()
    try:
        result = run_user_code(
            entry,
            run_dir=run_dir,
            snapshot_every=args.snapshot_every,
            snapshot_dir=args.snapshot_dir,
            steps=args.steps,
            hyperparameters=hyper,
            device=args.device,
            inject=args.inject,
            max_restarts=args.max_restarts,
            hang_timeout_s=args.hang_timeout,
            timeout=args.timeout,
        )
    except (ConfigError, ValueError) as exc:
        print(f"cann-train launch: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        report = result["report"]
        print(
            f"run directory {run_dir}: exit {result['exit_code']}, {len(report['faults'])} fault(s) recovered"
        )
        for fault in report["faults"]:
            print(
                f"  {fault['kind']} at step {fault['step']}: resumed from step {fault.get('resumed_from_step')}, "
                f"RTO {fault.get('rto_s')} s"
            )
        if report.get("goodput"):
            print(f"  goodput {report['goodput'].get('goodput')}")
    if result["exit_code"] != 0:
        print(result["log_tail"][-3000:], file=sys.stderr)
        return 1
    return 0


def run_user_code(
    entrypoint: dict,
    *,
    run_dir: Path,
    snapshot_every: int = 0,
    snapshot_dir: str | None = None,
    steps: int | None = None,
    hyperparameters: dict | None = None,
    device: str = "auto",
    inject: str = "",
    max_restarts: int | None = None,
    hang_timeout_s: float = 60.0,
    timeout: float = 3600.0,
) -> dict:
    """Run a user's entrypoint on this machine under torchrun with restarts and an :class:`ElasticWatch`;
    returns :func:`~workers.reliability.cli.run_watched`'s result and ``run_dir``.
    :class:`~workers.training.config.ConfigError` for a run config that cannot run."""
    from workers.reliability.cli import run_watched
    from workers.reliability.elastic import ElasticWatch
    from workers.reliability.faults import FaultInjector
    from workers.training.entrypoint import RUN_CONFIG_ENV, Entrypoint, parse_run_config
    from workers.training.launch import free_port, render_torchrun_command, torchrun_env

    run_dir.mkdir(parents=True, exist_ok=True)
    entry = Entrypoint.from_dict(entrypoint)
    nproc = entry.nproc_per_node
    snapshots = Path(snapshot_dir or run_dir / "snapshots") if snapshot_every else None
    config = parse_run_config(
        {
            "entrypoint": entrypoint,
            "hyperparameters": hyperparameters or {},
            "device": device,
            **({"steps": steps} if steps else {}),
            **({"snapshot_every": snapshot_every, "snapshot_dir": str(snapshots)} if snapshots else {}),
            **({"inject": inject} if inject else {}),
        },
        world_size=nproc,
    )
    summary_path = run_dir / "summary.json"
    summary_path.unlink(missing_ok=True)
    config_path = run_dir / "run.json"
    config_path.write_text(json.dumps({**config, "summary_path": str(summary_path)}))
    injector = FaultInjector(inject, world_size=nproc, snapshot_dir=snapshots) if inject else None
    watch = ElasticWatch(run_dir, hang_timeout_s=hang_timeout_s, snapshot_dir=snapshots, injector=injector)
    restarts = max_restarts if max_restarts is not None else (3 if snapshots else 0)
    cmd = render_torchrun_command(
        None,
        nnodes=1,
        nproc_per_node=nproc,
        node_rank=0,
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        run_id=uuid.uuid4().hex[:12],
        max_restarts=restarts,
        warm=True,
        program=entry.program(),
    )
    env = {**torchrun_env(), **entry.env, RUN_CONFIG_ENV: str(config_path)}
    result = run_watched(
        cmd, log=run_dir / "torchrun.log", env=env, watch=watch, summary_path=summary_path, timeout=timeout,
        cwd=entry.cwd,
    )  # fmt: skip
    return {**result, "run_dir": str(run_dir)}


def _submit(args, entry: dict, hyper: dict) -> int:
    """The job on a control plane (``POST /api/jobs/``); prints the created job."""
    import urllib.error
    import urllib.request

    url = args.server.rstrip("/") + "/api/jobs/"
    token = args.token or os.environ.get("CANN_TRAIN_TOKEN")
    if not token:
        print("cann-train launch: --server needs --token (or CANN_TRAIN_TOKEN)", file=sys.stderr)
        return 2
    body = {
        "name": args.name or Path(entry.get("script") or entry.get("module") or "job").name,
        "entrypoint": entry,
        "device": args.device,
        "hyperparameters": hyper,
        "snapshot_every": args.snapshot_every,
        **({"steps": args.steps} if args.steps else {}),
        **({"inject": args.inject} if args.inject else {}),
        **({"max_restarts": args.max_restarts} if args.max_restarts is not None else {}),
        "hang_timeout_s": args.hang_timeout,
    }
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            created = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(f"cann-train launch: {exc.code} {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 2 if 400 <= exc.code < 500 else 1
    except urllib.error.URLError as exc:
        print(f"cann-train launch: {url}: {exc.reason}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(created, indent=2))
    else:
        print(f"job {created['id']} {created['state']}: {args.server.rstrip('/')}/jobs/{created['id']}/")
    return 0
