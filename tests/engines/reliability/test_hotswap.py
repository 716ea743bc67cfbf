"""Hot swap: a data-parallel replica killed with SIGKILL is replaced while the survivor keeps training.

Real processes: a torchft Lighthouse, two replica processes (tiny example model, gloo, one torchft Manager
each) and a warm spare, supervised by :func:`workers.reliability.hotswap.run_hot_swap`, which SIGKILLs
replica 1 when it reports the fault's step committed.
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from workers.reliability.hotswap import run_hot_swap
from workers.training.config import JobConfig
from workers.training.examples import example

pytestmark = pytest.mark.slow

STEPS = 80
KILL_AT = 20


def tiny_job(**strategy) -> JobConfig:
    return JobConfig.from_dict(
        {
            "model": example("tiny-dense.json"),
            "strategy": {**example("dp2.json"), **strategy},
            "training": example("training.json"),
            "device": "cpu",
        }
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.long
def test_survivor_keeps_stepping_and_the_killed_replica_rejoins_with_equal_parameters(tmp_path):
    out = run_hot_swap(
        tiny_job(), 2, steps=STEPS, inject=[("kill-replica", KILL_AT)], run_dir=tmp_path, timeout_s=240
    )
    assert out["steps"] == STEPS and out["replicas"] == 2

    (fault,) = out["faults"]
    assert fault["kind"] == "replica-killed" and fault["replica"] == 1
    assert fault["step"] >= KILL_AT
    assert fault["rto_s"] is not None and fault["rejoin_s"] is not None
    assert fault["steps_lost"] == 0
    assert not alive(fault["pid_killed"])

    procs = {(p["replica"], p["attempt"]): p for p in out["replica_processes"]}
    survivor = procs[(0, 1)]
    # one process the whole run (never restarted), every step committed once, in order
    assert [p for p in out["replica_processes"] if p["replica"] == 0] == [survivor]
    assert survivor["pid"] != fault["pid_killed"] and survivor["finished"]
    assert (survivor["first_step"], survivor["last_step"], survivor["steps_committed"]) == (1, STEPS, STEPS)
    assert survivor["duplicate_commits"] == 0 and survivor["gaps"] == 0
    assert survivor["healed"] == []
    # it went on after the kill: it committed the steps after the one the victim reported
    assert fault["survivor_next_step"] is not None and fault["survivor_next_step"] > fault["step"]

    victim, successor = procs[(1, 1)], procs[(1, 2)]
    assert victim["pid"] == fault["pid_killed"] and not victim["finished"]
    assert successor["pid"] == fault["pid_restarted"] != victim["pid"]
    # the successor started from nothing and fetched the survivor's state: it jumped to the peers' step
    (heal,) = successor["healed"]
    assert heal["from_step"] == 0 and heal["to_step"] >= fault["step"]
    assert successor["finished"] and successor["duplicate_commits"] == 0 and successor["gaps"] == 0
    if successor["steps_committed"]:  # it rejoined before the end and trained beside the survivor
        assert successor["last_step"] == STEPS

    # model and optimizer state bit-identical at the rejoin and at the end
    assert out["checksums_equal_after_rejoin"] is True
    final = out["checksums"]["final"]
    assert set(final) == {0, 1} and final[0] == final[1]

    assert sorted(out["losses"]) == list(range(1, STEPS + 1))
    assert all(math.isfinite(v) for v in out["losses"].values())
    assert out["loss_last"] == out["losses"][STEPS] < out["losses"][1]
    assert 0 < out["goodput"]["goodput"] <= 1

    # nothing left running: every replica, the spare(s) and the Lighthouse are gone
    lighthouse = json.loads((tmp_path / "lighthouse.json").read_text())["pid"]
    assert not any(alive(p["pid"]) for p in out["replica_processes"])
    assert not alive(lighthouse)
    status = json.loads((tmp_path / "replica0.json").read_text())
    assert status["pid"] == survivor["pid"] and status["state"] == "done" and status["step"] == STEPS


@pytest.mark.parametrize(
    ("replicas", "inject", "strategy", "message"),
    [
        (1, [], {}, "replicas must be an integer >= 2"),
        (2, [("explode-replica", 3)], {}, "unknown fault kind 'explode-replica'"),
        (2, [("kill-replica", 0)], {}, "the step must be an integer in 1..9"),
        (2, [], {"tp": 2, "dp": 1}, "use restart recovery"),
        (2, [], {"zero_stage": 3}, "strategy.zero_stage"),
        (3, [], {}, "divisible by replicas*micro_batch_size (3*2)"),
    ],
)
def test_bad_input_is_a_value_error_that_says_what_to_change(tmp_path, replicas, inject, strategy, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        run_hot_swap(tiny_job(**strategy), replicas, steps=10, inject=inject, run_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # refused before anything was started


def test_a_negative_kill_delay_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match=re.escape("kill_delay_s must be a number >= 0, got -1")):
        run_hot_swap(tiny_job(), 2, steps=10, inject=[("kill-replica", 3)], run_dir=tmp_path, kill_delay_s=-1)
    assert not any(tmp_path.iterdir())
