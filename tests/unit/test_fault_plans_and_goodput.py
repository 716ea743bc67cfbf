"""Fault plans parse or say what is wrong; goodput accounts every second of a timeline to one bucket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from workers.reliability.elastic import ElasticWatch
from workers.reliability.faults import FaultInjector, flip_a_byte
from workers.reliability.goodput import goodput, kept_losses
from workers.training import examples
from workers.training.config import ConfigError, JobConfig
from workers.training.supervision.fault_plan import Fault, parse_faults
from workers.training.supervision.progress import ProgressWriter, TimelineReader, read_progress


def test_a_fault_plan_parses():
    assert parse_faults("kill-rank@step=17, hang-rank@step=40:rank=1,corrupt-snapshot@step=30") == [
        Fault("kill-rank", 17),
        Fault("hang-rank", 40, 1),
        Fault("corrupt-snapshot", 30),
    ]
    assert parse_faults("") == []
    assert parse_faults("drop-link@step=5:rank=1,drop-link@step=9") == [
        Fault("drop-link", 5, 1),
        Fault("drop-link", 9),
    ]
    assert str(Fault("hang-rank", 40, 1)) == "hang-rank@step=40:rank=1"


@pytest.mark.parametrize(
    "text, says",
    [
        ("kill-rank", "is not a fault: write kind@step=N"),
        ("explode@step=3", "'explode' is not a fault kind .known: kill-rank, hang-rank"),
        ("kill-rank@step=0", "the step must be >= 1"),
        ("corrupt-snapshot@step=3:rank=1", "corrupt-snapshot takes no rank"),
        ("kill-rank@step=-1", "is not a fault"),
        (",".join(["kill-rank@step=1"] * 101), "at most 100 faults"),
    ],
)
def test_a_bad_fault_plan_says_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        parse_faults(text)


def test_the_job_config_validates_its_fault_plan_and_restore_point():
    model = json.loads((examples.DIR / "tiny-dense.json").read_text())
    with pytest.raises(ConfigError, match="inject.*not a fault kind"):
        JobConfig.from_dict({"model": model, "inject": "boom@step=2"})
    with pytest.raises(ConfigError, match="resume_from.*snapshot name like step-00000020"):
        JobConfig.from_dict({"model": model, "resume_from": "../etc", "snapshot_dir": "/tmp/x"})
    cfg = JobConfig.from_dict({"model": model, "resume_from": "step-00000020", "snapshot_dir": "/tmp/x"})
    assert cfg.resume  # a restore resumes


def test_the_injector_checks_its_plan_against_the_run(tmp_path):
    with pytest.raises(ValueError, match="ranks 0-1"):
        FaultInjector("kill-rank@step=2:rank=5", world_size=2)
    with pytest.raises(ValueError, match="takes no snapshots"):
        FaultInjector("corrupt-snapshot@step=2", world_size=2)
    with pytest.raises(ValueError, match="control-plane worker"):
        FaultInjector("kill-worker@step=2", world_size=2)


def test_a_fault_fires_once_on_a_real_process_and_not_again_after_a_relaunch(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = tmp_path / "fired.json"
        injector = FaultInjector("hang-rank@step=3", world_size=2, state_path=state)
        doc = {"rank": 1, "pid": victim.pid, "phase": "training", "restart": 0}
        assert injector.poll({1: {**doc, "step": 2}}) == []  # not due yet
        fired = injector.poll({1: {**doc, "step": 3}})
        assert [(f.kind, f.rank, f.pid, f.detail) for f in fired] == [("hang-rank", 1, victim.pid, "SIGSTOP")]
        for _ in range(50):
            with open(f"/proc/{victim.pid}/stat") as f:
                if f.read().split(")")[1].split()[0] == "T":
                    break
            time.sleep(0.05)
        else:
            pytest.fail("the process was not stopped")
        assert injector.poll({1: {**doc, "step": 4}}) == []  # once
        again = FaultInjector("hang-rank@step=3", world_size=2, state_path=state)  # a relaunched supervisor
        assert again.pending == [] and again.poll({1: {**doc, "step": 9}}) == []
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()


def test_a_link_drop_outside_the_emulated_network_is_refused_and_recorded_not_a_fault(tmp_path):
    # this test's own process runs on the machine's network (no named namespace): nothing to take down
    injector = FaultInjector("drop-link@step=2:rank=1", world_size=2)
    watch = ElasticWatch(tmp_path, hang_timeout_s=60, injector=injector)
    rank1 = ProgressWriter(watch.dir, rank=1, restart=0)
    rank1.update("training", 2)
    watch.poll()
    [fired] = injector.fired
    assert fired.refused and fired.pid == os.getpid() and fired.detail.startswith("refused: ")
    assert "emulated two-tier network" in fired.detail or "iproute2" in fired.detail, fired.detail
    assert injector.links_down == {} and injector.pending == []  # not tried again at the next poll
    assert watch.faults == [] and [(e["kind"], e["refused"]) for e in watch.events] == [("drop-link", True)]
    rank1.close()


def test_faults_fire_in_the_order_written(tmp_path):
    injector = FaultInjector("corrupt-snapshot@step=2,kill-rank@step=3", world_size=2, snapshot_dir=tmp_path)
    doc = {"rank": 0, "pid": 2**22 + 12345, "phase": "training", "restart": 0, "step": 5}
    # no snapshot published yet: the corruption waits, and the kill after it waits too
    assert injector.poll({0: doc, 1: {**doc, "rank": 1}}) == []
    assert [str(f) for f in injector.pending] == ["corrupt-snapshot@step=2", "kill-rank@step=3"]


def test_flipping_a_byte_changes_exactly_one(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4)
    offset = flip_a_byte(path)
    data = path.read_bytes()
    assert [i for i in range(len(data)) if data[i] != (i % 256)] == [offset]


def test_progress_files_and_timeline_survive_a_line_cut_by_a_kill(tmp_path):
    w = ProgressWriter(tmp_path, rank=0, restart=0)
    w.update("training", 3)
    w.event("step", step=3, loss=1.5, step_time_s=0.1, stall_s=0.0)
    w.close()
    with (tmp_path / "timeline.jsonl").open("a") as f:
        f.write('{"event": "step", "step": 4, "lo')  # the process died mid-line
    w2 = ProgressWriter(tmp_path, rank=0, restart=1)
    w2.event("start")
    w2.close()
    reader = TimelineReader(tmp_path)
    assert [(e["event"], e["restart"]) for e in reader.read_new()] == [("step", 0), ("start", 1)]
    assert read_progress(tmp_path)[0]["step"] == 3 and read_progress(tmp_path)[0]["pid"] == os.getpid()


def _step(restart, step, t, dt=1.0, stall=0.0, loss=None):
    return {
        "event": "step",
        "restart": restart,
        "step": step,
        "t": t,
        "step_time_s": dt,
        "stall_s": stall,
        "loss": loss if loss is not None else 10.0 - step,
    }


def test_goodput_counts_a_re_run_step_as_lost_once_and_productive_once():
    launch = 100.0
    events = [
        {"event": "start", "restart": 0, "t": 102.0},  # 2 s torchrun + rendezvous
        {"event": "ready", "restart": 0, "t": 105.0},  # 3 s imports + model
        _step(0, 1, 106.0),
        _step(0, 2, 107.0, stall=0.5),
        _step(0, 3, 108.0),
        # rank killed after step 3 committed; restarted processes start at 110 (2 s after the last sign)
        {"event": "start", "restart": 1, "t": 110.0},
        {"event": "ready", "restart": 1, "t": 113.0},
        {"event": "resumed", "restart": 1, "t": 113.5, "from_step": 2, "seconds": 0.5},
        _step(1, 3, 114.5, loss=6.5),
        _step(1, 4, 115.5),
        {"event": "end", "restart": 1, "t": 116.0},
    ]
    g = goodput(events, launch_unix=launch, end_unix=117.0)
    assert g["wall_s"] == 17.0
    assert g["productive_s"] == 4.0  # steps 1, 2, 3 (second run), 4
    assert g["badput"] == {
        "startup_s": 2.0 + 3.0 + 3.0,
        "restore_s": 0.5,
        "snapshot_stall_s": 0.5,
        "lost_progress_s": 1.0,  # the first execution of step 3
        "fault_wait_s": 2.0,
        "other_s": 17.0 - 4.0 - 8.0 - 0.5 - 0.5 - 1.0 - 2.0,
    }
    assert g["goodput"] == round(4.0 / 17.0, 5)
    assert kept_losses(events) == {1: 9.0, 2: 8.0, 3: 6.5, 4: 6.0}  # step 3 from its last execution


def test_goodput_of_nothing_is_not_a_number_made_up():
    assert goodput([], launch_unix=5.0, end_unix=5.0)["goodput"] is None
    assert json.dumps(goodput([], launch_unix=5.0, end_unix=6.0))  # serialisable


def test_eti_multiplies_its_factors_and_names_what_is_missing():
    from workers.reliability.maturity import eti, goodput_factor, scaling_efficiency, utilisation

    se = scaling_efficiency(1500.0, 2, 1000.0, "measured one-device job 7")
    ut = utilisation(0.02, 0.1, "cluster spec device.peak_tflops.fp32")
    gp = goodput_factor({"goodput": 0.9, "wall_s": 100.0, "productive_s": 90.0, "badput": {"restore_s": 1.0}})
    out = eti([se, ut, gp])
    assert se.value == 0.75 and ut.value == 0.2 and out["eti"] == round(0.75 * 0.2 * 0.9, 5)
    assert out["factors"][0]["inputs"] == {
        "tokens_per_s": 1500.0,
        "world_size": 2,
        "one_device_tokens_per_s": 1000.0,
    }
    unknown = eti([se, utilisation(0.02, None, "no peak known for cpu"), gp])
    assert unknown["eti"] is None and unknown["missing"] == [
        "device_utilisation: no measured TFLOP/s or no device peak"
    ]


def test_maturity_level_is_the_highest_whose_criteria_all_hold():
    from workers.reliability.maturity import maturity

    plain = maturity({"strategy": {"dp": 2}}, from_plan=False, ran=True, max_restarts=3)
    assert plain["level"] == 1
    assert [c["name"] for c in plain["criteria"] if not c["met"]][0] == "strategy chosen by the planner"
    full = maturity({"comm_hook": "topk_ef", "snapshot_every": 10, "snapshot_memory_every": 2}, from_plan=True,
                    ran=True, max_restarts=3, recovered=2)  # fmt: skip
    assert full["level"] == 4  # L5 needs green scheduling besides risk prevention (on: snapshots, policy act)
    assert {c["name"]: (c["met"], c["available"]) for c in full["criteria"] if c["level"] == 5} == {
        "carbon-aware (green) scheduling": (False, True),
        "fault-risk prediction and prevention": (True, True),
    }
    green = {"comm_hook": "topk_ef", "snapshot_every": 10}
    assert maturity(green, from_plan=True, ran=True, max_restarts=3, green_scheduled=True)["level"] == 5
    observe = maturity(
        {**green, "risk_policy": "observe"}, from_plan=True, ran=True, max_restarts=3, green_scheduled=True
    )
    assert observe["level"] == 4 and not [c for c in observe["criteria"] if not c["available"]]
    assert full["extras"] == ["in-memory snapshot tier", "recovered from 2 fault(s) in this run"]
    no_restarts = maturity(
        {"comm_hook": "fp16", "snapshot_every": 10}, from_plan=True, ran=True, max_restarts=0
    )
    assert no_restarts["level"] == 3
    assert maturity({}, from_plan=True, ran=False, max_restarts=3)["level"] == 0  # planned, never ran


def test_two_kills_due_at_once_hit_two_groups_not_one():
    """A poll that comes late (the ranks already past both faults' steps) fires the first kill only; the
    second waits for the group torchrun restarts, so two injected kills are two faults, two restarts."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(4)]
    try:
        injector = FaultInjector("kill-rank@step=5,kill-rank@step=11:rank=0", world_size=2)
        first_group = {
            r: {"step": 12, "restart": 0, "phase": "training", "pid": procs[r].pid} for r in (0, 1)
        }
        fired = injector.poll(first_group)
        assert [(f.fault, f.rank) for f in fired] == [("kill-rank@step=5", 1)]
        assert procs[1].wait(5) == -9 and procs[0].poll() is None  # rank 0 of that group left alone
        assert injector.poll(first_group) == []  # the same group again (its rank 0 not yet restarted)
        second_group = {
            r: {"step": 11, "restart": 1, "phase": "training", "pid": procs[2 + r].pid} for r in (0, 1)
        }
        fired = injector.poll(second_group)
        assert [(f.fault, f.rank, f.restart) for f in fired] == [("kill-rank@step=11:rank=0", 0, 1)]
        assert procs[2].wait(5) == -9 and procs[3].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_an_injected_kill_whose_group_restarted_between_two_polls_is_still_the_injected_kill(tmp_path):
    """The watch fires the kill, and torchrun restarts the group before the next poll sees a rank dead: the
    restart it then finds is the injected kill's (CI, 2026-12-04: recorded as a plain 'rank-failed')."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        injector = FaultInjector("kill-rank@step=3", world_size=2)
        watch = ElasticWatch(tmp_path, hang_timeout_s=60, injector=injector)

        def progress(restart: int, step: int) -> None:
            for rank, proc in enumerate(procs):
                doc = {
                    "rank": rank,
                    "pid": proc.pid,
                    "node": "n",
                    "restart": restart,
                    "phase": "training",
                    "step": step,
                }
                (watch.dir / f"rank{rank}.json").write_text(json.dumps(doc))

        progress(0, 3)
        watch.poll()  # fires: rank 1 killed
        assert [f.fault for f in injector.fired] == ["kill-rank@step=3"] and procs[1].wait(5) == -9
        procs[1] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # its successor
        progress(1, 2)  # the restarted group, already training, before the watch looked again
        watch.poll()
        [fault] = watch.faults
        assert fault["kind"] == "rank-killed" and fault["rank"] == 1 and fault["restart"] == 0
        assert "injected fault kill-rank@step=3" in fault["message"]
        assert fault["fault_unix"] == injector.fired[0].fired_unix
    finally:
        for p in procs:
            p.kill()
            p.wait()
