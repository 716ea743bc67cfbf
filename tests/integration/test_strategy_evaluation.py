"""What-if costing of one strategy (``POST /api/plans/evaluate/``): the API checks the documents and
answers what ``planning.selectors.strategy_evaluation`` computes — the planner's own figures."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from workers import planner
from workers.planner.examples import contract

pytestmark = [pytest.mark.django_db]

# GPT-3 on the 384-node A100 cluster, data parallel over 48 replicas
SCENARIO = {
    "model": contract("model.json"),
    "cluster": contract("cluster.json"),
    "training": contract("training.json"),
    "strategy": {**contract("strategy.json"), "dp": 48},
}


def test_evaluation_is_the_planners_prediction_with_its_visuals(alice_api):
    from controlplane.planning.selectors import strategy_evaluation

    r = alice_api.post("/api/plans/evaluate/", SCENARIO, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    model, cluster, training = (
        planner.ModelSpec.from_dict(SCENARIO["model"]),
        planner.ClusterSpec.from_dict(SCENARIO["cluster"]),
        planner.TrainingConfig.from_dict(SCENARIO["training"]),
    )
    expected = planner.evaluate(model, cluster, training, planner.Strategy.from_dict(SCENARIO["strategy"]))
    assert body["plan"]["predicted"]["step_time_s"] == pytest.approx(expected.predicted["step_time_s"])
    assert body["plan"]["breakdown"]["memory"]["capacity"] == cluster.device.memory_GiB
    assert body["visuals"]["schedule"]["pp"] == SCENARIO["strategy"]["pp"]
    direct = strategy_evaluation(
        model=model, cluster=cluster, training=training, strategy=SCENARIO["strategy"]
    )
    assert direct["plan"] == body["plan"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"strategy": {**SCENARIO["strategy"], "dp": 7}}, "strategy"),
        ({"model": {**SCENARIO["model"], "num_layers": 0}}, "model.num_layers"),
        ({"training": {"global_batch_size": "big"}}, "training.global_batch_size"),
        ({"cluster": "a big one"}, "cluster"),
    ],
)
def test_a_bad_scenario_is_a_400_naming_the_field(alice_api, change, field):
    r = alice_api.post("/api/plans/evaluate/", {**SCENARIO, **change}, format="json")
    assert r.status_code == 400
    assert any(k.startswith(field) for k in r.json()), r.json()


def test_evaluation_needs_a_signed_in_user():
    assert APIClient().post("/api/plans/evaluate/", SCENARIO, format="json").status_code in (401, 403)
