"""A stall (``NodeRiskWatch.stall``): a group that commits no step while training raises the node's risk
at once -- medium after the stall threshold, high at twice it --, names a stopped rank, and at high risk asks
the recovery watch to cut the hang early (``cut-hang``), once; nothing is raised for a group that is not
training, and the risk falls when steps come again. The recovery watch's side (``ElasticWatch.cut_hang``):
a cut it will make sooner than its hang timeout is requested, one it would not is refused."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from tests.unit.test_risk_watch import write_job
from workers.reliability.elastic import ElasticWatch
from workers.reliability.risk.policy import PreventionPolicy
from workers.reliability.risk_watch import STALL_FLOOR_S, NodeRiskWatch

RANKS = [0, 1, 2, 3]
SECONDS = 5  # of synthetic steps from t=1000, ~60 ms each: the stall threshold is the 4 s floor


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stopped_process():
    """A real process stopped with SIGSTOP: the hung rank."""
    proc = subprocess.Popen(["sleep", "60"])
    proc.send_signal(signal.SIGSTOP)
    yield proc.pid
    proc.kill()
    proc.wait()


def progress(directory, phase="training", pids=None):
    for r in RANKS:
        doc = {"rank": r, "pid": (pids or {}).get(r, subprocess.os.getpid()), "restart": 0, "phase": phase,
               "step": 80}  # fmt: skip
        (directory / f"rank{r}.json").write_text(json.dumps(doc))


def watching(tmp_path, events, cuts, **kw):
    clock = Clock(1000.0 + SECONDS)
    watch = NodeRiskWatch(
        tmp_path,
        node="n0",
        node_rank=0,
        local_ranks=4,
        publish=lambda kind, values, step: events.append((kind, values, step)),
        collectors=[],
        clock=clock,
        cut_hang=lambda after_s, why: (
            cuts.append((after_s, why)) or {"status": "requested", "after_s": after_s}
        ),
        hang_timeout_s=60.0,
        protected=True,
        **kw,
    )
    return watch, clock


def risks(events):
    return [v for k, v, _ in events if k == "risk" and "action" not in v]


def actions(events):
    return [v["action"] for k, v, _ in events if k == "risk" and "action" in v]


def test_a_stopped_rank_raises_the_risk_at_once_and_the_hang_is_cut_early(tmp_path, stopped_process):
    write_job(tmp_path, RANKS, SECONDS)
    progress(tmp_path, pids={2: stopped_process})
    events, cuts = [], []
    watch, clock = watching(tmp_path, events, cuts)
    watch.poll()
    assert watch.stall() is None and risks(events) == []  # steps until now: nothing to say
    last = watch._last_line_unix
    clock.now = last + STALL_FLOOR_S - 0.5
    watch.poll()
    assert risks(events) == []  # within the threshold: a pause, not a stall
    clock.now = last + STALL_FLOOR_S + 0.5
    watch.poll()  # no telemetry sample is due: the stall is said at once
    [medium] = risks(events)
    assert medium["level"] == "medium" and medium["stall"]["ranks"] == [2] and medium["stall"]["stopped"]
    [two] = [r for r in medium["ranks"] if r["rank"] == 2]
    assert two["flagged"] and "its process is stopped" in two["reason"] and two["score"] == medium["risk"]
    assert [a["action"] for a in actions(events)] == ["warn"] and cuts == []
    clock.now = last + 2 * STALL_FLOOR_S + 0.1
    watch.poll()
    high = risks(events)[-1]
    assert high["level"] == "high" and high["risk"] >= 0.85
    # high: no snapshot (the ranks cannot take one), the hang cut at a quarter of the 60 s timeout
    assert [(a["action"], a["status"]) for a in actions(events)] == [
        ("warn", "sent"),
        ("cut-hang", "requested"),
    ]
    assert cuts == [(15.0, actions(events)[-1]["reason"])] and "rank 2 committed no step" in cuts[0][1]
    clock.now += 5
    watch.poll()
    assert len(cuts) == 1  # once a stall
    # steps again (the group restarted): the stall is over, said at once
    write_job(tmp_path, RANKS, SECONDS, restart=1)
    clock.now = 1000.0 + SECONDS
    watch.poll()
    assert risks(events)[-1]["stall"] is None and watch._stall_cut is False


def test_a_group_that_is_not_training_is_not_stalled(tmp_path):
    write_job(tmp_path, RANKS, SECONDS)
    progress(tmp_path, phase="finishing")
    events, cuts = [], []
    watch, clock = watching(tmp_path, events, cuts)
    watch.poll()
    clock.now = watch._last_line_unix + 10 * STALL_FLOOR_S
    watch.poll()
    assert watch.stall() is None and risks(events) == [] and cuts == []


def test_under_observe_the_cut_is_observed_not_made_and_every_rank_is_named_without_a_stopped_one(tmp_path):
    write_job(tmp_path, RANKS, SECONDS)
    progress(tmp_path)
    events, cuts = [], []
    watch, clock = watching(tmp_path, events, cuts, prevention=PreventionPolicy(mode="observe"))
    watch.poll()
    clock.now = watch._last_line_unix + 3 * STALL_FLOOR_S
    watch.poll()
    assert risks(events)[-1]["stall"]["ranks"] == RANKS and not risks(events)[-1]["stall"]["stopped"]
    assert [(a["action"], a["status"]) for a in actions(events)] == [
        ("warn", "sent"),
        ("cut-hang", "observed"),
    ]
    assert cuts == []


def test_the_recovery_watch_takes_a_cut_only_sooner_than_its_hang_timeout(tmp_path):
    watch = ElasticWatch(tmp_path, hang_timeout_s=60.0)
    assert watch.cut_hang(15.0, "stalled")["status"] == "requested" and watch._cut == (15.0, "stalled")
    late = ElasticWatch(tmp_path / "late", hang_timeout_s=10.0)
    assert late.cut_hang(15.0, "stalled")["status"] == "refused" and late._cut is None
    with pytest.raises(ValueError):
        watch.cut_hang(0, "stalled")
