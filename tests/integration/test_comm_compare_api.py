"""'Compare communication methods' from a job: a real worker trains the job's model under each method on
the emulated two-tier network; rows stream on the job's stream; the result is kept with job and plan."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from tests.conftest import import_tiny_cpu_plan
from workers.training.comm import netem
from workers.training.examples import example

pytestmark = [pytest.mark.django_db(transaction=True)]

TINY = example("tiny-dense.json")


def test_every_named_method_is_one_the_engine_can_run():
    from workers.training.comm import HOOKS
    from workers.training.comm.compare import method_hook
    from workers.training.comm_methods import COMPARE_METHODS, WEB_DEFAULT_METHODS

    for method in COMPARE_METHODS:
        hook = method_hook(method, ranks_per_node=2, density=0.01).partition(":")[0]
        assert hook in HOOKS, method
    assert set(WEB_DEFAULT_METHODS) <= set(COMPARE_METHODS)
    with pytest.raises(ValueError, match="unknown method"):
        method_hook("gzip", ranks_per_node=2, density=0.01)


@pytest.fixture
def job_from_plan(make_member):
    from controlplane.jobs.models import TrainingJob
    from controlplane.planning.models import StoredPlan

    alice = make_member("alice", "Team A")
    team = alice.teams.first()
    client = APIClient()
    client.force_authenticate(alice)
    plan = StoredPlan.objects.get(pk=import_tiny_cpu_plan(client)["id"])
    job = TrainingJob.objects.create(
        team=team,
        name="tiny",
        config={"model": TINY, "strategy": {"dp": 2}},
        source_plan=plan,
        state="succeeded",
    )
    return job, plan, client


def test_bad_comparison_requests_are_400s(job_from_plan):
    job, _plan, client = job_from_plan
    url = f"/api/jobs/{job.pk}/comm-compare/"
    r = client.post(url, {"methods": ["carrier-pigeon"]}, format="json")
    assert r.status_code == 400 and "methods" in r.json()
    r = client.post(url, {"nodes": 4, "ranks_per_node": 4}, format="json")
    assert r.status_code == 400 and "ranks_per_node" in r.json()
    r = client.post(url, {"steps": "many"}, format="json")
    assert r.status_code == 400 and "steps" in r.json()


@pytest.mark.slow
@pytest.mark.skipif(bool(netem.unavailable_reason()), reason=netem.unavailable_reason() or "n/a")
def test_comparison_runs_on_the_emulated_network_and_lands_with_the_plan(live_stack, job_from_plan):
    from controlplane.jobs.models import CommComparison
    from controlplane.live.models import StreamEvent

    job, plan, client = job_from_plan
    r = client.post(
        f"/api/jobs/{job.pk}/comm-compare/",
        {
            "methods": ["dense", "topk_ef"],
            "steps": 4,
            "nodes": 2,
            "ranks_per_node": 1,
            "inter_node_gbit": 1.0,
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        c = CommComparison.objects.get(pk=r.json()["id"])
        if c.is_finished:
            break
        time.sleep(0.5)
    assert c.state == "succeeded", c.human_readable_error
    dense, topk = c.result["methods"]["dense"], c.result["methods"]["topk_ef"]
    assert topk["bytes_per_rank_per_step"] < dense["bytes_per_rank_per_step"]
    assert dense["step_time_s"] > 0 and topk["tokens_per_s"] > 0
    assert c.plan_id == plan.pk and plan.comm_comparisons.count() == 1
    listed = client.get(f"/api/jobs/{job.pk}/comm-compare/").json()
    assert listed[0]["id"] == c.pk and set(listed[0]["result"]["methods"]) == {"dense", "topk_ef"}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rows = [
            e.values["comm_compare"].get("method")
            for e in StreamEvent.objects.filter(stream=job.stream)
            if "comm_compare" in e.values
        ]
        if "topk_ef" in rows:
            break
        time.sleep(0.3)
    assert [m for m in rows if m] == ["dense", "topk_ef"]
    from django.test import Client

    browser = Client()
    browser.force_login(job.created_by or plan.team.members.first())
    page = browser.get(f"/planning/plans/{plan.pk}/")
    assert page.status_code == 200 and b"topk_ef" in page.content
    page = browser.get(f"/jobs/{job.pk}/")
    assert (
        page.status_code == 200
        and b"comm-compare-data" in page.content
        and b"bytes_per_rank_per_step" in page.content
    )
