"""The in-memory snapshot tier: a rank's local state into shared memory and back, bit for bit; a copy cut
by a kill leaves the previous slot usable; another layout's or another run's slots are not offered."""

from __future__ import annotations

import json

import pytest
import torch

from workers.training.checkpoint import memory
from workers.training.checkpoint.memory import MemorySnapshots


@pytest.fixture(autouse=True)
def own_root(tmp_path, monkeypatch):
    monkeypatch.setenv(memory.ROOT_ENV, str(tmp_path / "shm"))


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"layers.0.w": torch.randn(4, 3, generator=g), "layers.0.b": torch.randn(3, generator=g)},
        "optimizer": {
            "state.layers.0.w.exp_avg": torch.randn(4, 3, generator=g).half(),
            "param_groups.lr": 0.1,
        },
        "progress": {"step": seed, "data": {"consumed": seed * 8}, "empty": {}},
        "rank0/skeleton": b"pickled rng",
        "rank0/t0": torch.arange(5, dtype=torch.int64) + seed,
    }


def live() -> dict:
    s = state(0)
    return {k: v for k, v in s.items() if not k.startswith("rank0/")}


def test_a_saved_state_loads_back_bit_for_bit_in_place(tmp_path):
    mem = MemorySnapshots(tmp_path / "snap", 0, {"world_size": 2})
    mem.save(7, state(7))
    assert mem.steps() == {7: 0}
    target = live()
    w = target["model"]["layers.0.w"]
    mem.load(7, target, "rank0/")
    assert target["model"]["layers.0.w"] is w  # filled in place: the live tensors
    want = state(7)
    for key in ("layers.0.w", "layers.0.b"):
        assert torch.equal(target["model"][key], want["model"][key])
    assert torch.equal(
        target["optimizer"]["state.layers.0.w.exp_avg"], want["optimizer"]["state.layers.0.w.exp_avg"]
    )
    assert target["progress"] == want["progress"] and target["optimizer"]["param_groups.lr"] == 0.1
    assert target["rank0/skeleton"] == b"pickled rng" and torch.equal(target["rank0/t0"], want["rank0/t0"])


def test_slots_alternate_and_a_cut_copy_leaves_the_previous_one(tmp_path):
    mem = MemorySnapshots(tmp_path / "snap", 0, {"world_size": 2})
    mem.save(2, state(2))
    mem.save(4, state(4))
    assert mem.steps() == {2: 0, 4: 1}
    # a kill in the middle of the next copy: slot 0's bytes are being overwritten, current.json still names 4
    header = json.loads((mem.dir / "slot0.json").read_text())
    header["step"] = 6
    (mem.dir / "slot0.json").write_text(json.dumps(header))  # as if its header were written before the bytes
    assert mem.steps() == {4: 1}
    target = live()
    MemorySnapshots(tmp_path / "snap", 0, {"world_size": 2}).load(4, target, "rank0/")  # a new process
    assert torch.equal(target["model"]["layers.0.w"], state(4)["model"]["layers.0.w"])


def test_only_this_layout_and_this_snapshot_dir_are_offered(tmp_path):
    MemorySnapshots(tmp_path / "snap", 0, {"world_size": 2}).save(3, state(3))
    assert MemorySnapshots(tmp_path / "snap", 0, {"world_size": 4}).steps() == {}
    assert MemorySnapshots(tmp_path / "other", 0, {"world_size": 2}).steps() == {}
    assert MemorySnapshots(tmp_path / "snap", 1, {"world_size": 2}).steps() == {}
    memory.remove(tmp_path / "snap")
    assert MemorySnapshots(tmp_path / "snap", 0, {"world_size": 2}).steps() == {}


def test_a_background_copy_holds_the_state_handed_over_and_its_non_tensors_as_they_were(tmp_path):
    mem = MemorySnapshots(tmp_path / "snap", 0, {"world_size": 2})
    handed = state(9)
    mem.save_async(9, handed)
    handed["progress"]["data"]["consumed"] = -1  # replaced after the hand-over: not what was saved
    assert mem.wait() >= 0.0 and mem.wait() == 0.0  # joined once; nothing in flight after
    assert mem.steps() == {9: 0}
    target = live()
    mem.load(9, target, "rank0/")
    want = state(9)
    assert torch.equal(target["model"]["layers.0.w"], want["model"]["layers.0.w"])
    assert target["progress"] == want["progress"]
    mem.save_async(11, state(11))
    mem.save(13, state(13))  # waits for the copy in flight first: both slots complete
    assert mem.steps() == {11: 1, 13: 0}
