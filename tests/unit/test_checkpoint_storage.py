"""The snapshot engine in one process (no process group: DCP's single-process mode), on a real model and
AdamW optimizer: full and delta snapshots reload bit for bit; the manifest, checksums and atomic publish
let a reader tell a good snapshot from a partial, corrupt or orphaned one and fall back to the previous
good one; retention keeps what deltas need; a failed write does not stop training."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from workers.training.checkpoint import (
    SnapshotManager,
    find_latest_good,
    list_snapshots,
    read_manifest,
    verify,
)
from workers.training.checkpoint.storage import CorruptSnapshot, apply_retention

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class Job:
    """A small model with AdamW, trained on random data (seeded), and the state a trainer snapshots."""

    def __init__(self, seed: int = 0):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, fused=True)
        self.step = 0
        self.gen = torch.Generator().manual_seed(seed)

    def train(self, n: int = 1) -> None:
        for _ in range(n):
            x = torch.randn(16, 64, generator=self.gen)
            self.model(x).square().mean().backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1

    def state(self) -> dict:
        model, optim = get_state_dict(self.model, self.opt, options=OPTIONS)
        return {"model": model, "optimizer": optim, "progress": {"step": self.step}}

    def restore(self, state: dict) -> None:
        set_state_dict(
            self.model,
            self.opt,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=OPTIONS,
        )
        self.step = state["progress"]["step"]

    def fingerprint(self) -> dict[str, torch.Tensor]:
        model, optim = get_state_dict(self.model, self.opt, options=OPTIONS)
        out = {f"model.{k}": v.clone() for k, v in model.items()}
        out.update({f"optim.{k}": v.clone() for k, v in optim.items() if isinstance(v, torch.Tensor)})
        return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def snapshot_run(root: Path, steps=(2, 4, 6, 8), full_every=2, keep=10) -> tuple[Job, dict, SnapshotManager]:
    """Train, snapshot at ``steps``; returns the job, the fingerprint at each snapshot, the manager."""
    job, prints = Job(), {}
    mgr = SnapshotManager(root, full_every=full_every, keep=keep)
    for step in steps:
        job.train(step - job.step)
        mgr.save(job.step, job.state)
        prints[step] = job.fingerprint()
    mgr.wait()
    return job, prints, mgr


def load_into_fresh_job(root: Path, name: str) -> Job:
    fresh = Job(seed=1)
    fresh.train(1)  # a different state, so a load that leaves anything behind shows
    target = fresh.state()
    target["progress"] = {"step": None}
    SnapshotManager(root).load(read_manifest(root, name), target)
    fresh.restore(target)
    return fresh


def test_full_and_delta_snapshots_reload_bit_for_bit(tmp_path):
    _, prints, mgr = snapshot_run(tmp_path)
    kinds = [(r.name, r.kind, r.base) for r in mgr.records]
    assert kinds == [
        ("step-00000002", "full", None),
        ("step-00000004", "delta", "step-00000002"),
        ("step-00000006", "full", None),
        ("step-00000008", "delta", "step-00000006"),
    ]
    for step in (2, 4, 6, 8):
        fresh = load_into_fresh_job(tmp_path, f"step-{step:08d}")
        assert fresh.step == step
        assert_same(fresh.fingerprint(), prints[step])
    for r in mgr.records:  # bytes per snapshot, from the manifest
        manifest = read_manifest(tmp_path, r.name).manifest
        assert (
            r.bytes_written
            == manifest["bytes_written"]
            == sum(f["bytes"] for f in manifest["files"].values())
        )
        assert r.raw_bytes == manifest["raw_bytes"] > 0
        assert manifest["kind"] == r.kind


def test_a_resumed_job_continues_exactly_like_the_uninterrupted_one(tmp_path):
    job, _, _ = snapshot_run(tmp_path, steps=(3,), keep=1)
    resumed = load_into_fresh_job(tmp_path, "step-00000003")
    resumed.gen = torch.Generator().manual_seed(0)
    torch.randn(16 * 3, 64, generator=resumed.gen)  # the data the first 3 steps consumed
    job.train(4)
    resumed.train(4)
    assert_same(resumed.fingerprint(), job.fingerprint())


def test_publish_is_atomic_and_the_manifest_checks_every_file(tmp_path):
    snapshot_run(tmp_path, steps=(2,))
    snap = tmp_path / "step-00000002"
    assert sorted(p.name for p in snap.iterdir()) == ["manifest.json", "metadata.pkl", "rank00000.bin"]
    assert not list(tmp_path.glob("*.partial"))
    doc = json.loads((snap / "manifest.json").read_text())
    assert set(doc["body"]["files"]) == {"metadata.pkl", "rank00000.bin"}
    assert all(len(f["sha256"]) == 64 for f in doc["body"]["files"].values())
    verify(tmp_path, "step-00000002")


def flip_a_byte(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupt_newest_snapshot_is_skipped_for_the_previous_good_one(tmp_path):
    _, prints, _ = snapshot_run(tmp_path)
    flip_a_byte(tmp_path / "step-00000008" / "rank00000.bin")
    info, skipped = find_latest_good(tmp_path)
    assert info.name == "step-00000006"
    assert [(s.name, s.reason) for s in skipped] == [("step-00000008", "rank00000.bin: sha256 mismatch")]
    assert_same(load_into_fresh_job(tmp_path, info.name).fingerprint(), prints[6])


def test_a_delta_whose_base_is_corrupt_is_skipped_too(tmp_path):
    snapshot_run(tmp_path)
    flip_a_byte(tmp_path / "step-00000006" / "metadata.pkl", at=10)
    info, skipped = find_latest_good(tmp_path)
    assert info.name == "step-00000004"
    assert [s.name for s in skipped] == ["step-00000008", "step-00000006"]
    assert skipped[0].reason == "its base step-00000006 is unusable: metadata.pkl: sha256 mismatch"


@pytest.mark.parametrize(
    "damage, reason",
    [
        (
            lambda d: (d / "rank00000.bin").write_bytes((d / "rank00000.bin").read_bytes()[:-10]),
            "bytes, the manifest says",
        ),
        (lambda d: (d / "rank00000.bin").unlink(), "rank00000.bin is missing"),
        (lambda d: (d / "manifest.json").unlink(), "no manifest.json"),
        (
            lambda d: (d / "manifest.json").write_text(
                (d / "manifest.json").read_text().replace('"step": 8', '"step": 7')
            ),
            "manifest.json checksum mismatch",
        ),
        (lambda d: (d / "manifest.json").write_text("{"), "manifest.json unreadable"),
    ],
    ids=["truncated", "missing-file", "no-manifest", "edited-manifest", "garbled-manifest"],
)
def test_each_kind_of_damage_is_named(tmp_path, damage, reason):
    snapshot_run(tmp_path)
    damage(tmp_path / "step-00000008")
    with pytest.raises(CorruptSnapshot, match=reason):
        verify(tmp_path, "step-00000008")
    assert find_latest_good(tmp_path)[0].name == "step-00000006"


def test_an_interrupted_write_is_never_listed_and_is_cleaned_up(tmp_path):
    snapshot_run(tmp_path, steps=(2,))
    (tmp_path / "step-00000004.partial").mkdir()
    (tmp_path / "step-00000004.partial" / "rank00000.bin").write_bytes(b"half a snapshot")
    assert list_snapshots(tmp_path) == ["step-00000002"]
    SnapshotManager(tmp_path)  # a new job on the directory removes the leftovers
    assert not (tmp_path / "step-00000004.partial").exists()


def test_retention_keeps_the_newest_and_the_bases_their_deltas_need(tmp_path):
    snapshot_run(tmp_path, steps=(1, 2, 3, 4, 5), full_every=3, keep=2)
    # full 1, delta 2, delta 3, full 4, delta 5: the newest two are 5 and 4 (5's base)
    assert list_snapshots(tmp_path) == ["step-00000005", "step-00000004"]
    snapshot_run(tmp_path / "b", steps=(1, 2, 3), full_every=3, keep=1)
    assert list_snapshots(tmp_path / "b") == ["step-00000003", "step-00000001"]  # 3 is a delta of 1
    assert apply_retention(tmp_path / "b", keep=1) == []


def test_a_failed_write_does_not_stop_training_and_the_next_snapshot_is_full(tmp_path):
    job = Job()
    mgr = SnapshotManager(tmp_path, full_every=4)
    job.train()
    mgr.save(1, job.state)
    (tmp_path / "step-00000002.partial").write_text("a file where the snapshot directory must go")
    job.train()
    mgr.save(2, job.state)
    job.train()
    mgr.save(3, job.state)  # waits for 2, which failed
    mgr.wait()
    failed = mgr.records[1]
    assert failed.error and "step-00000002.partial" in failed.error
    assert [r.kind for r in mgr.records] == ["full", "delta", "delta"]  # 1 is still a good base
    assert list_snapshots(tmp_path) == ["step-00000003", "step-00000001"]
    assert find_latest_good(tmp_path)[0].name == "step-00000003"


def test_the_training_thread_pays_only_for_staging(tmp_path, monkeypatch):
    # The disk is held (every fsync waits on a gate): save() must still return, training must go on,
    # and the snapshot must hold the state of step 1, not what training did while the write waited.
    gate = threading.Event()
    real_fsync = os.fsync

    def held_fsync(fd):
        assert gate.wait(60), "the write was never released"
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", held_fsync)
    job = Job()
    job.train()
    mgr = SnapshotManager(tmp_path)
    mgr.prepare(job.state())
    record = mgr.save(1, job.state)  # returns although the write cannot finish yet
    before = job.fingerprint()
    assert record.write_s is None and list_snapshots(tmp_path) == []
    job.train(2)  # training goes on while the write waits
    gate.set()
    mgr.wait()
    assert record.error is None and record.write_s is not None
    assert_same(load_into_fresh_job(tmp_path, "step-00000001").fingerprint(), before)


def test_os_level_durability_calls_are_made(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    snapshot_run(tmp_path, steps=(2,))
    assert len(synced) >= 5  # the rank file, metadata, manifest, the snapshot dir, the root dir


def test_a_fresh_run_refuses_a_directory_holding_another_runs_snapshots(tmp_path):
    snapshot_run(tmp_path, steps=(2,))
    with pytest.raises(FileExistsError, match="already holds snapshots .step-00000002. of another run"):
        SnapshotManager(tmp_path, fresh=True)
    SnapshotManager(tmp_path / "empty", fresh=True)  # an empty or new directory is fine


def test_unusable_newer_snapshots_are_set_aside_so_retention_keeps_the_new_ones(tmp_path):
    job, prints, _ = snapshot_run(tmp_path, steps=(2, 4, 6, 8), full_every=2, keep=10)
    flip_a_byte(tmp_path / "step-00000006" / "rank00000.bin")  # 6 and its delta 8 are unusable
    mgr = SnapshotManager(tmp_path, keep=1)
    info, skipped = mgr.latest_good()
    assert info.name == "step-00000004" and [s.name for s in skipped] == ["step-00000008", "step-00000006"]
    assert sorted(p.name for p in tmp_path.glob("*.corrupt")) == [
        "step-00000006.corrupt",
        "step-00000008.corrupt",
    ]
    resumed = load_into_fresh_job(tmp_path, info.name)
    assert_same(resumed.fingerprint(), prints[4])
    resumed.train(1)
    mgr.save(5, resumed.state)  # the run goes on from 4; with keep=1 its snapshot is what stays
    mgr.wait()
    assert list_snapshots(tmp_path) == ["step-00000005"]
