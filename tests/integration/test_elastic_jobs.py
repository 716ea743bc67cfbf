"""Elastic node range (``min_nodes`` / ``max_nodes``) in the control plane: the API's validation and answer,
what the services do when a node of an elastic attempt fails or goes silent (a ``node-lost`` fault, the
others go on, no new attempt), and, on the live stack with two node workers, a job that loses node-b's
worker (SIGKILL) goes on alone, takes node-b back when its worker returns, and ends succeeded.

The service tests roll the database back after each test, so nothing they enqueue after a commit goes out
(as in ``test_job_restore_api.py``)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tests.conftest import wait_for
from tests.integration.test_job_restore_api import TINY_TRAINING
from tests.integration.test_job_restore_api import job_body as _body
from workers.training.examples import example

# --- the API -------------------------------------------------------------------------------------------

ELASTIC = {"nnodes": 2, "min_nodes": 1, "snapshot_every": 2}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "extra, field, words",
    [
        ({"nnodes": 2, "min_nodes": 0}, "min_nodes", "greater than or equal to 1"),
        ({"nnodes": 2, "min_nodes": 3, "snapshot_every": 2}, "min_nodes", "1 to max_nodes (nnodes) = 2, got 3"),
        ({"max_nodes": 2, "min_nodes": 3, "snapshot_every": 2}, "min_nodes", "1 to max_nodes (nnodes) = 2"),
        ({"nnodes": 2, "max_nodes": 1}, "max_nodes", "got nnodes=2 and max_nodes=1"),
        ({"nnodes": 2, "min_nodes": 1}, "snapshot_every", "needs snapshots"),
        ({**ELASTIC, "max_restarts": 0}, "max_restarts", "needs max_restarts > 0"),
        ({"max_nodes": 3, "min_nodes": 1, "snapshot_every": 2}, "nnodes", "must divide the world size"),
        # 8 ranks on 8 nodes; on 5 nodes a global batch of 8 splits over no layout (3 would run, pp 3 with
        # the 4 layers as 1, 2, 1)
        ({"strategy": {"dp": 8, "micro_batch_size": 1}, "max_nodes": 8, "min_nodes": 5, "snapshot_every": 2},
         "min_nodes", "on 5 node(s) the job would have 5 rank(s), and no layout runs it there"),
    ],
)  # fmt: skip
def test_submit_refuses_a_node_range_that_cannot_work_saying_why(alice_api, extra, field, words):
    r = alice_api.post("/api/jobs/", _body(**extra), format="json")
    assert r.status_code == 400 and field in r.json(), r.content
    assert words in " ".join(r.json()[field]), r.json()


@pytest.mark.django_db
def test_an_elastic_job_answers_its_range_and_rescales_and_a_plain_one_is_not_elastic(alice_api):
    from controlplane.jobs.selectors import restart_policy

    r = alice_api.post("/api/jobs/", _body(max_nodes=2, min_nodes=1, snapshot_every=2), format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["nnodes"], body["max_nodes"], body["min_nodes"], body["elastic"]) == (2, 2, 1, True)
    assert body["nproc_per_node"] == 1 and body["config"]["rescale"] is body["config"]["resume"] is True
    same = alice_api.post("/api/jobs/", _body(nnodes=2, max_nodes=2), format="json").json()
    assert (same["nnodes"], same["min_nodes"], same["elastic"], same["config"]["rescale"]) == (
        2,
        2,
        False,
        False,
    )
    plain = alice_api.post("/api/jobs/", _body(), format="json").json()
    assert (plain["nnodes"], plain["max_nodes"], plain["min_nodes"], plain["elastic"]) == (1, 1, 1, False)

    from controlplane.jobs.models import TrainingJob

    policy = restart_policy(TrainingJob.objects.get(pk=body["id"]))
    assert (policy["min_nodes"], policy["max_nodes"], policy["elastic"]) == (1, 2, True)
    page = APIClient()
    page.force_login(alice_api.user)
    html = page.get(f"/jobs/{body['id']}/").content.decode()
    assert "elastic on 1–2 nodes" in html
    assert "elastic on" not in page.get(f"/jobs/{plain['id']}/").content.decode()


# --- the services: a node lost, the others go on ---------------------------------------------------------


def _elastic_job(team, tmp_path: Path, *, nodes=2, beat_ago=(1, 1), min_nodes=1):
    """A running elastic attempt on ``nodes`` nodes, each with its last heartbeat ``beat_ago`` seconds ago,
    after 12 train steps."""
    from controlplane.jobs.models import JobNode
    from controlplane.jobs.services import job_create
    from controlplane.live.models import StreamEvent

    config = {
        "model": example("tiny-dense.json"),
        "strategy": {"dp": nodes},
        "training": TINY_TRAINING,
        "steps": 40,
        "device": "cpu",
        "snapshot_every": 5,
        "snapshot_dir": str(tmp_path / "snapshots"),
    }
    job = job_create(
        team=team, name="elastic", config=config, nnodes=nodes, min_nodes=min_nodes, launch=False
    )
    now = timezone.now()
    job.state, job.attempts, job.heartbeat_at, job.started_at = "running", 1, now, now
    job.save()
    for rank, ago in enumerate(beat_ago):
        JobNode.objects.create(job=job, attempt=1, node_rank=rank, node_name=f"node-{'ab'[rank]}",
                               state="running", heartbeat_at=now - timedelta(seconds=ago))  # fmt: skip
    StreamEvent.objects.bulk_create(
        StreamEvent(stream=job.stream, seq=s, time=now, kind="train", step=s,
                    values={"attempt": 1, "restart": 0, "loss": 3.0})
        for s in range(1, 13)
    )  # fmt: skip
    return job


def _finish(job, rank: int, code: int):
    from controlplane.jobs.models import JobNode
    from controlplane.jobs.services import node_finished

    node = JobNode.objects.get(job=job, attempt=job.attempts, node_rank=rank)
    summary = {"steps": 40, "world_size": 1} if code == 0 else None
    node_finished(node=node, exit_code=code, cancelled=False, log_tail=f"node {rank}", summary=summary)
    job.refresh_from_db()


@pytest.mark.django_db
def test_a_failed_node_of_an_elastic_job_is_a_node_lost_fault_and_the_others_finish_it(alice_api, tmp_path):
    from controlplane.jobs.selectors import restarts_left

    job = _elastic_job(alice_api.team, tmp_path)
    _finish(job, 1, 1)
    assert job.state == "running"
    [fault] = job.faults.all()
    assert (fault.kind, fault.node_rank, fault.node_name, fault.step) == ("node-lost", 1, "node-b", 12)
    assert "exited with code 1" in fault.message and fault.recovered_at is not None
    assert (
        restarts_left(job) == job.max_restarts
    )  # the survivors' restart is what counts (their watch's fault)
    _finish(job, 0, 0)
    assert job.state == "succeeded" and job.attempts == 1, job.human_readable_error
    api = alice_api.get(f"/api/jobs/{job.pk}/").json()
    assert [(f["kind"], f["node_name"]) for f in api["faults"]] == [("node-lost", "node-b")]


@pytest.mark.django_db
def test_a_failed_node_of_a_job_that_is_not_elastic_still_fails_it(alice_api, tmp_path):
    job = _elastic_job(alice_api.team, tmp_path, min_nodes=2)
    _finish(job, 1, 1)
    assert job.state == "running" and not job.faults.exists()
    _finish(job, 0, 0)
    assert job.state == "failed" and "node 1 exited with code 1" in job.human_readable_error


@pytest.mark.django_db
def test_the_last_live_node_failing_fails_the_elastic_job(alice_api, tmp_path):
    job = _elastic_job(alice_api.team, tmp_path)
    _finish(job, 1, 1)
    _finish(job, 0, 1)
    assert job.state == "failed" and "node 0 exited with code 1" in job.human_readable_error


@pytest.mark.django_db
def test_a_silent_node_is_lost_not_the_job_and_no_new_attempt_starts(alice_api, tmp_path):
    from controlplane.jobs.models import JobNode
    from controlplane.jobs.services import heartbeat, reap_orphans

    job = _elastic_job(alice_api.team, tmp_path, beat_ago=(1, 30))
    assert reap_orphans(stale_after=timedelta(seconds=5)) == []
    job.refresh_from_db()
    assert job.state == "running" and job.attempts == 1
    [fault] = job.faults.all()
    assert (fault.kind, fault.node_rank, fault.node_name) == ("node-lost", 1, "node-b")
    assert "stopped answering" in fault.message
    lost = JobNode.objects.get(job=job, node_rank=1)
    assert lost.state == "failed"
    # if its supervisor lives after all, its next heartbeat tells it to stop (the group went on without it)
    assert heartbeat(node=lost) is True
    assert heartbeat(node=JobNode.objects.get(job=job, node_rank=0)) is False
    _finish(job, 0, 0)
    assert job.state == "succeeded" and job.attempts == 1


@pytest.mark.django_db
def test_a_silent_node_after_the_others_succeeded_settles_the_job_succeeded(alice_api, tmp_path):
    from controlplane.jobs.services import reap_orphans

    job = _elastic_job(alice_api.team, tmp_path, beat_ago=(1, 30))
    _finish(job, 0, 0)
    assert job.state == "running"  # node 1 has not reported yet
    reap_orphans(stale_after=timedelta(seconds=5))
    job.refresh_from_db()
    assert job.state == "succeeded" and job.attempts == 1
    assert list(job.faults.values_list("kind", flat=True)) == ["node-lost"]


@pytest.mark.django_db
def test_losing_node_0_which_hosts_the_rendezvous_store_resumes_the_job_as_a_new_attempt(alice_api, tmp_path):
    from controlplane.jobs.services import reap_orphans

    job = _elastic_job(alice_api.team, tmp_path, beat_ago=(30, 1))
    reap_orphans(stale_after=timedelta(seconds=5))
    job.refresh_from_db()
    assert job.state == "queued" and job.attempts == 2 and job.config["resume"] is True
    [fault] = job.faults.all()
    assert fault.kind == "worker-lost" and "rendezvous store" in fault.message
    assert set(job.nodes.filter(attempt=1).values_list("state", flat=True)) == {"failed"}


@pytest.mark.django_db
def test_a_node_worker_online_joins_an_elastic_attempt_short_of_nodes(alice_api, tmp_path):
    from controlplane.jobs.services.recovery import grow_elastic_jobs

    job = _elastic_job(alice_api.team, tmp_path)
    assert grow_elastic_jobs(node_queues=["node.node-c"]) == []  # at max_nodes: nothing to grow
    _finish(job, 1, 1)
    # node-a runs it already; node-b's worker comes back
    assert grow_elastic_jobs(node_queues=["node.node-a", "node.node-b"]) == [job.pk]
    nodes = list(job.nodes.filter(attempt=1).values_list("node_rank", "node_name", "state"))
    assert nodes == [(0, "node-a", "running"), (1, "node-b", "failed"), (2, "node-b", "queued")]
    assert grow_elastic_jobs(node_queues=["node.node-c"]) == []  # back at max_nodes


def test_an_elastic_nodes_command_leaves_the_rendezvous_store_to_node_0():
    from workers.training.launch import render_torchrun_command

    joining = render_torchrun_command("/tmp/job.json", 2, 1, 1, "h:1", "job1-a1", 3, min_nodes=1, warm=True,
                                      hosts_store=False)  # fmt: skip
    assert "--nnodes=1:2" in joining and "workers.training.supervision.agent" in joining
    assert "--rdzv-conf=last_call_timeout=5,is_host=false" in joining
    plain = render_torchrun_command("/tmp/job.json", 2, 1, 1, "h:1", "job1-a1", 3)
    assert not any(a.startswith("--rdzv-conf") for a in plain) and "--nnodes=2" in plain


# --- live: node workers killed and started -----------------------------------------------------------


def start_node_worker(live_stack, name: str) -> subprocess.Popen:
    from controlplane.stack import worker_command

    cmd = worker_command(queues=f"node.{name}", concurrency=2, name=f"{name}-{os.getpid()}@%h", pool="threads",
                         quick_start=True)  # fmt: skip
    log = Path(live_stack.logs["worker"]).with_name(f"elastic-{name}.log")
    return subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2], env={**live_stack.env, "CANN_TRAIN_NODE": name},
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def group_starts(stream: str) -> list[tuple[int, int]]:
    """(seq, world size) of each start of the ranks (a launch, a restart, a re-formed group)."""
    from controlplane.live.models import StreamEvent

    rows = StreamEvent.objects.filter(stream=stream, kind="event", values__state="started").order_by("seq")
    return [(seq, v["world_size"]) for seq, v in rows.values_list("seq", "values")]


def training_on(stream: str, world: int, steps: int, after_seq: int = 0) -> bool:
    """The newest start of the ranks is on ``world`` ranks, after ``after_seq``, and trained ``steps`` since."""
    from controlplane.live.models import StreamEvent

    starts = [(seq, w) for seq, w in group_starts(stream) if seq > after_seq]
    if not starts or starts[-1][1] != world:
        return False
    return StreamEvent.objects.filter(stream=stream, kind="train", seq__gt=starts[-1][0]).count() >= steps


def _losses(stream: str) -> list[float]:
    from controlplane.live.models import StreamEvent

    rows = StreamEvent.objects.filter(stream=stream, kind="train")
    return list(rows.values_list("values__loss", flat=True))


def run_losing_node_b(live_stack, client, body: dict) -> tuple:
    """Submit the elastic job ``body`` (1-2 nodes) with two node workers online; once both nodes have trained 6
    steps together, SIGKILL node-b's Celery worker (its process group: its agent and ranks follow it), wait for
    node-b to be called lost and the job to end. Returns (the ended job, its stream, the last event's seq
    before the kill)."""
    from controlplane.jobs.models import JobFault, TrainingJob
    from controlplane.jobs.selectors import online_node_queues
    from controlplane.jobs.services.recovery import reap_lost_nodes
    from controlplane.live.models import StreamEvent
    from controlplane.stack import stop

    workers = {name: start_node_worker(live_stack, name) for name in ("node-a", "node-b")}
    try:
        wait_for(lambda: online_node_queues() == ["node.node-a", "node.node-b"], 60, "two node workers")
        r = client.post("/api/jobs/", body, format="json")
        assert r.status_code == 201, r.content
        job_id, stream = r.json()["id"], r.json()["stream"]
        wait_for(lambda: training_on(stream, 2, 6), 120, "both nodes to train together")
        killed_after = StreamEvent.objects.filter(stream=stream).order_by("-seq")[0].seq
        os.killpg(workers["node-b"].pid, signal.SIGKILL)  # node-b is gone
        workers["node-b"].wait()
        # the relay's reaper calls a node lost after 20 s of silence; this asks after 8
        wait_for(
            lambda: (
                reap_lost_nodes(stale_after=timedelta(seconds=8))
                or JobFault.objects.filter(job_id=job_id, kind="node-lost").exists()
            ),
            60,
            "node-b to be called lost",
        )
        job = wait_for(
            lambda: (j := TrainingJob.objects.get(pk=job_id)).is_finished and j, 180, "the job to end"
        )
    finally:
        stop(list(workers.values()))
    return job, stream, killed_after


def _elastic_body(steps: int) -> dict:
    return _body(strategy={"dp": 2, "micro_batch_size": 2}, steps=steps, max_nodes=2, min_nodes=1,
                 snapshot_every=2, max_restarts=5, profile_every=0)  # fmt: skip


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_elastic_job_that_loses_a_node_goes_on_without_it_and_succeeds(live_stack, alice_api):
    """node-b's Celery worker (its process group; its agent and rank follow it) is SIGKILLed while both nodes
    train: node-a goes on alone (dp 2 -> 1, resharded from the newest snapshot); node-b is recorded lost, the
    job is neither failed nor resumed as a new attempt; it ends succeeded on one rank, finite losses."""
    from controlplane.live.models import StreamEvent

    steps = 60  # the kill comes after step 6: the rest is trained on the node left, however fast
    job, stream, killed_after = run_losing_node_b(live_stack, alice_api, _elastic_body(steps))
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    assert job.attempts == 1  # node-a went on: the job was not resumed as a new attempt
    [lost] = job.faults.filter(kind="node-lost")
    assert (lost.node_rank, lost.node_name) == (1, "node-b")
    # node-a's ranks failed with node-b's gone and torchrun restarted them on one rank: recovered
    assert job.faults.exclude(kind="node-lost").exists()
    assert not job.faults.filter(recovered_at__isnull=True).exists()
    nodes = list(job.nodes.filter(attempt=1).values_list("node_rank", "node_name", "state"))
    assert nodes == [(0, "node-a", "succeeded"), (1, "node-b", "failed")], nodes
    assert [world for seq, world in group_starts(stream) if seq > killed_after] == [1]
    assert job.measured["world_size"] == 1  # the run summary of the node that went on
    assert (
        max(StreamEvent.objects.filter(stream=stream, kind="train").values_list("step", flat=True)) == steps
    )
    losses = _losses(stream)
    assert len(losses) >= steps and all(math.isfinite(x) for x in losses)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_elastic_job_started_on_one_node_grows_when_another_node_worker_comes_online(
    live_stack, alice_api
):
    """Only node-a's worker is online: the elastic job (1-2 nodes) starts on it alone (dp 1). node-b's worker
    starts: it offers itself, joins the running attempt as its second node, and the group grows to 2 ranks
    (resharded from the newest snapshot). The run is long: the test cancels it once the grown group trains."""
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.selectors import online_node_queues
    from controlplane.stack import stop

    workers = {"node-a": start_node_worker(live_stack, "node-a")}
    try:
        wait_for(lambda: online_node_queues() == ["node.node-a"], 60, "node-a's worker")
        r = alice_api.post("/api/jobs/", _elastic_body(100_000), format="json")
        assert r.status_code == 201, r.content
        job_id, stream = r.json()["id"], r.json()["stream"]
        wait_for(lambda: training_on(stream, 1, 4), 120, "node-a to train alone")
        from controlplane.live.models import StreamEvent

        launching = StreamEvent.objects.get(stream=stream, kind="event", values__state="launching")
        assert "Starting on 1 of its 2 nodes" in launching.values["message"]
        alone = group_starts(stream)[-1][0]
        workers["node-b"] = start_node_worker(live_stack, "node-b")  # capacity comes online
        wait_for(lambda: training_on(stream, 2, 4, after_seq=alone), 120, "the group to grow to 2 ranks")
        job = TrainingJob.objects.get(pk=job_id)
        nodes = list(job.nodes.filter(attempt=1).values_list("node_rank", "node_name", "state"))
        assert nodes == [(0, "node-a", "running"), (1, "node-b", "running")], nodes
        # the agents restarted a healthy group to let node-b in: no fault, the job never recovered
        assert job.state == "running" and job.attempts == 1 and not job.faults.exists(), list(
            job.faults.values_list("kind", "message")
        )
        alice_api.post(f"/api/jobs/{job_id}/cancel/")
        job = wait_for(lambda: (j := TrainingJob.objects.get(pk=job_id)).is_finished and j, 60, "the cancel")
    finally:
        stop(list(workers.values()))
    assert job.state == "cancelled" and not job.faults.filter(kind="node-lost").exists()
    assert all(math.isfinite(x) for x in _losses(stream))
