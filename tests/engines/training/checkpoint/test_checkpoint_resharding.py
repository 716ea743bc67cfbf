"""A snapshot taken on N ranks loads on M ranks with every weight and optimizer moment bit for bit.

The snapshot comes from a real run (``cann-train train``'s path under torchrun). Each "probe" is this file
run under torchrun on some layout: it builds the trainer, resumes, gathers every tensor of the model and
optimizer state to full size (``DTensor.full_tensor()``) and rank 0 writes them out. The probe on the
snapshot's own layout is the reference; the others must equal it exactly.

    python -m torch.distributed.run --nproc-per-node N \
        tests/engines/training/checkpoint/test_checkpoint_resharding.py --config job.json --out state.pt
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.engines.training import harness

ROOT = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.slow


def job(strategy: dict, snapshot_dir: Path, **extra):
    return harness.job(
        "tiny-dense.json", strategy, **{"steps": 6, "snapshot_dir": str(snapshot_dir), **extra}
    )


def snapshot_on(strategy: dict, snapshot_dir: Path) -> dict:
    """Train 6 steps on ``strategy`` with a full snapshot at 3 and a delta at 6; return the summary."""
    return harness.train(job(strategy, snapshot_dir, snapshot_every=3, snapshot_full_every=2), timeout=180)


def probe(strategy: dict, snapshot_dir: Path, tmp_path: Path) -> dict:
    """Resume the newest snapshot on ``strategy`` (a process per rank); the full-size state rank 0 saw."""
    import torch

    from workers.training.launch import free_port, torchrun_env

    name = "-".join(f"{k}{v}" for k, v in sorted(strategy.items()))
    config, out = tmp_path / f"probe-{name}.json", tmp_path / f"probe-{name}.pt"
    job(strategy, snapshot_dir, resume=True).save(config)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={job(strategy, snapshot_dir).world_size}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id={uuid.uuid4().hex[:12]}",
        __file__,
        "--config",
        str(config),
        "--out",
        str(out),
    ]
    env = torchrun_env() | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return torch.load(out, weights_only=False)


def assert_same_state(a: dict, b: dict) -> None:
    import torch

    assert a["step"] == b["step"] and a["data"] == b["data"]
    assert a["tensors"].keys() == b["tensors"].keys()
    for key, t in a["tensors"].items():
        assert t.shape == b["tensors"][key].shape, key
        assert torch.equal(t, b["tensors"][key]), f"{key} differs"


@pytest.mark.long
def test_ddp_snapshot_of_two_ranks_loads_on_one(tmp_path):
    dp2, single = {"dp": 2, "micro_batch_size": 2}, {"micro_batch_size": 4}
    snapshot_on(dp2, tmp_path / "from-dp2")
    reference = probe(dp2, tmp_path / "from-dp2", tmp_path)
    assert reference["resumed"]["from"] == "step-00000006" and reference["resumed"]["same_layout"]
    on_one = probe(single, tmp_path / "from-dp2", tmp_path)
    assert on_one["resumed"]["same_layout"] is False
    assert_same_state(on_one, reference)
    # (growing, 1 -> 2 ranks, is test_elastic_scaling's regrow on real agents, and 2 -> 4 below for FSDP2)


@pytest.mark.long
def test_fsdp2_zero3_snapshot_of_two_ranks_loads_on_four(tmp_path):
    two = {"dp": 2, "micro_batch_size": 2, "zero_stage": 3}
    four = {"dp": 4, "micro_batch_size": 2, "zero_stage": 3}
    snapshot_on(two, tmp_path)
    reference = probe(two, tmp_path, tmp_path)
    on_four = probe(four, tmp_path, tmp_path)
    assert on_four["resumed"]["taken_on"]["world_size"] == 2
    assert_same_state(on_four, reference)
    # every rank of the four holds a quarter: the gathered tensors are whole
    assert on_four["tensors"]["model.output.weight"].shape == (256, 64)


def test_a_resharded_resume_trains_on_like_the_original_layout(tmp_path):
    """DP 2 -> 1: the single process continues the two-rank run's loss curve (float tolerance: one rank sums
    the gradient in another order than the two-rank all-reduce)."""
    first = harness.train(job({"dp": 2, "micro_batch_size": 2}, tmp_path, steps=10, snapshot_every=6))
    resumed = harness.train(job({"micro_batch_size": 4}, tmp_path, steps=10, resume=True), timeout=180)
    assert resumed["resumed"]["from"] == "step-00000006"
    assert resumed["resumed"]["same_layout"] is False
    assert resumed["losses"] == pytest.approx(first["losses"][6:], rel=1e-5)


# ------------------------------------------------------------------------------------ the probe process


def _probe_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    from torch.distributed.tensor import DTensor

    from workers.training.config import JobConfig
    from workers.training.trainer import Trainer, env_rank

    rank, world_size, local_rank = env_rank()
    trainer = Trainer(JobConfig.load(args.config), rank=rank, world_size=world_size, local_rank=local_rank)
    resumed = trainer.resume()
    state = trainer.snapshot_state(rank_entries=False)
    tensors = {}
    for part in ("model", "optimizer"):
        for key, value in sorted(state[part].items()):
            if isinstance(value, DTensor):
                value = value.full_tensor()
            if isinstance(value, torch.Tensor):
                tensors[f"{part}.{key}"] = value.detach().cpu().clone()
    if rank == 0:
        torch.save(
            {
                "resumed": resumed,
                "step": trainer.step,
                "data": trainer.loader.state_dict(),
                "tensors": tensors,
            },
            args.out,
        )
    trainer.close()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _probe_main()
