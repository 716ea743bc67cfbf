"""The straggler detector on synthetic step sequences shaped like synchronous data parallelism, the
step-time files it reads, and the degradations the bench applies (on real child processes).

The synthetic job: each rank computes for ``c_r`` seconds (log-normal jitter, rare 3x hiccups); the
all-reduce starts when the last rank arrives, so every rank's step lasts ``max(c) + comm`` and rank ``r``
waits ``max(c) - c_r + comm`` -- the shape the real 4-rank job shows (bench/fault_detect.py, tests/integration/test_fault_risk_jobs.py).
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time

import psutil
import pytest

from workers.reliability.degrade import CpuQuota, StopBursts
from workers.reliability.straggler import StragglerDetector, StragglerPolicy, StragglerWatch
from workers.training.supervision.step_times import StepTimesReader, StepTimesWriter


def sync_dp_steps(n_ranks, seconds, *, step_s=0.05, comm_s=0.01, jitter=0.15, extra=None, seed=0):
    """``(t, step, [(rank, step_time_s, wait_s)...])`` per step, ranks in a random order.
    ``extra(rank, t, step) -> seconds`` adds compute to a rank (a degradation)."""
    rng = random.Random(seed)
    t, step = 1000.0, 0
    while t < 1000.0 + seconds:
        step += 1
        c = []
        for r in range(n_ranks):
            ci = step_s * rng.lognormvariate(0.0, jitter)
            if rng.random() < 0.01:  # a scheduler hiccup: one rank's step 3x, anywhere
                ci *= 3
            c.append(ci + (extra(r, t, step) if extra else 0.0))
        longest = max(c)
        rows = [(r, longest + comm_s, longest - c[r] + comm_s) for r in range(n_ranks)]
        rng.shuffle(rows)
        t += longest + comm_s
        yield t, step, rows


def feed(det, steps, *, with_wait=True):
    raised = []
    for t, step, rows in steps:
        for rank, step_time, wait in rows:
            raised += det.observe(
                rank=rank,
                step=step,
                step_time_s=step_time,
                collective_wait_s=wait if with_wait else None,
                t=t,
            )
    return raised


def test_a_rank_slowed_to_half_speed_is_flagged_within_a_few_seconds_and_no_other():
    degraded_at = 1030.0

    def slow(rank, t, step):
        return 0.05 if rank == 5 and t >= degraded_at else 0.0

    det = StragglerDetector(8)
    raised = feed(det, sync_dp_steps(8, 60, extra=slow))
    assert [f.rank for f in raised] == [5]
    flag = raised[0]
    # two slow one-second buckets of five: flagged 1-3 s after the rank slowed down
    assert 1.0 <= flag.t - degraded_at <= 3.0, flag.t - degraded_at
    assert flag.signal == "compute" and flag.share > 0.3
    assert "rank 5" in flag.reason and "wait for it" in flag.reason
    assert det.scores()[5] == 1.0 and max(s for r, s in det.scores().items() if r != 5) < 0.5
    assert set(det.flagged()) == {5}


def test_stop_bursts_half_a_second_every_second_are_flagged():
    """SIGSTOP 0.5 s every 1 s, as the bench does to a real rank: one step of the rank absorbs each stop."""
    degraded_at = 1020.0
    bursts: set[int] = set()

    def stops(rank, t, step):
        if rank == 3 and t >= degraded_at and int(t) not in bursts:
            bursts.add(int(t))
            return 0.5
        return 0.0

    det = StragglerDetector(4)
    raised = feed(det, sync_dp_steps(4, 40, extra=stops, seed=3))
    assert [f.rank for f in raised] == [3]
    assert raised[0].t - degraded_at <= 5.0


def test_noisy_healthy_jobs_raise_no_flag():
    """Three minutes of 8 ranks with 30% jitter, 1% hiccups and a 0.8 s pause of a random rank every 20 s."""
    rng = random.Random(7)
    pauses = {}

    def pause(rank, t, step):
        slot = int(t // 20)
        if slot not in pauses:
            pauses[slot] = rng.randrange(8)
            return 0.8 if rank == pauses[slot] else 0.0
        return 0.0

    for seed in range(3):
        det = StragglerDetector(8)
        assert feed(det, sync_dp_steps(8, 180, jitter=0.3, extra=pause, seed=seed)) == []
        assert det.steps_scored > 1500
        assert max(det.scores().values()) < 1.0


def test_one_long_step_is_not_a_flag_but_two_slow_seconds_of_five_are():
    """Persistence: a 2 s step of one rank (a GC pause) is one slow bucket, the one its step ends in;
    slow again in a second bucket within five, the rank is flagged."""
    pauses_at = [1010.0]

    def pauses(rank, t, step):
        if rank == 1 and pauses_at and t >= pauses_at[0]:
            pauses_at.pop(0)
            return 2.0
        return 0.0

    det = StragglerDetector(4)
    assert feed(det, sync_dp_steps(4, 30, extra=pauses)) == []
    assert det.scores()[1] < 1.0

    pauses_at[:] = [1010.0, 1020.0]  # two pauses 10 s apart: never two slow buckets in five
    det = StragglerDetector(4)
    assert feed(det, sync_dp_steps(4, 30, extra=pauses)) == []

    pauses_at[:] = [1010.0, 1013.5]
    det = StragglerDetector(4)
    raised = feed(det, sync_dp_steps(4, 30, extra=pauses))
    assert [f.rank for f in raised] == [1]
    assert raised[0].t >= 1013.5


def test_the_straggler_is_the_rank_that_waits_least_not_the_one_with_the_longest_steps():
    """In synchronous DP every rank's step lasts as long as the slowest rank's: without the wait split the
    same job shows nothing, with it the slow rank stands out."""
    degraded_at = 1010.0

    def slow(rank, t, step):
        return 0.04 if rank == 2 and t >= degraded_at else 0.0

    steps = list(sync_dp_steps(4, 30, extra=slow))
    assert all(len({st for _, st, _ in rows}) == 1 for _, _, rows in steps)  # equal step times
    assert feed(StragglerDetector(4), steps, with_wait=False) == []
    assert [f.rank for f in feed(StragglerDetector(4), steps)] == [2]


def test_without_a_wait_measure_step_time_still_finds_an_unsynchronised_straggler():
    det = StragglerDetector(4)
    rng = random.Random(1)
    t, raised = 0.0, []
    for step in range(1, 600):
        t += 0.05
        for rank in range(4):
            d = 0.05 * rng.lognormvariate(0, 0.1) * (2.0 if rank == 0 and step > 200 else 1.0)
            raised += det.observe(rank=rank, step=step, step_time_s=d, t=t)
    assert [(f.rank, f.signal) for f in raised] == [(0, "step_time")]
    assert "step time only" in raised[0].reason


def test_a_flag_clears_when_the_rank_recovers_and_is_kept_in_the_history():
    def slow(rank, t, step):
        return 0.05 if rank == 0 and 1010.0 <= t < 1020.0 else 0.0

    det = StragglerDetector(4)
    feed(det, sync_dp_steps(4, 40, extra=slow))
    (episode,) = det.flags
    assert episode.rank == 0 and 1010.0 < episode.t < 1015.0
    # cleared once five buckets in a row were not slow: 5-6 s after the recovery, later if noise makes one
    assert episode.cleared_t is not None and 1025.0 < episode.cleared_t < 1033.0
    assert det.flagged() == {}
    report = det.report()
    assert json.loads(json.dumps(report))["flags"][0]["cleared_step"] == episode.cleared_step
    assert [r["flagged"] for r in report["ranks"]] == [False] * 4


@pytest.mark.parametrize("world_size", [1, 2])
def test_jobs_of_one_or_two_ranks_never_flag(world_size):
    def slow(rank, t, step):
        return 0.2 if rank == world_size - 1 else 0.0

    det = StragglerDetector(world_size)
    assert feed(det, sync_dp_steps(world_size, 30, extra=slow)) == []
    assert det.steps_scored == 0 and det.scores() == dict.fromkeys(range(world_size), 0.0)


def test_a_restart_starts_the_buckets_again_and_late_lines_of_the_old_group_are_ignored():
    det = StragglerDetector(4)
    feed(det, sync_dp_steps(4, 5))
    scored = det.steps_scored
    for r in range(4):  # the restarted group resumes at step 10 (its snapshot) and reports it
        det.observe(rank=r, step=10, step_time_s=0.05, collective_wait_s=0.01, t=2000.0, restart=1)
    assert det.restart == 1 and det.steps_scored == scored  # warm-up again
    assert det.observe(rank=0, step=11, step_time_s=9.0, collective_wait_s=0.0, t=2000.1, restart=0) == []
    assert det._pending == {}  # the old group's line was dropped, not kept waiting


def test_a_step_some_rank_never_reports_is_dropped_after_a_bound():
    det = StragglerDetector(4, StragglerPolicy(max_pending_steps=8))
    for step in range(1, 40):  # rank 3 died: nothing completes
        for r in range(3):
            det.observe(rank=r, step=step, step_time_s=0.05, collective_wait_s=0.01, t=float(step))
    assert len(det._pending) <= 9 and det.steps_scored == 0


def test_bad_reports_and_policies_are_refused():
    det = StragglerDetector(4)
    for bad in [{"rank": 4}, {"rank": -1}, {"rank": True}, {"step_time_s": -1.0}, {"step_time_s": math.nan}]:
        with pytest.raises(ValueError):
            det.observe(**{"rank": 0, "step": 1, "step_time_s": 0.1, **bad})
    with pytest.raises(ValueError):
        det.observe(rank=0, step=1, step_time_s=0.1, collective_wait_s=math.inf)
    with pytest.raises(ValueError):
        StragglerDetector(0)
    for bad in [{"min_ranks": 1}, {"slow_buckets": 6}, {"bucket_s": 0}, {"min_share": math.nan}]:
        with pytest.raises(ValueError):
            StragglerPolicy(**bad)


# --------------------------------------------------------------------------- files: writer, reader, watch


def test_step_lines_written_by_every_rank_reach_the_detector_through_the_files(tmp_path):
    """Writers on each rank, the watch following the files (partial lines and all), as a supervisor would."""
    writers = [StepTimesWriter(tmp_path, r, restart=0) for r in range(4)]
    watch = StragglerWatch(tmp_path, 4, clock=lambda: 5000.0)
    flags = []
    for t, step, rows in sync_dp_steps(4, 20, extra=lambda r, t, s: 0.06 if r == 2 and t > 1008 else 0.0):
        for rank, step_time, wait in rows:
            writers[rank].record(step, wait_s=wait, step_time_s=step_time, at=t)
        flags += watch.poll()
    for w in writers:
        w.close()
    assert [f["rank"] for f in flags] == [2] and flags[0]["detected_unix"] == 5000.0
    assert watch.samples > 4 * 200


def test_the_reader_keeps_a_half_written_line_for_the_next_read(tmp_path):
    path = tmp_path / "steps_rank1.jsonl"
    path.write_text('{"step": 1, "t": 1.0, "step_s": 0.1, "wait_s": 0.0}\n{"step": 2, "t"')
    reader = StepTimesReader(tmp_path)
    assert [(d["rank"], d["step"]) for d in reader.read_new()] == [(1, 1)]
    with path.open("a") as f:
        f.write(': 2.0, "step_s": 0.1, "wait_s": null}\n')
    assert [(d["rank"], d["step"], d["wait_s"]) for d in reader.read_new()] == [(1, 2, None)]
    (tmp_path / "steps_rankX.jsonl").write_text('{"step": 1}\n')  # not a rank's file
    assert reader.read_new() == []


def test_a_writer_measures_the_time_between_its_lines(tmp_path):
    w = StepTimesWriter(tmp_path, 0, restart=2)
    w.record(1, wait_s=0.01)
    time.sleep(0.05)
    w.record(2, wait_s=-1e-9)  # a clock's rounding below zero is no wait
    w.close()
    first, second = StepTimesReader(tmp_path).read_new()
    assert first["step_s"] is None and first["restart"] == 2
    assert 0.045 <= second["step_s"] < 1.0 and second["wait_s"] == 0.0


# ------------------------------------------------------------------------- degradations, on real processes


@pytest.fixture
def busy_child():
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()


def test_stop_bursts_stop_a_real_process_and_leave_it_running(busy_child):
    bursts = StopBursts(busy_child.pid, stop_s=0.1, every_s=0.2).start()
    states = []
    for _ in range(40):
        states.append(psutil.Process(busy_child.pid).status())
        time.sleep(0.01)
    bursts.stop()
    assert psutil.STATUS_STOPPED in states and bursts.bursts >= 2
    assert bursts.started_unix is not None
    time.sleep(0.05)
    assert psutil.Process(busy_child.pid).status() != psutil.STATUS_STOPPED


@pytest.mark.skipif(not CpuQuota.available()[0], reason=CpuQuota.available()[1])
def test_a_cpu_quota_really_slows_a_process_and_is_released(busy_child):
    proc = psutil.Process(busy_child.pid)
    quota = CpuQuota(busy_child.pid, 0.05).apply()
    try:
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(0.6)
        share = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
    finally:
        group = quota.group
        quota.release()
    assert share < 0.15, share  # 5% of a core, CFS periods of 100 ms
    assert not group.exists()
