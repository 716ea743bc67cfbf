"""A node's fault-risk loop (``workers.reliability.risk_watch``): step lines in, ``telemetry`` and ``risk``
events out, on the poller's thread."""

from __future__ import annotations

import time

import pytest

from tests.unit.test_straggler import sync_dp_steps
from workers.reliability.risk.policy import risk_level
from workers.reliability.risk_watch import NodeRiskWatch
from workers.training.supervision.step_times import StepTimesWriter


def write_job(directory, ranks, seconds, slow_rank=None, slow_after=1008.0, restart=0):
    """Step lines of ``ranks`` (job rank numbers) as their writers would put them, one slowed after a time."""
    writers = {r: StepTimesWriter(directory, r, restart=restart) for r in ranks}
    for t, step, rows in sync_dp_steps(
        len(ranks), seconds, extra=lambda i, t, s: 0.06 if ranks[i] == slow_rank and t > slow_after else 0.0
    ):
        for i, step_time, wait in rows:
            writers[ranks[i]].record(step, wait_s=wait, step_time_s=step_time, at=t)
    for w in writers.values():
        w.close()


def watch_for(tmp_path, events, **kw):
    return NodeRiskWatch(
        tmp_path,
        node=kw.pop("node", "n1"),
        node_rank=kw.pop("node_rank", 1),
        local_ranks=kw.pop("local_ranks", 4),
        publish=lambda kind, values, step: events.append((kind, values, step)),
        collectors=[],
        clock=lambda: 5000.0,
        **kw,
    )


def test_a_straggler_among_a_nodes_ranks_is_one_risk_event_named_by_its_job_rank(tmp_path):
    """Node 1 runs job ranks 4-7 in a directory of its own: rank 6 is flagged as rank 6, at once."""
    write_job(tmp_path, [4, 5, 6, 7], 20, slow_rank=6)
    events = []
    watch = watch_for(tmp_path, events)
    watch.poll()
    raised = [v for k, v, _ in events if k == "risk" and v.get("flag", {}).get("event") == "raised"]
    assert len(raised) == 1
    flag = raised[0]["flag"]
    assert flag["rank"] == 6 and flag["reason"].startswith("rank 6 ") and flag["detected_unix"] == 5000.0
    assert raised[0]["risk"] == 1.0 and raised[0]["level"] == "high" and raised[0]["node"] == "n1"
    assert {r["rank"] for r in raised[0]["ranks"]} == {4, 5, 6, 7}
    assert "no failure model" in raised[0]["failure"]["absent"]
    assert watch.flags == [flag] and watch.report()["scored_ranks"] == [4, 5, 6, 7]


def test_telemetry_events_carry_what_is_absent_once_and_a_risk_score_each(tmp_path):
    write_job(tmp_path, [0, 1, 2, 3], 3)
    events = []
    watch = watch_for(tmp_path, events, node_rank=0, telemetry_every_s=0.05).start()
    time.sleep(0.3)
    watch.stop()
    telemetry = [v for k, v, _ in events if k == "telemetry"]
    risk = [v for k, v, _ in events if k == "risk"]
    assert len(telemetry) >= 3 and len(risk) == len(telemetry) + 1  # one per sample, one as it stops
    assert telemetry[0]["node"] == "n1" and telemetry[0]["node_rank"] == 0 and telemetry[0]["attempt"] == 1
    assert "absent" in telemetry[0] and all("absent" not in v for v in telemetry[1:])
    assert risk[-1]["level"] == "low" and 0.0 <= risk[-1]["risk"] < 0.6
    steps = [s for k, _, s in events if k == "telemetry"]
    assert steps[-1] == max(steps) > 0  # each event is placed at the newest step seen


def test_a_job_shorter_than_one_interval_ends_with_a_risk_that_knows_its_ranks(tmp_path):
    """The sampler samples once at start, before any step; the job's steps come and go within its first
    interval: the risk sent as the watch stops scores the ranks, not the empty start."""
    events = []
    watch = watch_for(tmp_path, events, node_rank=0, telemetry_every_s=60).start()
    deadline = time.monotonic() + 5
    while not events and time.monotonic() < deadline:  # the supervisor's poll publishes the start sample
        watch.poll()
        time.sleep(0.01)
    write_job(tmp_path, [0, 1, 2, 3], 3)
    watch.stop()
    risk = [v for k, v, _ in events if k == "risk"]
    assert len([k for k, _, _ in events if k == "telemetry"]) == 1 and len(risk) == 2
    assert risk[0]["ranks"] == [] and {r["rank"] for r in risk[-1]["ranks"]} == {0, 1, 2, 3}


