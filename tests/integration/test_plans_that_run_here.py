"""Plans that run on this machine, through the API and the real worker: a search of the shipped small
example (tiny-gpt on this-machine-cpu) gives a best plan the job API accepts and that trains to success;
a Pareto point the search did not store is saved into the search's team; a plan for 1024 devices is
scaled down to this machine (same layout family, every change listed) and launched as a job labelled
"scaled-down from plan #N" that runs here."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.integration.test_jobs import wait_for_state
from tests.integration.test_planning import wait_search
from workers.planner.examples import contract, small_example

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# the seed scenario's best layout (README: 1024 x Ascend 910B, the 1.25T MoE)
SEED_BEST = {
    "tp": 1,
    "pp": 1,
    "dp": 512,
    "ep": 128,
    "cp": 2,
    "vpp": 1,
    "micro_batch_size": 1,
    "recompute": "selective",
    "zero_stage": 3,
    "sequence_parallel": False,
}


@pytest.fixture
def bob_client(make_member):
    c = APIClient()
    c.force_authenticate(make_member("bob", "Team B"))
    return c


def small_example_search(client, alice):
    """Seed the team's knowledge base and search the small example by the stored ids, as the page does."""
    from controlplane.clusters.models import Cluster
    from controlplane.planning.models import StoredModelSpec
    from controlplane.planning.seed import seed_knowledge_base

    team = alice.teams.get()
    seed_knowledge_base(team=team)
    docs = small_example()
    cluster = Cluster.objects.get(team=team, name=docs["cluster"]["name"])
    model = StoredModelSpec.objects.get(team=team, name=docs["model"]["name"])
    r = client.post(
        "/api/searches/",
        {"cluster": cluster.pk, "model": model.pk, "training": docs["training"]},
        format="json",
    )
    assert r.status_code == 201, r.content
    search = wait_search(r.json()["id"])
    assert search.state == "succeeded", search.human_readable_error
    return search


def test_the_small_example_searches_to_a_best_plan_that_trains_here(live_stack, alice_api, alice):
    from controlplane.planning.models import StoredPlan

    search = small_example_search(alice_api, alice)
    best = search.best_plan
    assert best.device_count <= 4 and best.cluster_doc["name"] == "this-machine-cpu"
    r = alice_api.post(
        "/api/jobs/", {"name": "best of the small example", "plan_id": best.pk, "steps": 6}, format="json"
    )
    assert r.status_code == 201, r.content
    job = wait_for_state(r.json()["id"], {"succeeded", "failed"})
    assert job.state == "succeeded", job.log_tail[-2000:]
    assert job.world_size == best.device_count and job.config["strategy"] == best.strategy
    assert StoredPlan.objects.get(pk=best.pk).measured["step_time_s"] > 0


def test_a_point_the_search_did_not_store_is_saved_into_its_team(live_stack, alice_api, bob_client, alice):
    search = small_example_search(alice_api, alice)
    stored = [p.strategy for p in search.plans.all()]
    point = next(c["strategy"] for c in search.candidates if c["strategy"] not in stored)
    url = f"/api/searches/{search.pk}/save-plan/"
    r = alice_api.post(url, {"strategy": point}, format="json")
    assert r.status_code == 201, r.content
    saved = r.json()
    assert saved["strategy"] == point and saved["search"] == search.pk and saved["rank"] is None
    assert saved["team"] == search.team.slug and saved["url"] == f"/planning/plans/{saved['id']}/"
    assert saved["predicted"]["step_time_s"] > 0
    # the same point again is the same plan; the search's own plans too
    again = alice_api.post(url, {"strategy": point}, format="json")
    assert again.status_code == 200 and again.json()["id"] == saved["id"]
    best = alice_api.post(url, {"strategy": search.best_plan.strategy}, format="json")
    assert best.status_code == 200 and best.json()["id"] == search.best_plan.pk
    # a layout the scenario cannot take is a 400 naming the field; another team's search is not found
    r = alice_api.post(url, {"strategy": {**point, "dp": 3}}, format="json")
    assert r.status_code == 400 and any(k.startswith("strategy.") for k in r.json()), r.json()
    assert alice_api.post(url, {"strategy": "dp2"}, format="json").status_code == 400
    assert bob_client.post(url, {"strategy": point}, format="json").status_code == 404
    # and the saved plan launches like any stored plan
    r = alice_api.post(
        "/api/jobs/", {"name": "saved point", "plan_id": saved["id"], "steps": 3}, format="json"
    )
    assert r.status_code == 201, r.content
    job = wait_for_state(r.json()["id"], {"succeeded", "failed"})
    assert job.state == "succeeded", job.log_tail[-2000:]


def import_seed_best_plan(client):
    """POST the seed scenario's best plan (1,024 Ascend devices) to the knowledge base; the response."""
    r = client.post(
        "/api/plans/",
        {
            "name": "seed best",
            "model": contract("model-moe.json"),
            "cluster": contract("cluster-atlas900.json"),
            "training": contract("training.json"),
            "strategy": SEED_BEST,
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    return r


def test_a_plan_for_1024_devices_is_scaled_down_and_runs_here(live_stack, alice_api, bob_client):
    from controlplane.planning.models import StoredPlan

    r = import_seed_best_plan(alice_api)
    big = r.json()
    # it cannot run here as it is
    r = alice_api.post("/api/jobs/", {"name": "as is", "plan_id": big["id"]}, format="json")
    assert r.status_code == 400

    url = f"/api/plans/{big['id']}/scale-down/"
    preview = alice_api.get(url).json()
    changes = {c["field"]: c for c in preview["changes"]}
    assert (changes["cluster.devices"]["original"], changes["cluster.devices"]["scaled"]) == (1024, 4)
    assert (changes["strategy.ep"]["original"], changes["strategy.ep"]["scaled"]) == (128, 2)
    assert "strategy.cp" not in changes  # cp2 is kept as it is
    assert preview["kept"] == ["cp", "ep", "dp"] and preview["label"] == f"scaled-down from plan #{big['id']}"
    assert preview["scaled"]["strategy"]["zero_stage"] == 3 and preview["scaled"]["feasible"]

    assert bob_client.get(url).status_code == 404
    assert alice_api.post(url, {"steps": 0}, format="json").status_code == 400

    r = alice_api.post(url, {"steps": 4}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["job"]["name"] == f"scaled-down from plan #{big['id']}"
    assert body["plan"]["name"] == body["job"]["name"] and body["plan"]["device_count"] == 4
    job = wait_for_state(body["job"]["id"], {"succeeded", "failed"})
    assert job.state == "succeeded", job.log_tail[-2000:]
    assert job.world_size == 4 and job.config["device"] == "cpu"
    assert job.source_plan_id == body["plan"]["id"]
    # the measurement goes to the scaled plan, never to the 1024-device one
    assert StoredPlan.objects.get(pk=body["plan"]["id"]).measured["step_time_s"] > 0
    assert StoredPlan.objects.get(pk=big["id"]).measured is None
