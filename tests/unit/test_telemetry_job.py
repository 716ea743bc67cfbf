"""The job's own signals: per-rank last / EWMA / median of step time and collective wait, heartbeat age."""

from __future__ import annotations

import statistics
import threading

import pytest

from workers.reliability.telemetry.job import METRICS, JobSignals


class ManualClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_summaries_follow_the_steps_each_rank_reports():
    clock = ManualClock()
    signals = JobSignals(window=4, clock=clock)
    steps = [0.50, 0.52, 0.49, 0.51, 0.90, 0.95]  # rank 1 slows down at step 5
    for step, seconds in enumerate(steps, start=1):
        clock.t += seconds
        signals.record_step(rank=0, step=step, step_time_s=0.5, collective_wait_s=0.05)
        signals.record_step(rank=1, step=step, step_time_s=seconds, collective_wait_s=seconds / 10)
    r = signals.sample().values
    alpha = 2 / (4 + 1)
    ewma = steps[0]
    for s in steps[1:]:
        ewma = alpha * s + (1 - alpha) * ewma
    assert r["job.rank1.step_time_last_s"] == 0.95
    assert r["job.rank1.step_time_ewma_s"] == pytest.approx(ewma)
    assert r["job.rank1.step_time_p50_s"] == statistics.median(steps[-4:])
    assert r["job.rank1.collective_wait_last_s"] == pytest.approx(0.095)
    assert r["job.rank0.step_time_p50_s"] == 0.5
    assert r["job.rank1.step"] == 6
    assert r["job.rank0.heartbeat_age_s"] == 0.0


def test_heartbeat_age_grows_until_the_rank_speaks_again():
    clock = ManualClock()
    signals = JobSignals(clock=clock)
    signals.record_step(rank=3, step=10, step_time_s=1.0)
    clock.t += 7.5
    r = signals.sample()
    assert r.values["job.rank3.heartbeat_age_s"] == 7.5
    assert "no collective_wait recorded" in r.absent["job.rank3.collective_wait_last_s"]
    signals.heartbeat(3)
    assert signals.sample().values["job.rank3.heartbeat_age_s"] == 0.0


def test_no_steps_yet_is_said_and_bad_input_is_refused():
    signals = JobSignals()
    assert signals.sample().absent == {"job": "no step recorded yet"}
    for bad in ({"rank": -1}, {"rank": True}, {"step_time_s": float("nan")}, {"collective_wait_s": -0.1}):
        kwargs = {"rank": 0, "step": 1, "step_time_s": 1.0} | bad
        with pytest.raises(ValueError):
            signals.record_step(**kwargs)
    with pytest.raises(ValueError, match="window"):
        JobSignals(window=0)


def test_names_are_the_declared_ones_and_feeding_from_threads_is_safe():
    signals = JobSignals(window=8)

    def feed(rank: int) -> None:
        for step in range(500):
            signals.record_step(rank=rank, step=step, step_time_s=0.1 * (rank + 1), collective_wait_s=0.01)

    threads = [threading.Thread(target=feed, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r = signals.sample()
    assert {k.replace(k.split(".")[1], "rank{rank}") for k in r.values} == set(METRICS)
    assert all(r.values[f"job.rank{k}.step"] == 499 for k in range(4))