def test_after_a_shrink_the_detector_compares_the_ranks_left_not_the_departed_ones_files(tmp_path):
    """Six ranks, then torchrun re-forms the group on four (a node drained): ranks 4 and 5 leave files
    holding only the first group's lines. The watch compares the four ranks of the new group, and still
    finds a straggler among them."""
    events = []
    watch = watch_for(tmp_path, events, node_rank=0, local_ranks=6)
    write_job(tmp_path, [0, 1, 2, 3, 4, 5], 5)
    watch.poll()
    assert watch.report()["scored_ranks"] == [0, 1, 2, 3, 4, 5]
    write_job(tmp_path, [0, 1, 2, 3], 20, slow_rank=2, restart=1)
    watch.poll()
    raised = [v["flag"] for k, v, _ in events if k == "risk" and v.get("flag", {}).get("event") == "raised"]
    assert [f["rank"] for f in raised] == [2]
    assert watch.report()["scored_ranks"] == [0, 1, 2, 3]
    assert {r["rank"] for r in watch.ranks_report()} == {0, 1, 2, 3}


def test_in_a_shared_directory_only_node_0_scores_and_two_ranks_are_too_few(tmp_path):
    write_job(tmp_path, [0, 1, 2, 3], 20, slow_rank=2)  # two nodes of two ranks, one directory
    other, mine = [], []
    watch_for(tmp_path, other, node_rank=1, local_ranks=2).poll()
    assert other == []  # node 1 leaves the scoring to node 0
    watch_for(tmp_path, mine, node_rank=0, local_ranks=2).poll()
    assert [v["flag"]["rank"] for k, v, _ in mine if "flag" in v] == [2]

    lonely = tmp_path / "two"
    write_job(lonely, [0, 1], 5)
    events = []
    watch = watch_for(lonely, events, local_ranks=2, telemetry_every_s=0.05).start()
    time.sleep(0.1)
    watch.stop()
    last = [v for k, v, _ in events if k == "risk"][-1]
    assert last["straggler"]["absent"].startswith("2 rank(s): a straggler needs at least 3")


def test_a_failing_publisher_is_counted_and_the_watch_goes_on(tmp_path):
    write_job(tmp_path, [0, 1, 2, 3], 20, slow_rank=1)

    def down(kind, values, step):
        raise ConnectionError("Redis is away")

    watch = NodeRiskWatch(tmp_path, node="n0", node_rank=0, local_ranks=4, publish=down, collectors=[])
    watch.poll()
    assert watch.publish_errors >= 1 and [f["rank"] for f in watch.flags] == [1]


@pytest.mark.parametrize(("risk", "level"), [(None, None), (0.0, "low"), (0.6, "medium"), (0.85, "high")])
def test_risk_levels_follow_the_prevention_tiers(risk, level):
    assert risk_level(risk) == level


# ------------------------------------------------------------------------------------------- prevention


def flagged_watch(tmp_path, events, **kw):
    write_job(tmp_path, [0, 1, 2, 3], 20, slow_rank=2)
    watch = watch_for(tmp_path, events, node_rank=0, **kw)
    watch.poll()
    return watch


def actions_of(events):
    return [(v["action"]["action"], v["action"]["status"]) for k, v, _ in events if "action" in v]


def test_a_high_risk_warns_then_asks_the_ranks_for_a_snapshot_and_logs_its_outcome(tmp_path):
    from workers.training.supervision.snapshot_now import SnapshotRequests

    events, drained = [], []

    def drain(node, reason):
        drained.append((node, reason))
        return {"status": "done", "note": f"node {node} drained", "nodes_left": 1}

    watch = flagged_watch(tmp_path, events, protected=True, drain=drain)
    assert actions_of(events) == [("warn", "sent"), ("snapshot-now", "requested")]
    requested = watch.actions[-1]
    assert requested["risk"] == 1.0 and requested["reason"].startswith("risk 1.00: rank 2 ")
    ranks = SnapshotRequests(tmp_path)  # local rank 0's side
    assert ranks.pending()["id"] == requested["request"]
    watch.poll()
    assert len(watch.actions) == 2  # waiting for the ranks' answer; the open episode asks no more
    ranks.answer(step=230, name="step-000230", stall_s=0.12, previous_step=200)
    assert ranks.pending() is None
    watch.poll()
    done = watch.actions[-2]
    assert (done["action"], done["status"]) == ("snapshot-now", "done")
    assert done["outcome"]["step"] == 230 and done["outcome"]["steps_protected"] == 30
    assert done["outcome"]["stall_s"] == 0.12 and done["outcome"]["snapshot"] == "step-000230"
    # then the node goes: the flagged rank's node (no progress file names it here: this node)
    assert actions_of(events)[-1] == ("drain", "done") and drained == [("n1", requested["reason"])]
    assert watch.actions[-1]["nodes_left"] == 1 and watch.actions[-1]["drain_node"] == "n1"


