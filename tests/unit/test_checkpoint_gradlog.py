"""Log snapshots in one process (DCP's single-process mode), on a real model and fused AdamW: a log holds the
gradients each optimizer step consumed since the snapshot before it, and replaying them on the chain's full
snapshot gives the same state bit for bit; a chain is usable only when every link verifies; retention keeps
every link a kept log needs; a failed log makes the next snapshot a full one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.unit.test_checkpoint_storage import Job, assert_same, flip_a_byte
from workers.training.checkpoint import SnapshotManager, find_latest_good, list_snapshots, verify
from workers.training.checkpoint.gradlog import group_hyper, replay
from workers.training.checkpoint.storage import CorruptSnapshot, canonical_sha256

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class LogJob(Job):
    """:class:`Job` whose learning rate changes every step and whose last bias has no gradient at odd steps
    (the optimizer skips it): a replay must set the logged lr and leave that bias alone."""

    def __init__(self, seed: int = 0, manager: SnapshotManager | None = None):
        super().__init__(seed)
        self.manager = manager

    def params(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.model.named_parameters())

    def train(self, n: int = 1) -> None:
        for _ in range(n):
            x = torch.randn(16, 64, generator=self.gen)
            self.model(x).square().mean().backward()
            if self.step % 2:
                self.model[2].bias.grad = None
            for group in self.opt.param_groups:
                group["lr"] = 1e-3 * (1 + self.step / 10)
            if self.manager is not None and self.manager.wants_gradients:
                hyper = group_hyper(self.opt.param_groups[0])
                grads = {k: p.grad for k, p in self.params() if p.grad is not None}
                meta = {k: {"grad": p.grad is not None, "hyper": hyper} for k, p in self.params()}
                self.manager.record_gradients(self.step + 1, grads, meta)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1

    def log_state(self) -> dict:
        return {"progress": {"step": self.step}}


def log_run(
    root: Path, steps: int, full_every: int = 3, keep: int = 10
) -> tuple[LogJob, dict, SnapshotManager]:
    """Train ``steps`` steps, a snapshot after each; the fingerprint at each step, the manager."""
    mgr = SnapshotManager(root, full_every=full_every, keep=keep, delta="log")
    job, prints = LogJob(manager=mgr), {}
    for _ in range(steps):
        job.train()
        mgr.save(job.step, job.state, log_state=job.log_state)
        prints[job.step] = job.fingerprint()
    mgr.wait()
    return job, prints, mgr


def rebuild(root: Path, name: str) -> LogJob:
    """What the trainer's restore does: the chain's full snapshot, each log replayed, the last log's state."""
    fresh = LogJob(seed=1)
    fresh.train(1)  # a different state, so a restore that leaves anything behind shows
    mgr = SnapshotManager(root)
    chain = mgr.chain(verify(root, name))
    target = fresh.state()
    mgr.load(chain[0], target)
    fresh.restore(target)
    for log in chain[1:]:
        replay(mgr, log, fresh.params(), fresh.opt)
    target = {"progress": {"step": None}}
    mgr.load(chain[-1], target)
    fresh.step = target["progress"]["step"]
    return fresh


def test_replaying_the_logged_gradients_on_the_full_snapshot_is_bit_for_bit(tmp_path):
    _, prints, mgr = log_run(tmp_path, steps=6)
    assert [(r.name, r.kind, r.base, r.log_steps) for r in mgr.records] == [
        ("step-00000001", "full", None, None),
        ("step-00000002", "log", "step-00000001", [2]),
        ("step-00000003", "log", "step-00000002", [3]),
        ("step-00000004", "full", None, None),
        ("step-00000005", "log", "step-00000004", [5]),
        ("step-00000006", "log", "step-00000005", [6]),
    ]
    for step in range(1, 7):  # a mid-chain log (2, 5) as well as a chain's last one
        rebuilt = rebuild(tmp_path, f"step-{step:08d}")
        assert rebuilt.step == step
        assert_same(rebuilt.fingerprint(), prints[step])
    # a log holds one gradient per parameter and step, against the full snapshot's weights + two moments
    full, log = mgr.records[0], mgr.records[1]
    assert log.bytes_written < full.bytes_written / 2
    assert verify(tmp_path, "step-00000003").manifest["log_steps"] == [3]


