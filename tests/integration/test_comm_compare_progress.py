"""A running communication comparison reports which method runs, its step k of n and an ETA from the
measured step times on the job's stream, and a cancel (team-scoped) stops the running method's
processes, removes the emulated network and keeps the methods measured before. Needs root and network
namespaces, like the comparison itself."""

from __future__ import annotations

import time

import psutil
import pytest
from rest_framework.test import APIClient

from workers.training.comm import netem
from workers.training.examples import example

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(bool(netem.unavailable_reason()), reason=netem.unavailable_reason() or "n/a"),
]


def comparison_events(job) -> list[dict]:
    from controlplane.live.models import StreamEvent

    return [
        e.values["comm_compare"]
        for e in StreamEvent.objects.filter(stream=job.stream).order_by("seq")
        if "comm_compare" in e.values
    ]


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def comparison_processes(root_pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in children:
        try:
            if "workers.training.comm.compare" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.long
def test_progress_per_step_then_cancel_stops_the_run_and_keeps_earlier_rows(live_stack, make_member):
    from controlplane.jobs.models import CommComparison, TrainingJob

    alice = make_member("alice", "Team A")
    bob = make_member("bob", "Team B")
    job = TrainingJob.objects.create(
        team=alice.teams.get(),
        name="tiny",
        config={"model": example("tiny-dense.json"), "strategy": {"dp": 2}},
        state="succeeded",
    )
    client = APIClient()
    client.force_authenticate(alice)
    r = client.post(
        f"/api/jobs/{job.pk}/comm-compare/",
        {"methods": ["dense", "fp16", "topk_ef"], "steps": 150, "nodes": 2, "ranks_per_node": 1},
        format="json",
    )
    assert r.status_code == 201, r.content
    cid = r.json()["id"]
    worker = live_stack.procs["worker"].pid

    # dense runs its 150 steps (seconds: the tiny model); the cancel comes while fp16 runs, once it
    # reported a few steps with an ETA
    def fp16_running():
        steps = [
            e["progress"]
            for e in comparison_events(job)
            if e.get("progress") and e["progress"]["method"] == "fp16" and e["progress"]["step"] >= 3
        ]
        return steps[-1] if steps else None

    now = wait_until(fp16_running, 300, "a step-progress event of fp16 with step >= 3")
    assert now["index"] == 1 and now["steps"] == 150 and now["methods"] == ["dense", "fp16", "topk_ef"]
    assert now["eta_s"] is not None and now["eta_s"] > 0 and now["step_time_s"] > 0
    assert 1 / 3 < now["fraction"] < 2 / 3
    events = comparison_events(job)
    dense_steps = [
        e["progress"]["step"] for e in events if e.get("progress") and e["progress"]["method"] == "dense"
    ]
    assert dense_steps[0] == 0 and dense_steps[-1] == 150 and dense_steps == sorted(dense_steps)
    assert [e["method"] for e in events if e.get("row")] == ["dense"]
    assert comparison_processes(worker), "no comparison ranks running under the worker"
    assert CommComparison.objects.get(pk=cid).progress > 1 / 3

    # the cancel is team-scoped: another team sees no such job
    bob_client = APIClient()
    bob_client.force_authenticate(bob)
    assert bob_client.post(f"/api/jobs/{job.pk}/comm-compare/{cid}/cancel/").status_code == 404
    assert client.post(f"/api/jobs/{job.pk}/comm-compare/{cid + 999}/cancel/").status_code == 404
    r = client.post(f"/api/jobs/{job.pk}/comm-compare/{cid}/cancel/")
    assert r.status_code == 202 and r.json()["cancel_requested"] is True

    started = time.monotonic()
    c = wait_until(
        lambda: (x := CommComparison.objects.get(pk=cid)).is_finished and x, 60, "the comparison to end"
    )
    assert c.state == "cancelled", c.human_readable_error
    assert time.monotonic() - started < 30
    assert "Cancelled by alice while fp16 ran" in c.human_readable_error
    assert list(c.result["methods"]) == ["dense"] and c.result["recommendation"]["method"] == "dense"
    assert not comparison_processes(worker), "ranks left running after the cancel"
    assert not [n for n in netem.list_namespaces() if n.startswith(f"ct-{worker}-")], "namespaces left behind"
    events = wait_until(
        lambda: [e for e in comparison_events(job) if e.get("state") == "cancelled"],
        20,
        "the cancelled event",
    )
    assert events[-1]["id"] == cid
    # a second cancel is a 400 naming the state
    r = client.post(f"/api/jobs/{job.pk}/comm-compare/{cid}/cancel/")
    assert r.status_code == 400 and "state" in r.json()
