"""The recovery watch under an elastic node range (``ElasticWatch(membership_changes=True)``): torchrun's
agents also restart a healthy group to let a node join (the restart count stays), so a rank that dies is
held until the next ranks start: on the same restart count the group re-formed (an event, no fault), on a
higher one it was a fault, reported with the time it was found. Ranks are real processes (``sleep``) that
write their progress as the runtime's ranks do."""

from __future__ import annotations

import subprocess
import time

import pytest

from workers.reliability.elastic import ElasticWatch
from workers.training.supervision.progress import ProgressWriter


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        p = subprocess.Popen(["sleep", "60"])
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def _rank(watch: ElasticWatch, rank: int, restart: int, proc: subprocess.Popen, step: int) -> None:
    """Rank ``rank`` as process ``proc``, training at ``step`` (as a ProgressWriter in it would write)."""
    writer = ProgressWriter(watch.dir, rank=rank, restart=restart)
    writer.pid = proc.pid
    writer.update("training", step)
    writer.close()


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def test_ranks_restarted_on_the_same_count_are_a_membership_change_not_a_fault(tmp_path, processes):
    watch = ElasticWatch(tmp_path, hang_timeout_s=60, membership_changes=True)
    first = processes()
    _rank(watch, 0, 0, first, 12)
    watch.poll()
    _kill(first)  # the agent stops its ranks to let a node join
    watch.poll()
    assert watch.faults == []  # held: the next ranks say what it was
    _rank(watch, 0, 0, processes(), 12)  # the group re-formed, same restart count
    watch.poll()
    watch.finish()
    assert watch.faults == []
    [event] = watch.events
    assert event["kind"] == "membership-change" and "re-formed" in event["message"]


def test_ranks_restarted_on_a_higher_count_make_the_death_a_fault_found_when_it_died(tmp_path, processes):
    faults = []
    watch = ElasticWatch(tmp_path, hang_timeout_s=60, membership_changes=True, on_fault=faults.append)
    first = processes()
    _rank(watch, 0, 0, first, 12)
    watch.poll()
    _kill(first)
    watch.poll()
    found = time.time()
    _rank(watch, 0, 1, processes(), 10)  # torchrun counted a failure
    watch.poll()
    [fault] = faults
    assert (fault["kind"], fault["rank"], fault["restart"]) == ("rank-failed", 0, 0)
    assert fault["detected_unix"] <= found and "exited during training" in fault["message"]
    assert watch.events == []


def test_without_an_elastic_range_a_dead_rank_is_a_fault_at_once(tmp_path, processes):
    watch = ElasticWatch(tmp_path, hang_timeout_s=60)
    first = processes()
    _rank(watch, 0, 0, first, 12)
    watch.poll()
    _kill(first)
    watch.poll()
    assert [f["kind"] for f in watch.faults] == ["rank-failed"]


def test_a_node_that_joins_keeps_the_directory_and_starts_at_the_ranks_restart_count(tmp_path, processes):
    running = ElasticWatch(tmp_path, hang_timeout_s=60, membership_changes=True)
    _rank(running, 0, 2, processes(), 30)
    joining = ElasticWatch(tmp_path, hang_timeout_s=60, membership_changes=True, fresh=False)
    assert (tmp_path / "progress" / "rank0.json").exists() and joining.restart == 2
    joining.poll()
    assert joining.faults == []  # the two restarts before it joined are not its to report


def test_a_fault_counts_the_steps_its_group_committed_after_it_was_found(tmp_path, processes):
    """Rank 1 dies after step 10; rank 0's step 11 reaches the timeline only after the fault was found (its
    last step before the group was stopped). The recovery gives the fault the group's real last step, and
    the steps lost from it."""
    recovered = []
    watch = ElasticWatch(tmp_path, hang_timeout_s=60, on_recovered=recovered.append)
    zero, one = processes(), processes()
    rank0 = ProgressWriter(watch.dir, rank=0, restart=0)
    rank0.pid = zero.pid
    for step in range(1, 11):
        rank0.event("step", step=step, loss=1.0)
    rank0.update("training", 10)
    _rank(watch, 1, 0, one, 10)
    watch.poll()
    _kill(one)
    watch.poll()
    [fault] = watch.faults
    assert fault["step"] == 10  # all the timeline said when the fault was found
    rank0.event("step", step=11, loss=1.0)  # committed a moment before the group was stopped
    rank0.close()
    _kill(zero)
    again = ProgressWriter(watch.dir, rank=0, restart=1)
    again.pid = processes().pid
    again.event("resumed", from_step=8, snapshot="step-00000008")
    again.event("step", step=9, loss=1.0)
    again.update("training", 9)
    again.close()
    watch.poll()
    [recovery] = recovered
    assert recovery["step"] == 11 and recovery["resumed_from_step"] == 8 and recovery["steps_lost"] == 3
