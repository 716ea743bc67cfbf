"""The control plane feeds the expert load measured by a team's past MoE runs into the planner."""

from __future__ import annotations

import copy

import pytest
from rest_framework.test import APIClient

from tests.unit.planner_helpers import a100_cluster, full_strategy
from workers.planner.examples import contract

pytestmark = [pytest.mark.django_db]

STRATEGY = full_strategy(dp=16, ep=8, recompute="full", zero_stage=3).to_dict()


def moe_model(**moe) -> dict:
    doc = copy.deepcopy(contract("model-moe.json"))
    doc["moe"].pop("load_imbalance")
    doc["moe"].update(moe)
    return doc


def succeeded_moe_job(team, model: dict, expert_load: list[float], state: str = "succeeded"):
    from controlplane.jobs.models import TrainingJob

    return TrainingJob.objects.create(
        team=team,
        name="moe run",
        config={"steps": 10, "model": model},
        state=state,
        measured={"step_time_s": 1.0, "expert_load": expert_load},
    )


def import_plan(client, model: dict, whole: bool = False) -> dict:
    body = {
        "name": "moe plan",
        "model": model,
        "cluster": a100_cluster(2),
        "training": contract("training.json"),
        "strategy": STRATEGY,
    }
    r = client.post("/api/plans/", body, format="json")
    assert r.status_code == 201, r.content
    return r.json() if whole else r.json()["predicted"]["moe_imbalance"]


def test_plans_of_an_moe_model_the_team_trained_use_its_measured_expert_load(make_member):
    alice, bob = make_member("alice", "Team A"), make_member("bob", "Team B")
    client = APIClient()
    client.force_authenticate(alice)
    model = moe_model()
    uniform = import_plan(client, model)
    assert uniform["method"] == "uniform routing" and 1.0 < uniform["value"] < 1.25

    skewed = [3.0 / 128 if e < 16 else 1.0 / 128 for e in range(128)]
    team_a, team_b = alice.teams.first(), bob.teams.first()
    succeeded_moe_job(team_a, model, skewed)
    succeeded_moe_job(team_a, model, skewed)
    succeeded_moe_job(team_a, model, [1.0] * 8)  # another expert count: not this model
    succeeded_moe_job(team_a, model, [1.0] * 128, state="failed")  # only succeeded runs count
    succeeded_moe_job(team_b, model, [1.0] * 128)  # another team's run
    plan = import_plan(client, model, whole=True)
    measured = plan["predicted"]["moe_imbalance"]
    assert measured["method"] == "measured in 2 runs", measured
    assert measured["value"] > uniform["value"] and "succeeded jobs" in measured["source"]

    # the what-if API reads the runs of the user's teams too
    r = client.post(
        "/api/plans/evaluate/",
        {
            "model": model,
            "cluster": a100_cluster(2),
            "training": contract("training.json"),
            "strategy": STRATEGY,
        },
        format="json",
    )
    assert r.status_code == 200, r.content
    assert r.json()["plan"]["predicted"]["moe_imbalance"] == measured

    # the plan page shows it beside the other predicted figures
    client.force_login(alice)
    page = client.get(f"/planning/plans/{plan['id']}/").content.decode()
    assert 'id="plan-moe-imbalance"' in page and "measured in 2 runs" in page

    # a figure in the model document stays an override, and the plan says so
    given = import_plan(client, {**model, "moe": {**model["moe"], "load_imbalance": 1.1}})
    assert given["value"] == 1.1 and given["method"] == "given in the model document"
    assert "overrides the expert load measured in 2 runs" in given["source"]