def test_the_node_drained_is_the_straggling_ranks_even_before_the_detector_flags_it(tmp_path):
    """Node 0's watch scores a shared directory: a rank of node n1 whose score crosses the line a bucket
    before its flag drains n1, never the watch's own node (CI, 2026-12-06: node 0 drained itself, refused,
    and the straggler trained on); the failure model's risk, when it is the higher, drains this node."""
    import json

    for rank, node in [(0, "n0"), (1, "n0"), (2, "n1"), (3, "n1")]:
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "node": node, "step": 40}))
    watch = watch_for(tmp_path, [], node="n0", node_rank=0)
    ranks = [{"rank": r, "score": 0.1, "flagged": False} for r in (0, 1, 2)] + [
        {"rank": 3, "score": 0.97, "flagged": False}
    ]
    assert watch.nodes_to_drain(ranks, {"absent": "no model"}, 0.97) == ["n1"]
    ranks[1]["flagged"] = True  # a flag names its rank's node, whatever the scores
    assert watch.nodes_to_drain(ranks, {"absent": "no model"}, 0.97) == ["n0"]
    assert watch.nodes_to_drain(ranks, {"risk": 0.99}, 0.99) == ["n0"]  # the failure model: this node
    assert watch.nodes_to_drain([], {"absent": "no model"}, 0.9) == ["n0"]


def test_a_drain_that_cannot_be_done_is_refused_with_the_reason(tmp_path):
    from workers.training.supervision.snapshot_now import SnapshotRequests

    events = []
    watch = flagged_watch(
        tmp_path,
        events,
        protected=True,
        drain=lambda node, reason: {"status": "refused", "note": "the job is not elastic"},
    )
    SnapshotRequests(tmp_path).answer(step=10, name="step-000010", stall_s=0.1, previous_step=None)
    watch.poll()
    assert actions_of(events)[-2:] == [("snapshot-now", "done"), ("drain", "refused")]
    assert watch.actions[-1]["note"] == "the job is not elastic"


def test_no_action_on_an_observe_only_job_or_one_without_snapshots_and_an_unanswered_request(tmp_path):
    from workers.reliability.risk.policy import PreventionPolicy
    from workers.training.supervision.snapshot_now import REQUEST

    events = []
    flagged_watch(tmp_path / "observe", events, protected=True, prevention=PreventionPolicy(mode="observe"))
    assert actions_of(events) == [("warn", "sent"), ("snapshot-now", "observed"), ("drain", "observed")]
    assert not (tmp_path / "observe" / REQUEST).exists()  # nothing asked of the ranks

    events = []
    watch = flagged_watch(tmp_path / "bare", events, protected=False)
    assert actions_of(events) == [("warn", "sent"), ("snapshot-now", "refused")]
    assert "takes no snapshots" in watch.actions[-1]["note"]

    events, now = [], [5000.0]
    watch = NodeRiskWatch(
        tmp_path / "stuck",
        node="n0",
        node_rank=0,
        local_ranks=4,
        publish=lambda kind, values, step: events.append((kind, values, step)),
        collectors=[],
        protected=True,
        prevention=PreventionPolicy(answer_timeout_s=30.0),
        clock=lambda: now[0],
    )
    write_job(tmp_path / "stuck", [0, 1, 2, 3], 20, slow_rank=2)
    watch.poll()
    now[0] += 31.0
    watch.poll()
    assert actions_of(events)[-1] == ("snapshot-now", "unanswered")


def test_bad_prevention_policies_are_refused():
    from workers.reliability.risk.policy import PreventionPolicy

    for bad in [{"mode": "drain-everything"}, {"warn_at": 0.9, "act_at": 0.8}, {"warn_at": 0.0}]:
        with pytest.raises(ValueError):
            PreventionPolicy(**bad)
