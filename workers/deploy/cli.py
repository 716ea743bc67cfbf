"""``cann-train render``: a plan as a Kubernetes (Kubeflow ``PyTorchJob`` + ``ConfigMap``) or Slurm job.

Prints the rendered file, or writes it under ``--out``. Nothing is submitted. Exit codes: 0 ok, 2 invalid
input (the message names the field), 3 the plan's world size does not fit the cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    from workers.deploy.render import DEFAULT_IMAGE, TARGETS
    from workers.training.options import add_option_flags

    p = subparsers.add_parser(
        "render",
        help="render a plan as a Kubernetes PyTorchJob or a Slurm batch script (nothing is submitted)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--plan", required=True, help="plan.json (or the API's plan-json export, JSON or YAML)")
    p.add_argument(
        "--target", required=True, choices=TARGETS, help="k8s: PyTorchJob + ConfigMap; slurm: sbatch"
    )
    p.add_argument("--model", help="model.json (default: the plan's 'model')")
    p.add_argument("--cluster", help="cluster.json: devices per node and device kind (default: the plan's)")
    p.add_argument("--training", help="training.json (default: the plan's, else the runtime's defaults)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    p.add_argument("--name", help="job name, a DNS label (default cann-train-<model name>)")
    p.add_argument("--image", default=DEFAULT_IMAGE, help=f"k8s: container image (default {DEFAULT_IMAGE})")
    p.add_argument(
        "--python", default="python", help="the interpreter with cann-train installed (default python)"
    )
    p.add_argument(
        "--device",
        choices=["cuda", "npu", "cpu"],
        help="default: from the cluster's device name (NVIDIA, Ascend)",
    )
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts of the worker group")
    add_option_flags(
        p,
        ["snapshot_dir", "snapshot_every"],
        notes={
            "snapshot_dir": "on storage every node shares; implies resume",
            "snapshot_every": "needs --snapshot-dir",
        },
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment, e.g. NCCL_SOCKET_IFNAME=eth0 or NCCL_IB_HCA=mlx5_0 (repeatable)",
    )
    p.add_argument("--out", help="directory to write the file into (default: print it)")
    p.set_defaults(func=render_command)


def _env_pairs(items: list[str]) -> dict[str, str]:
    from workers.deploy.render import RenderError

    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise RenderError("--env", f"must be NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def render_command(args: argparse.Namespace) -> int:
    from workers.deploy.render import RenderError, build_deployment, describe, load_document, render

    try:
        docs = {
            what: load_document(path, f"--{what}") if path else None
            for what, path in (("model", args.model), ("cluster", args.cluster), ("training", args.training))
        }
        dep = build_deployment(
            load_document(args.plan, "--plan"),
            **docs,
            steps=args.steps,
            name=args.name,
            image=args.image,
            python=args.python,
            device=args.device,
            max_restarts=args.max_restarts,
            snapshot_dir=args.snapshot_dir,
            snapshot_every=args.snapshot_every,
            env=_env_pairs(args.env),
        )
        files = render(dep, args.target)
    except RenderError as exc:
        print(f"cann-train render: {exc}", file=sys.stderr)
        return exc.exit_code
    if not args.out:
        sys.stdout.write("".join(files.values()))
        return 0
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for file_name, text in files.items():
            (out / file_name).write_text(text)
    except OSError as exc:
        print(f"cann-train render: --out: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for file_name in files:
        print(f"wrote {out / file_name}: {describe(dep)}")
    return 0
