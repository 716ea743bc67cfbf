"""Fault risk on a real job through the control plane: a 4-rank job launched through the API, its node's
supervisor streaming telemetry and risk, one rank degraded mid-run from outside.

The job is the project's runtime under torchrun on 4 CPU ranks (DDP over gloo), supervised by the Celery
worker of the session's live stack, whose risk watch (``workers.reliability.risk_watch``) follows the ranks'
step lines. After ``HEALTHY_S`` seconds of training rank 3 is stopped (SIGSTOP) for 0.5 s every second until
a ``risk`` event flags a rank. One job, three checks: its healthy first part (the detector's five one-second
buckets filled) must raise no flag -- the "no flag on a healthy run of the same job" check, without doubling
the test's time --, the degraded part must flag rank 3, and only rank 3, while it is degraded, and the high risk must trigger the prevention loop's first actions: a warning, then a snapshot now,
which the ranks take off the job's cadence while the job goes on training.

The time to flag is timed from the degradation's first stop to the watch publishing the flag, and bounded by
what the product promises (issue 14: 10 s) plus a slack said here: on CI the job shares two cores with
another test file's processes, whose load is noise in every healthy rank's compute time (the detector's
pooled spread), so a degraded bucket can miss the outlier cut and the flag waits for the next slow one (CI
flagged after 10.3 s once, 2026-12-04: one or two buckets late). ``bench/fault_detect.py`` measures the
10 s goal itself, healthy and degraded runs side by side; the delay here goes into the JUnit report
(``flag_delay_s``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.test_jobs import example, wait_for_state
from workers.reliability.degrade import StopBursts
from workers.training.supervision.progress import read_progress

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RANKS = 4
DEGRADED_RANK = 3
HEALTHY_S = 7.0  # > the detector's 5 one-second buckets of history, after its warm-up steps
GOAL_S = 10.0  # issue 14: flagged within 10 s of the degradation
LOAD_SLACK_S = 10.0  # a loaded 2-core machine: degraded buckets lost in the co-scheduled tests' noise
FLAG_BOUND_S = GOAL_S + LOAD_SLACK_S


def risk_events(stream: str) -> list[dict]:
    from controlplane.live.models import StreamEvent

    return [e.values for e in StreamEvent.objects.filter(stream=stream, kind="risk").order_by("seq")]


def test_a_rank_degraded_mid_job_is_flagged_live_and_not_before(live_stack, alice_api, record_property):
    from controlplane.jobs.models import TrainingJob

    body = {
        "name": "four ranks, one degraded",
        "model": example("tiny-dense.json"),
        "strategy": {**example("dp2.json"), "dp": RANKS},
        "training": {**example("training.json"), "global_batch_size": 2 * RANKS},
        "steps": 100_000,  # stopped by the test
        "device": "cpu",
        "snapshot_every": 100_000,  # protected, but no periodic snapshot while the test runs
    }
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    job = TrainingJob.objects.get(pk=r.json()["id"])
    # the worker's var directory is the stack's own: its job directory holds the ranks' progress files
    progress = Path(live_stack.env["CANN_TRAIN_VAR_DIR"]) / "jobs" / str(job.pk) / "attempt-1" / "progress"
    bursts = None
    try:
        deadline = time.monotonic() + 90
        while not (
            (ranks := read_progress(progress))
            and len(ranks) == RANKS
            and all((d.get("step") or 0) >= 1 for d in ranks.values())
        ):
            job.refresh_from_db()
            assert not job.is_finished, (job.state, job.human_readable_error, job.log_tail)
            assert time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.2)
        # healthy until a risk event (one per telemetry sample, 5 s apart) shows the detector's five
        # one-second buckets of history filled. Not a promise of the product (the 10 s goal below is, timed
        # from the degradation): a bound for a loaded machine, where the node's watch started scoring only
        # after 22 s once (CI, 2026-12-03, the job training ~15 steps/s all along)
        healthy_until = time.monotonic() + HEALTHY_S + 60.0
        while time.monotonic() < healthy_until:
            healthy = risk_events(job.stream)
            if healthy and healthy[-1]["straggler"]["buckets_scored"] >= 5:
                break
            time.sleep(0.2)
        assert healthy and healthy[-1]["straggler"]["buckets_scored"] >= 5, (  # what the watch saw, whole
            len(healthy),
            [(e["straggler"], [r["rank"] for r in e["ranks"]]) for e in healthy[-3:]],
            sorted((r, d.get("step")) for r, d in read_progress(progress).items()),
        )
        assert not [e for e in healthy if "flag" in e], [e["flag"] for e in healthy if "flag" in e]
        risk = alice_api.get(f"/api/jobs/{job.pk}/").json()["risk"]
        assert risk["level"] == "low" and risk["badge"] == "low" and risk["flags"] == risk["actions"] == []
        assert risk["protected"] is True and len(risk["nodes"]) == 1
        assert {row["rank"] for row in healthy[-1]["ranks"]} == set(range(RANKS))
        assert healthy[-1]["level"] == "low"

        # stops 1 +- 0.2 s apart: strictly periodic ones can lock onto the phase of the step where the rank
        # sits in its gradient all-reduce, where a stopped rank and its waiting peers look the same
        # (workers/reliability/degrade.py); the stalls they stand for have no such phase
        bursts = StopBursts(
            ranks[DEGRADED_RANK]["pid"], stop_s=0.5, every_s=1.0, jitter_s=0.2, seed=1
        ).start()
        flags = []
        while not flags and time.time() - bursts.started_unix < FLAG_BOUND_S + 3.0:
            flags = [e for e in risk_events(job.stream) if e.get("flag", {}).get("event") == "raised"]
            time.sleep(0.1)
        # the prevention loop: warned, a snapshot asked for and taken, and the job trains on after it
        actions, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline and not any(a["status"] == "done" for a in actions[1:]):
            actions = [e["action"] for e in risk_events(job.stream) if "action" in e]
            time.sleep(0.2)
        bursts.stop()
        done = [a for a in actions if a["action"] == "snapshot-now" and a["status"] == "done"]
        assert done, actions
        trained_after, deadline = 0, time.monotonic() + 30
        while time.monotonic() < deadline and trained_after < 20:
            newest = max(d.get("step") or 0 for d in read_progress(progress).values())
            trained_after = newest - done[0]["outcome"]["step"]
            time.sleep(0.2)
    finally:
        if bursts is not None:
            bursts.stop()
        alice_api.post(f"/api/jobs/{job.pk}/cancel/")
    assert flags, f"no flag {FLAG_BOUND_S + 3:.0f} s after the degradation: {risk_events(job.stream)[-1:]}"
    flag = flags[0]["flag"]
    assert {e["flag"]["rank"] for e in flags} == {DEGRADED_RANK}, [e["flag"] for e in flags]
    delay = flag["detected_unix"] - bursts.started_unix
    record_property("flag_delay_s", round(delay, 2))
    # when: the flagging step's end after the degradation's start, the flag seen after that step
    evidence = {"delay_s": delay, "step_end_s": flag["t"] - bursts.started_unix, "flag": flag}
    assert 0 < delay <= FLAG_BOUND_S, evidence
    assert flag["t"] >= bursts.started_unix and flag["signal"] == "compute"
    assert f"rank {DEGRADED_RANK} " in flag["reason"] and "wait for it" in flag["reason"]
    assert flags[0]["level"] == "high" and flags[0]["risk"] == 1.0
    risk = alice_api.get(f"/api/jobs/{job.pk}/").json()["risk"]
    assert risk["badge"] == "high" and [f["rank"] for f in risk["flags"]][:1] == [DEGRADED_RANK]
    assert [(a["action"], a["status"]) for a in risk["actions"]][:4] == [
        ("warn", "sent"),
        ("snapshot-now", "requested"),
        ("snapshot-now", "done"),
        ("drain", "refused"),  # one node, not elastic: nowhere to go on
    ], risk["actions"]
    assert "not elastic" in risk["actions"][3]["note"]
    outcome = done[0]["outcome"]
    assert outcome["step"] >= flag["step"] and outcome["stall_s"] >= 0 and outcome["snapshot"]
    assert outcome["previous_snapshot_step"] is None and outcome["steps_protected"] is None  # the first one
    assert f"rank {DEGRADED_RANK} " in done[0]["reason"] and done[0]["risk"] >= 0.85
    assert trained_after >= 20, "the job did not train on after its snapshot"
    snapshots = alice_api.get(f"/api/jobs/{job.pk}/").json()["snapshots"]
    assert any(s["step"] == outcome["step"] for s in snapshots), snapshots
    assert wait_for_state(job.pk, {"cancelled", "failed", "succeeded"}, timeout=60).state == "cancelled"


@pytest.mark.long
def test_a_straggling_node_of_an_elastic_job_is_snapshotted_drained_and_the_job_goes_on(
    live_stack, alice_api
):
    """Two node workers (node-a, node-b) run an elastic job (1-2 nodes, 2 ranks each). A rank of node-b is
    stopped in bursts: node 0's risk watch (the nodes share this machine's progress directory, so it scores
    all four ranks) flags it, asks for a snapshot now, then drains node-b through the control plane. The
    group re-forms on node-a alone (4 -> 2 ranks, resharded from that snapshot), node-b is not taken back,
    and the job goes on training."""
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.selectors import online_node_queues
    from controlplane.stack import stop
    from tests.conftest import wait_for
    from tests.integration.test_elastic_jobs import group_starts, start_node_worker, training_on
    from tests.integration.test_job_restore_api import job_body

    workers = {name: start_node_worker(live_stack, name) for name in ("node-a", "node-b")}
    bursts = None
    try:
        wait_for(lambda: online_node_queues() == ["node.node-a", "node.node-b"], 60, "two node workers")
        body = job_body(strategy={"dp": 4}, steps=100_000, max_nodes=2, min_nodes=1, snapshot_every=1000,
                        max_restarts=5, profile_every=0)  # fmt: skip
        r = alice_api.post("/api/jobs/", body, format="json")
        assert r.status_code == 201, r.content
        job_id, stream = r.json()["id"], r.json()["stream"]
        wait_for(lambda: training_on(stream, 4, 10), 120, "both nodes to train together")
        progress = (
            Path(live_stack.env["CANN_TRAIN_VAR_DIR"]) / "jobs" / str(job_id) / "attempt-1" / "progress"
        )
        on_b = sorted(r for r, d in read_progress(progress).items() if d.get("node") == "node-b")
        assert len(on_b) == 2, read_progress(progress)
        together = group_starts(stream)[-1][0]
        bursts = StopBursts(read_progress(progress)[on_b[-1]]["pid"], stop_s=0.5, every_s=1.0, jitter_s=0.2,
                            seed=2).start()  # fmt: skip

        def drained():
            actions = [e["action"] for e in risk_events(stream) if "action" in e]
            return [a for a in actions if a["action"] == "drain"] and actions

        actions = wait_for(drained, 60, "the risk watch to drain node-b")
        bursts.stop()
        # the drain's answer first: a refused one (and why) is the failure, not a regroup that never comes
        steps = [(a["action"], a["status"]) for a in actions]
        assert steps[:4] == [("warn", "sent"), ("snapshot-now", "requested"), ("snapshot-now", "done"),
                             ("drain", "done")], actions  # fmt: skip
        wait_for(lambda: training_on(stream, 2, 10, after_seq=together), 120, "node-a to go on alone")
        # the survivors' restart is a recovery of theirs (a rank fault, recovered when they train again)
        job = wait_for(
            lambda: (j := TrainingJob.objects.get(pk=job_id)).state == "running" and j,
            60,
            "the job running again",
        )
        assert job.attempts == 1, (job.state, job.human_readable_error)
        alice_api.post(f"/api/jobs/{job_id}/cancel/")
        job = wait_for(lambda: (j := TrainingJob.objects.get(pk=job_id)).is_finished and j, 60, "the cancel")
    finally:
        if bursts is not None:
            bursts.stop()
        stop(list(workers.values()))
    drain = actions[3]
    assert drain["drain_node"] == "node-b" and drain["nodes_left"] == 1 and "rank" in drain["reason"]
    [fault] = job.faults.filter(kind="node-drained")
    assert (fault.node_rank, fault.node_name) == (1, "node-b") and "fault-risk loop" in fault.message
    # node-b was not offered back to the attempt it was drained from
    nodes = list(job.nodes.filter(attempt=1).values_list("node_name", flat=True))
    assert nodes == ["node-a", "node-b"], nodes
    assert job.state == "cancelled"


def test_a_hung_rank_raises_the_risk_at_once_and_the_hang_is_cut_well_before_its_timeout(
    live_stack, alice_api, record_property
):
    """A rank stopped for good (the injected ``hang-rank``) commits no step, nor do its peers: the risk
    rises within seconds naming it, and under the default ``act`` policy the hang is cut at a quarter of the
    job's 60 s hang timeout (15 s), not at 60 s; torchrun restarts the group from its snapshot and the job
    succeeds."""
    from controlplane.live.models import StreamEvent

    body = {
        "name": "a rank hangs",
        "model": example("tiny-dense.json"),
        "strategy": example("dp2.json"),
        "training": example("training.json"),
        "steps": 40,
        "device": "cpu",
        "snapshot_every": 5,
        "hang_timeout_s": 60,
        "inject": "hang-rank@step=12:rank=1",
    }
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    job = wait_for_state(r.json()["id"], {"succeeded", "failed"}, timeout=240)
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    [fault] = job.faults.all()
    assert fault.kind == "rank-hung" and fault.rank == 1, (fault.kind, fault.rank, fault.message)
    assert "cut early by the job's risk policy" in fault.message, fault.message
    # when the rank stopped: its last step committed (the step line the stall is timed from)
    trained = StreamEvent.objects.filter(stream=job.stream, kind="train", values__restart=0).order_by("seq")
    hung_at = trained.last().time
    stalled = [e for e in risk_events(job.stream) if (e.get("stall") or {}).get("stopped")]
    assert stalled and stalled[0]["stall"]["ranks"] == [1], risk_events(job.stream)[-3:]
    first = (
        StreamEvent.objects.filter(stream=job.stream, kind="risk", values__stall__isnull=False)
        .exclude(values__stall=None)
        .order_by("seq")
        .first()
    )
    rise_s = (first.time - hung_at).total_seconds()
    cut_s = (fault.detected_at - hung_at).total_seconds()
    record_property("risk_rise_s", round(rise_s, 2))
    record_property("hang_cut_s", round(cut_s, 2))
    print(f"risk rose {rise_s:.2f} s after the last step; the hang was cut after {cut_s:.2f} s")
    # the risk: medium at the 4 s stall threshold (10 s: the README's detection goal); the cut: at 15 s,
    # with a slack for a loaded machine, and far from the 60 s timeout
    assert rise_s <= 10.0, rise_s
    assert 14.0 <= cut_s <= 30.0, cut_s
    actions = [
        (e["action"]["action"], e["action"]["status"]) for e in risk_events(job.stream) if "action" in e
    ]
    assert ("cut-hang", "requested") in actions and ("snapshot-now", "requested") not in actions, actions
