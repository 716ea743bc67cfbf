"""A run that snapshots, stops and resumes continues exactly like the run that never stopped.

Every run goes through ``cann-train train``'s own path (config file -> torchrun with c10d rendezvous ->
``python -m workers.training.run``) on gloo, with the tiny example models. "Stops" is done two ways: the
snapshots after step k are removed (as if the job had died right after writing step k: deterministic),
and a real SIGKILL of the whole torchrun process group in the middle of a run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

from tests.conftest import tiered
from tests.engines.training.harness import EXAMPLES, STEPS, job, start, train
from workers.reliability.faults import flip_a_byte
from workers.training.checkpoint import list_snapshots, read_manifest, verify

pytestmark = pytest.mark.slow


LAYOUTS = {
    "dp2-ddp": ("tiny-dense.json", {"dp": 2, "micro_batch_size": 2}),
    "dp2-fsdp2-zero3": ("tiny-dense.json", {"dp": 2, "micro_batch_size": 2, "zero_stage": 3}),
    "pp2-1f1b": ("tiny-dense.json", {"pp": 2, "micro_batch_size": 2}),
    # experts sharded over ep (saved under per-rank names), balancing biases in the model state
    "ep2-dp2-moe": ("tiny-moe.json", {"dp": 2, "ep": 2, "micro_batch_size": 2}),
}


@pytest.mark.parametrize("layout", tiered(LAYOUTS, long={"dp2-fsdp2-zero3", "ep2-dp2-moe"}))
def test_resumed_run_matches_the_uninterrupted_run_bit_for_bit(layout, tmp_path):
    model, strategy = LAYOUTS[layout]
    reference = train(job(model, strategy))  # no snapshots at all
    snapshots = {"snapshot_dir": str(tmp_path), "snapshot_every": 3, "snapshot_full_every": 2}
    first = train(job(model, strategy, **snapshots))
    # snapshotting (staging + background writes) does not change a single bit of training
    assert first["losses"] == reference["losses"]
    assert [(s["name"], s["kind"]) for s in first["snapshots"]] == [
        ("step-00000003", "full"),
        ("step-00000006", "delta"),
        ("step-00000009", "full"),
    ]
    assert all(s["error"] is None and s["bytes_written"] > 0 for s in first["snapshots"])
    frames = read_manifest(tmp_path, "step-00000006").manifest["frames"]
    assert frames["shuffle-zstd"] == 0 and frames["xor-shuffle-zstd"] > 0  # every tensor found its base

    shutil.rmtree(tmp_path / "step-00000009")  # the job died after publishing step 6
    resumed = train(job(model, strategy, snapshot_dir=str(tmp_path), resume=True))
    assert resumed["resumed"]["from"] == "step-00000006"
    assert resumed["resumed"]["kind"] == "delta"  # rebuilt from its base (step 3) + the XOR delta
    assert resumed["resumed"]["same_layout"] is True
    assert resumed["steps"] == STEPS - 6
    print(f"\n{layout}: resumed losses {resumed['losses']}\n      reference {reference['losses'][6:]}")
    assert resumed["losses"] == reference["losses"][6:]


def test_cli_resume_skips_a_corrupt_newest_snapshot_and_says_why(tmp_path, capsys):
    from workers.cli import main

    common = [
        "train",
        "--model",
        str(EXAMPLES / "tiny-dense.json"),
        "--strategy",
        str(EXAMPLES / "dp2.json"),
        "--steps",
        str(STEPS),
        "--profile-every",
        "0",
        "--snapshot-dir",
        str(tmp_path),
        "--json",
    ]
    assert main([*common, "--snapshot-every", "3", "--snapshot-full-every", "2", "--snapshot-keep", "2"]) == 0
    first = json.loads(capsys.readouterr().out)
    # retention: the newest two, 9 (full) and 6 (a delta) -- and 6's base, 3
    assert list_snapshots(tmp_path) == ["step-00000009", "step-00000006", "step-00000003"]
    flip_a_byte(tmp_path / "step-00000009" / "rank00000.bin")

    assert main([*common, "--resume", "--snapshot-every", "3"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["resumed"]["from"] == "step-00000006"
    assert resumed["resumed"]["skipped"] == [
        {"name": "step-00000009", "reason": "rank00000.bin: sha256 mismatch"}
    ]
    assert resumed["losses"] == first["losses"][6:]  # nothing lost but the steps after step 6
    # the corrupt one was set aside; passing step 9 again, the resumed run wrote a good (full) one
    assert (tmp_path / "step-00000009.corrupt").is_dir()
    assert [s["name"] for s in resumed["snapshots"]] == ["step-00000009"]
    assert verify(tmp_path, "step-00000009").kind == "full"


def test_resume_with_no_snapshot_starts_from_scratch(tmp_path):
    cfg = job("tiny-dense.json", {"micro_batch_size": 4}, steps=3, snapshot_dir=str(tmp_path), resume=True)
    run = train(cfg)
    assert run["resumed"]["from"] is None and run["steps"] == 3


@pytest.mark.long
def test_a_run_killed_with_sigkill_resumes_from_its_newest_snapshot(tmp_path):
    """SIGKILL to torchrun and every rank at a random point after a few snapshots; the resumed run's losses
    equal the uninterrupted run's from the snapshot's step on."""
    steps = 240
    strategy = {"dp": 2, "micro_batch_size": 2}
    reference = train(job("tiny-dense.json", strategy, steps=steps))
    snaps = tmp_path / "snapshots"
    cfg = job(
        "tiny-dense.json",
        strategy,
        steps=steps,
        snapshot_dir=str(snaps),
        snapshot_every=10,
        snapshot_full_every=3,
    )
    proc = start(cfg, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while len(list_snapshots(snaps)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "torchrun.log").read_text()[-3000:]
    newest = read_manifest(snaps, list_snapshots(snaps)[0]).step
    assert 30 <= newest < steps

    resumed = train(job("tiny-dense.json", strategy, steps=steps, snapshot_dir=str(snaps), resume=True))
    first_step = resumed["resumed"]["step"]
    assert first_step >= newest  # the newest published one (a write cut by the kill was never published)
    assert resumed["steps"] == steps - first_step
    assert resumed["losses"] == reference["losses"][first_step:]
