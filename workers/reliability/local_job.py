"""A local job on one node whose ranks a test or bench can degrade: the real runtime, every rank forked
from one warm agent (torchrun's own elastic agent and c10d rendezvous), watched through its progress
directory.

The ranks are the project's ``Trainer`` -- same model, DDP over gloo, progress files -- and, since the
progress directory is set, every rank writes its per-step timing (:mod:`.step_times`): what the straggler
watch reads. Forking the ranks after the import (like ``workers.training.supervision.agent``) starts four ranks on two
cores in a few seconds instead of four Python + torch imports.

Launch (one node)::

    CANN_TRAIN_PROGRESS_DIR=run/progress python -m workers.reliability.local_job --nproc 4 --config job.json
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from workers.devices import backend as device_mod

device_mod.prepare_environment()  # before torch is imported (torch-npu without CANN would break it)

from workers.training.supervision import progress as progress_mod  # noqa: E402
from workers.training.trainer import Trainer  # noqa: E402


def run_rank(config_path: str) -> int:
    """A forked rank (see ``workers.training.supervision.agent.run_rank``: die on SIGTERM as a spawned rank does)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    from workers.training.config import JobConfig, read_json
    from workers.training.trainer import env_rank

    cfg = JobConfig.from_dict(read_json(config_path, "config"))
    rank, world_size, local_rank = env_rank()
    trainer = Trainer(cfg, rank=rank, world_size=world_size, local_rank=local_rank)
    try:
        trainer.train()
    except BaseException:
        trainer.close(succeeded=False)
        raise
    trainer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from workers.training.launch import TORCHRUN_ENV, free_port

    parser = argparse.ArgumentParser(prog="python -m workers.reliability.local_job")
    parser.add_argument("--config", required=True, help="JobConfig JSON")
    parser.add_argument("--nproc", type=int, required=True, help="ranks on this node")
    parser.add_argument("--port", type=int, default=0, help="rendezvous port (0: a free one)")
    args = parser.parse_args(argv)
    os.environ.update(TORCHRUN_ENV)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=args.nproc,
        run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{args.port or free_port()}",
        max_restarts=0,
        start_method="fork",
        monitor_interval=0.1,
    )
    elastic_launch(config=config, entrypoint=run_rank)(str(args.config))
    return 0


def straggler_job_config(ranks: int, steps: int = 100_000) -> dict:
    """The job the fault-detection bench and test degrade: the tiny dense example model, pure data
    parallelism over ``ranks`` CPU ranks (DDP; watched, so with the timed all-reduce hook), no snapshots or
    energy metering.
    ``steps`` is large by default: the caller stops the job when it has seen enough."""
    from workers.training.examples import example

    return {
        "model": example("tiny-dense.json"),
        "strategy": {**example("dp2.json"), "dp": ranks},
        "training": {**example("training.json"), "global_batch_size": 2 * ranks},
        "device": "cpu",
        "steps": steps,
        "profile_every": 0,
        "energy": {"enabled": False},
    }


def launch(
    config_path: str | Path, nproc: int, progress_dir: str | Path, log_path: str | Path
) -> subprocess.Popen:
    """Start a timed job in its own session (stop it with :func:`stop`); one intra-op thread per rank."""
    env = {
        **os.environ,
        progress_mod.ENV: str(progress_dir),
        "OMP_NUM_THREADS": "1",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    }
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.reliability.local_job",
                "--nproc",
                str(nproc),
                "--config",
                str(config_path),
            ],
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> int:
    """SIGTERM the job's session (its agent stops the ranks), SIGKILL what is left after ``timeout_s``."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGCONT)  # a rank left stopped would never see the SIGTERM
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
