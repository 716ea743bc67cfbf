"""The SDK (``cann_train``) under the engines, no control plane: the example DDP loop run as plain ``python``
(a local run that snapshots into a directory and continues from it bit for bit), under ``cann-train launch``
(a killed rank recovered from the script's own snapshot with the uninterrupted run's very losses; a stop
request answered by a snapshot and a clean exit) and a 2-rank snapshot continued on 1 rank (resharded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sdk" / "ddp_loop.py"
# Steps of ~75 ms here (2026-12-06, 2 ranks, quiet: 72 ms the DDP loop, 82 ms the Lightning module), so that
# a kill at step 12 lands mid-run: the injector fires from outside, when the watch (a poll every 0.25 s) reads
# step 12 in a progress file rewritten at most every 0.25 s, which can take the better part of a second on
# a loaded machine. With batch 16 (11 ms steps, 40 in 0.5 s) the kill came after step 40 in CI, while the
# run was ending: nothing left to recover (ci11, the Lightning test's fault without resumed_from_step).
BIGGER = ["--batch", "256", "--seq", "64"]


def _python(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    from workers.training.launch import torchrun_env

    done = subprocess.run(
        [sys.executable, *args], env={**torchrun_env(), "OMP_NUM_THREADS": "1", **env}, cwd=cwd,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _launch(tmp: Path, name: str, *flags: str, steps: int = 40, example: Path = EXAMPLE) -> dict:
    out = tmp / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "launch", "--run-dir", str(tmp / name), "--json", *flags, "--",
         str(example), "--steps", str(steps), *BIGGER],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    out.write_text(done.stdout)
    return json.loads(done.stdout)


def test_a_local_run_snapshots_and_continues_bit_for_bit(tmp_path):
    once = tmp_path / "once"
    _python([str(EXAMPLE), "--steps", "12"], {"CANN_TRAIN_LOCAL_DIR": str(tmp_path / "split")}, tmp_path)
    _python([str(EXAMPLE), "--steps", "16"], {"CANN_TRAIN_LOCAL_DIR": str(tmp_path / "split")}, tmp_path)
    _python([str(EXAMPLE), "--steps", "16"], {"CANN_TRAIN_LOCAL_DIR": str(once)}, tmp_path)
    split = json.loads((tmp_path / "split" / "summary.json").read_text())
    whole = json.loads((once / "summary.json").read_text())
    assert split["resumed"]["from"] == "step-00000010" and split["steps"] == 6
    assert split["losses"] == whole["losses"][10:]  # bit for bit
    events = [json.loads(line) for line in (once / "events.jsonl").read_text().splitlines()]
    train = [e for e in events if e["kind"] == "train"]
    assert [e["step"] for e in train] == list(range(1, 17)) and all(
        e["values"]["tokens_per_s"] > 0 for e in train[1:]
    )
    assert (
        events[-1]["values"]["state"] == "finished"
        and sorted(os.listdir(once / "snapshots"))[-1] == "step-00000015"
    )


def test_launch_recovers_a_killed_rank_from_the_scripts_snapshot_with_the_same_losses(tmp_path):
    plain = _launch(tmp_path, "plain", "--nproc", "2", "--snapshot-every", "5")
    faulty = _launch(
        tmp_path, "faulty", "--nproc", "2", "--snapshot-every", "5", "--inject", "kill-rank@step=12"
    )
    [fault] = faulty["report"]["faults"]
    assert fault["kind"] == "rank-killed" and fault["step"] >= 12 and fault["rto_s"] > 0
    assert (
        fault["resumed_from_step"] % 5 == 0
        and faulty["summary"]["resumed"]["step"] == fault["resumed_from_step"]
    )
    want = {int(k): v for k, v in plain["report"]["losses"].items()}
    got = {int(k): v for k, v in faulty["report"]["losses"].items()}
    assert sorted(got) == list(range(1, 41)) and got == want  # every step's last loss, bit for bit
    assert faulty["report"]["goodput"]["badput"]["lost_progress_s"] >= 0


def test_a_stop_request_is_answered_by_a_snapshot_and_a_clean_exit(tmp_path):
    from workers.training.supervision.progress import TimelineReader
    from workers.training.supervision.stop_now import request_stop

    progress = tmp_path / "stopped" / "progress"
    asked = []

    def ask_when_training():
        reader = TimelineReader(progress)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if any(e.get("event") == "step" and e["step"] >= 8 for e in reader.read_new()):
                request_stop(progress, reason="a test asks")
                asked.append(time.monotonic())
                return
            time.sleep(0.05)

    thread = threading.Thread(target=ask_when_training, daemon=True)
    thread.start()
    result = _launch(tmp_path, "stopped", "--nproc", "2", "--snapshot-every", "50", steps=400)
    thread.join(5)
    assert asked, "the run never reached step 8"
    summary = result["summary"]
    stopped_at = summary["steps"]
    assert 8 <= stopped_at < 400, summary["steps"]
    # it kept the step it stopped at (a snapshot off the cadence) and said it stopped
    assert [s["step"] for s in summary["snapshots"]] == [stopped_at]
    events = [e for e in result["timeline"] if e.get("event") == "end"]
    assert events and events[-1]["step"] == stopped_at


def test_a_two_rank_snapshot_continues_on_one_rank(tmp_path):
    two = _launch(tmp_path, "two", "--nproc", "2", "--snapshot-every", "5", steps=10)
    snapshots = tmp_path / "two" / "snapshots"
    assert two["summary"]["snapshots"][-1]["step"] == 10
    one = _launch(
        tmp_path, "one", "--nproc", "1", "--snapshot-every", "5", "--snapshot-dir", str(snapshots), steps=15
    )
    assert one["summary"]["resumed"] == {
        "from": "step-00000010",
        "step": 10,
        "skipped": [],
        "seconds": one["summary"]["resumed"]["seconds"],
    }
    losses = one["summary"]["losses"]
    assert len(losses) == 5 and all(0 < x < two["summary"]["losses"][0] for x in losses)


@pytest.mark.long
def test_a_lightning_trainer_with_the_callback_recovers_from_its_own_checkpoint(tmp_path):
    example = EXAMPLE.parent / "lightning_module.py"
    plain = _launch(tmp_path, "plain", "--nproc", "2", "--snapshot-every", "8", steps=40, example=example)
    run = _launch(tmp_path, "lightning", "--nproc", "2", "--snapshot-every", "8", "--inject", "kill-rank@step=12",
                  steps=40, example=example)  # fmt: skip
    [fault] = run["report"]["faults"]
    assert fault["kind"] == "rank-killed" and (fault["resumed_from_step"] or 0) % 8 == 0, fault
    want = {int(k): v for k, v in plain["report"]["losses"].items()}
    got = {int(k): v for k, v in run["report"]["losses"].items()}
    # Lightning's own checkpoint restored exactly: every step's loss is the uninterrupted run's
    assert sorted(got) == list(range(1, 41)) and got == want
    assert sorted(p.name for p in (tmp_path / "lightning" / "snapshots").iterdir())
