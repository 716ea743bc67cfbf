"""A search's objective and constraints through ``POST /api/searches/``: checked at the edge (a 400 names
the field), stored with the search, passed through the Celery worker to the planner, followed by the
stored ranking and shown on the search page."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.integration.test_planning import wait_search
from tests.unit.planner_helpers import a100_cluster
from workers.planner import ClusterSpec, ModelSpec, TrainingConfig, search
from workers.planner.examples import contract

pytestmark = [pytest.mark.django_db(transaction=True)]

# GPT-3 175B on 8 A100 nodes with a small batch: a search of a tenth of a second with plenty of plans
CLUSTER = a100_cluster(8, name="a100-8n")
TRAINING = {**contract("training.json"), "global_batch_size": 64}


def body(**extra) -> dict:
    return {"cluster_doc": CLUSTER, "model_doc": contract("model.json"), "training": TRAINING, **extra}


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"objective": "speed"}, "objective", "must be one of: throughput"),
        ({"constraints": {"max_memory_GiB_per_device": -8}}, "constraints.max_memory_GiB_per_device", "> 0"),
        ({"constraints": {"max_bubble_fraction": 1.5}}, "constraints.max_bubble_fraction", "between 0 and 1"),
        (
            {"constraints": {"max_bubble": 0.1}},
            "constraints.max_bubble",
            "allowed: max_memory_GiB_per_device",
        ),
        ({"constraints": [1]}, "constraints", "must be an object"),
    ],
)
def test_a_bad_objective_or_constraint_is_a_400_naming_the_field(alice_api, extra, field, words):
    from controlplane.planning.models import StrategySearch

    r = alice_api.post("/api/searches/", body(**extra), format="json")
    assert r.status_code == 400, r.content
    assert words in " ".join(r.json()[field])
    assert not StrategySearch.objects.exists()


def test_energy_on_a_device_without_power_is_a_400_on_objective(alice_api):
    cluster = {**CLUSTER, "device": {**CLUSTER["device"], "name": "Zeta-Accelerator-9"}}
    r = alice_api.post("/api/searches/", {**body(objective="energy"), "cluster_doc": cluster}, format="json")
    assert r.status_code == 400 and "tdp_watts" in " ".join(r.json()["objective"])


def test_search_ranks_by_its_objective_within_its_limits_through_the_worker(live_stack, alice_api, alice):
    ranking = {"objective": "memory_headroom", "constraints": {"max_bubble_fraction": 0.1}}
    r = alice_api.post("/api/searches/", body(top_k=8, **ranking), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["request"]["objective"] == "memory_headroom"
    found = wait_search(r.json()["id"])
    assert found.state == "succeeded", found.human_readable_error
    assert found.request["objective"] == "memory_headroom"
    assert found.request["constraints"] == {"max_bubble_fraction": 0.1}
    assert found.stats["objective"] == "memory_headroom" and found.stats["constraint_rejected"]
    assert found.stats["rejected"]["predicted pipeline bubble above max_bubble_fraction (0.1)"] > 0

    ranked = list(found.plans.filter(rank__isnull=False).order_by("rank"))
    assert len(ranked) == 8
    headrooms = [p.predicted["memory_headroom_GiB"] for p in ranked]
    assert headrooms == sorted(headrooms, reverse=True)
    assert all(p.predicted["bubble_fraction"] <= 0.1 + 1e-4 for p in found.plans.all())
    # the planner itself, asked the same, picks the same best plan
    direct = search(
        ModelSpec.from_dict(contract("model.json")),
        ClusterSpec.from_dict(CLUSTER),
        TrainingConfig.from_dict(TRAINING),
        top_k=1,
        **ranking,
    )
    assert found.best_plan.strategy == direct.best.strategy.to_dict()
    assert headrooms[0] > min(p.predicted["memory_headroom_GiB"] for p in found.plans.filter(in_pareto=True))

    # the search page shows what it ranked by and the limit it kept
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/planning/searches/{found.pk}/").content.decode()
    assert "ranked by <b>memory_headroom</b>" in page
    assert "pipeline bubble ≤ 0.1 of the step" in page
    data = browser.get(f"/api/searches/{found.pk}/page-data/", HTTP_ACCEPT="application/json").json()
    assert data["search"]["objective"] == "memory_headroom"
    assert data["search"]["constraints"] == {"max_bubble_fraction": 0.1}


def test_a_limit_nothing_meets_fails_saying_which_limit_and_what_to_relax(live_stack, alice_api):
    r = alice_api.post("/api/searches/", body(constraints={"max_memory_GiB_per_device": 1}), format="json")
    assert r.status_code == 201, r.content
    found = wait_search(r.json()["id"])
    assert found.state == "failed"
    message = found.human_readable_error
    assert message.startswith("No layout fits: max_memory_GiB_per_device = 1 rejected ")
    assert "layouts that fit the device" in message
    assert "raise max_memory_GiB_per_device to at least " in message
