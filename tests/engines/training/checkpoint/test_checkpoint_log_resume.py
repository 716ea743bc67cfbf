"""Log snapshots in real jobs: between full snapshots, each snapshot holds the gradients the optimizer consumed
since the one before it, and a resume replays them on the chain's full snapshot.

One DDP dp2 run (``cann-train train``'s path: torchrun, gloo) snapshots after every step, a full one every
four: full 1, logs 2-4, full 5, logs 6-8, full 9, log 10. Each test resumes from a copy of its directory:
from a chain's newest log, past a corrupt link, and on one rank from a log in the middle of a chain.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.engines.training import harness
from tests.engines.training.harness import STEPS, job
from workers.reliability.faults import flip_a_byte
from workers.training.checkpoint import list_snapshots, verify

pytestmark = pytest.mark.slow

DP2 = {"dp": 2, "micro_batch_size": 2}
LOG = {"snapshot_every": 1, "snapshot_full_every": 4, "snapshot_delta": "log", "snapshot_keep": 20}


def train(strategy: dict, snapshot_dir: Path, **extra) -> dict:
    return harness.train(
        job("tiny-dense.json", strategy, snapshot_dir=str(snapshot_dir), profile_every=0, **extra)
    )


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> tuple[Path, dict]:
    """The run's snapshot directory (left as written: tests copy it) and its summary."""
    root = tmp_path_factory.mktemp("log-snapshots")
    return root, train(DP2, root, **LOG)


def copy_without(logged, tmp_path: Path, *newest: str) -> Path:
    root = tmp_path / "snapshots"
    shutil.copytree(logged[0], root)
    for name in newest:
        shutil.rmtree(root / name)
    return root


@pytest.mark.long
def test_the_run_writes_logs_between_full_snapshots(logged):
    root, first = logged
    kinds = [(s["name"][-2:], s["kind"], s["base"] and s["base"][-2:]) for s in first["snapshots"]]
    assert kinds == [
        ("01", "full", None),
        ("02", "log", "01"),
        ("03", "log", "02"),
        ("04", "log", "03"),
        ("05", "full", None),
        ("06", "log", "05"),
        ("07", "log", "06"),
        ("08", "log", "07"),
        ("09", "full", None),
        ("10", "log", "09"),
    ]
    assert all(s["error"] is None for s in first["snapshots"])
    full, log = first["snapshots"][0], first["snapshots"][1]
    assert log["log_steps"] == [2] and log["bytes_written"] < full["bytes_written"] / 2
    assert verify(root, "step-00000008").manifest["log_steps"] == [8]


def test_a_resume_from_a_log_chain_matches_the_uninterrupted_run_bit_for_bit(logged, tmp_path):
    root = copy_without(logged, tmp_path, "step-00000010", "step-00000009")  # the job died after step 8
    resumed = train(DP2, root, resume=True)
    assert resumed["resumed"]["from"] == "step-00000008"
    assert resumed["resumed"]["kind"] == "log"
    assert resumed["resumed"]["chain"] == [f"step-0000000{i}" for i in (5, 6, 7, 8)]
    assert resumed["resumed"]["replayed_steps"] == 3
    assert resumed["steps"] == STEPS - 8
    assert resumed["losses"] == logged[1]["losses"][8:]


def test_a_corrupt_middle_log_resumes_from_the_snapshot_before_it(logged, tmp_path):
    root = copy_without(logged, tmp_path, "step-00000010", "step-00000009")
    flip_a_byte(root / "step-00000006" / "rank00000.bin")
    resumed = train(DP2, root, resume=True, **LOG)
    assert resumed["resumed"]["from"] == "step-00000005"
    assert resumed["resumed"]["skipped"] == [
        {
            "name": "step-00000008",
            "reason": "its base step-00000007 is unusable: its chain breaks at step-00000006: "
            "rank00000.bin: sha256 mismatch",
        },
        {
            "name": "step-00000007",
            "reason": "its base step-00000006 is unusable: rank00000.bin: sha256 mismatch",
        },
        {"name": "step-00000006", "reason": "rank00000.bin: sha256 mismatch"},
    ]
    assert resumed["losses"] == logged[1]["losses"][5:]  # nothing lost but the steps after step 5
    # the resumed run starts a chain of its own: a full snapshot first, then logs on it
    assert [s["kind"] for s in resumed["snapshots"]] == ["full", "log", "log", "log", "full"]
    assert verify(root, "step-00000009").kind == "log"


def test_a_mid_chain_log_of_two_ranks_restores_on_one(logged, tmp_path):
    """Restore to step 7 (log 8 was written on it) on one rank: the gradients reshard like any tensor; the
    losses follow the two-rank run's within float tolerance (one rank sums the batch in another order)."""
    root = copy_without(logged, tmp_path)
    resumed = train({"micro_batch_size": 4}, root, resume_from="step-00000007")
    assert resumed["resumed"]["from"] == "step-00000007"
    assert resumed["resumed"]["same_layout"] is False
    assert resumed["resumed"]["chain"] == ["step-00000005", "step-00000006", "step-00000007"]
    assert list_snapshots(root)[0] == "step-00000007"  # 8, 9 and 10 set aside as superseded
    assert resumed["losses"] == pytest.approx(logged[1]["losses"][7:], rel=1e-5)
