"""One torchrun harness for the engine tests that train: a job config from the example models, a run of it
through ``cann-train train``'s own path (config file -> the warm torchrun agent -> ``workers.training.run``),
and a run started in the background for a test to kill or cut off (its own process group, torchrun's
environment, one OpenMP thread a rank). A snapshot file is damaged with the fault injector's own
``workers.reliability.faults.flip_a_byte``.

Used by the parallel-layout, snapshot/resume, resharding and recovery tests (the bit-for-bit family)."""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from pathlib import Path

from workers.training.cli import run_local
from workers.training.config import JobConfig
from workers.training.launch import free_port, render_torchrun_command, torchrun_env

EXAMPLES = Path(__file__).resolve().parents[3] / "workers" / "training" / "examples"
STEPS = 10

RUNS: dict[str, dict] = {}
"""Summaries of deterministic runs by config, shared by every test module a pytest process runs (a run
that neither snapshots, resumes nor injects a fault gives the same summary each time)."""


def job(model: str, strategy: dict, **extra) -> JobConfig:
    """A job on one of the example models (``tiny-dense.json``, ``tiny-moe.json``, ...): global batch 8,
    fp32, AdamW, :data:`STEPS` steps on the cpu unless ``extra`` says otherwise."""
    return JobConfig.from_dict(
        {
            "model": json.loads((EXAMPLES / model).read_text()),
            "strategy": strategy,
            "training": {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adamw"},
            "steps": STEPS,
            "device": "cpu",
            **extra,
        }
    )


def train(cfg: JobConfig, timeout: float = 240) -> dict:
    """The run's summary (rank 0's), on as many ranks as its strategy needs. A deterministic run (no
    snapshots, no resume, no fault) runs once per pytest process and its summary is shared: the resume
    tests' references are the layout tests' runs (CI time)."""
    key = json.dumps([cfg.to_dict(), cfg.world_size], sort_keys=True)
    pure = cfg.snapshot_dir is None and not cfg.resume and not cfg.inject
    if pure and key in RUNS:
        return copy.deepcopy(RUNS[key])
    out = run_local(cfg, cfg.world_size, timeout=timeout)
    if pure:
        RUNS[key] = copy.deepcopy(out)
    return out


def start(cfg: JobConfig, run_dir: Path, *, env: dict | None = None, **torchrun) -> subprocess.Popen:
    """``cfg`` under the warm torchrun agent in the background, in a process group of its own (``os.killpg``
    of ``.pid`` stops the agent and every rank), its output in ``run_dir/torchrun.log``. ``torchrun``:
    :func:`render_torchrun_command`'s arguments where the single-node defaults do not fit."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "job.json"
    if not config_path.exists():  # a node started again while another runs: never rewrite what it reads
        cfg.save(config_path)
    args = {
        "nnodes": 1,
        "nproc_per_node": cfg.world_size,
        "node_rank": 0,
        "rdzv_endpoint": f"127.0.0.1:{free_port()}",
        "run_id": uuid.uuid4().hex[:12],
        "warm": True,  # as cann-train train runs it
        **torchrun,
    }
    cmd = render_torchrun_command(str(config_path), **args)
    full_env = {**torchrun_env(), "OMP_NUM_THREADS": "1", **(env or {})}  # 2 cores: one thread a rank
    log_name = f"node{args['node_rank']}.log" if args["nnodes"] > 1 else "torchrun.log"
    with (run_dir / log_name).open("ab") as log:
        return subprocess.Popen(
            cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