def test_a_log_replays_on_a_run_that_trained_on(tmp_path):
    """The rebuilt job trains on exactly like the one that never stopped."""
    job, _, _ = log_run(tmp_path, steps=3)
    rebuilt = rebuild(tmp_path, "step-00000003")
    rebuilt.gen = torch.Generator().manual_seed(0)
    torch.randn(16 * 3, 64, generator=rebuilt.gen)  # the data the first 3 steps consumed
    job.manager = None
    job.train(3)
    rebuilt.train(3)
    assert_same(rebuilt.fingerprint(), job.fingerprint())


def test_gradients_are_recorded_only_when_the_next_snapshot_is_a_log(tmp_path):
    mgr = SnapshotManager(tmp_path, full_every=3, delta="log")
    job, wanted = LogJob(manager=mgr), []
    for _ in range(6):
        wanted.append(mgr.wants_gradients)
        job.train()
        mgr.save(job.step, job.state, log_state=job.log_state)
    mgr.wait()
    assert wanted == [False, True, True, False, True, True]
    assert SnapshotManager(tmp_path / "x").wants_gradients is False  # xor deltas never want them


def test_a_corrupt_middle_log_falls_back_to_the_snapshot_before_it(tmp_path):
    _, prints, _ = log_run(tmp_path, steps=4, full_every=4)  # full 1, logs 2 3 4
    flip_a_byte(tmp_path / "step-00000002" / "rank00000.bin")
    info, skipped = find_latest_good(tmp_path)
    assert info.name == "step-00000001"
    assert [(s.name, s.reason) for s in skipped] == [
        (
            "step-00000004",
            "its base step-00000003 is unusable: its chain breaks at step-00000002: rank00000.bin: sha256 mismatch",
        ),
        ("step-00000003", "its base step-00000002 is unusable: rank00000.bin: sha256 mismatch"),
        ("step-00000002", "rank00000.bin: sha256 mismatch"),
    ]
    assert_same(rebuild(tmp_path, info.name).fingerprint(), prints[1])


def test_a_log_must_hold_exactly_the_steps_after_its_base(tmp_path):
    log_run(tmp_path, steps=2)
    path = tmp_path / "step-00000002" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["body"]["log_steps"] = [1, 2]
    doc["sha256"] = canonical_sha256(doc["body"])
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptSnapshot, match=r"it logs steps \[1, 2\], its base step-00000001 is at step 1"):
        verify(tmp_path, "step-00000002")


def test_retention_keeps_every_link_a_kept_log_needs(tmp_path):
    mgr = SnapshotManager(tmp_path, full_every=4, keep=1, delta="log")
    job = LogJob(manager=mgr)
    kept = []
    for _ in range(6):  # full 1, logs 2 3 4, full 5, log 6
        job.train()
        mgr.save(job.step, job.state, log_state=job.log_state)
        mgr.wait()
        kept.append(list_snapshots(tmp_path))
    assert kept[3] == ["step-00000004", "step-00000003", "step-00000002", "step-00000001"]
    assert kept[4] == ["step-00000005"]
    assert kept[5] == ["step-00000006", "step-00000005"]


def test_a_failed_log_makes_the_next_snapshot_a_full_one(tmp_path):
    mgr = SnapshotManager(tmp_path, full_every=4, delta="log")
    job = LogJob(manager=mgr)
    for step in (1, 2, 3):
        job.train()
        if step == 2:
            (tmp_path / "step-00000002.partial").write_text("a file where the snapshot directory must go")
        mgr.save(job.step, job.state, log_state=job.log_state)  # 3 waits for 2, which failed
    mgr.wait()
    assert [r.kind for r in mgr.records] == ["full", "log", "full"]
    assert mgr.records[1].error and "step-00000002.partial" in mgr.records[1].error
    assert list_snapshots(tmp_path) == ["step-00000003", "step-00000001"]
    assert find_latest_good(tmp_path)[0].name == "step-00000003"
