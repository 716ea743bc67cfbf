"""The model pages without a browser (tests/browser/test_cluster_pages.py imports a config.json through
the form): parameters by part and FLOPs per token from the planner's own counts, the live check's
messages per field, a plan that keeps its model document through an edit, another team's model a 404."""

from __future__ import annotations

import copy

import pytest
from django.test import Client

from tests.conftest import import_tiny_cpu_plan
from workers.planner.examples import contract

pytestmark = pytest.mark.django_db


def test_a_models_page_shows_its_parameters_by_part_and_flops_per_token(alice_api, alice_pages):
    doc = contract("model.json")  # GPT-3 175B (Brown et al. 2020)
    pk = alice_api.post("/api/models/", doc, format="json").json()["id"]
    page = alice_pages.get(f"/models/{pk}/")
    assert page.status_code == 200
    f = page.context["figures"]
    parts = dict(f["parameter_rows"])
    assert sum(parts.values()) == pytest.approx(f["parameters"]["total"])
    assert 174e9 < f["parameters"]["total"] < 176e9  # the 175B of the paper
    # 2 FLOPs per weight and token forward, plus the attention scores: a little above 2 x 175B
    assert 2 * f["parameters"]["total"] < f["flops_per_token"]["forward"] < 2.1 * f["parameters"]["total"]
    assert f["flops_per_token"]["training"] == pytest.approx(3 * f["flops_per_token"]["forward"])
    html = page.content.decode()
    assert "175 B" in html and ("hidden size", 12288) in f["architecture"]
    assert "175 B" in alice_pages.get("/models/").content.decode()


def test_an_moe_models_active_parameters_count_top_k_of_its_experts(alice_api, alice_pages):
    doc = copy.deepcopy(contract("model.json"))
    doc.update(
        name="moe", moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": doc["ffn_hidden_size"]}
    )
    pk = alice_api.post("/api/models/", doc, format="json").json()["id"]
    f = alice_pages.get(f"/models/{pk}/").context["figures"]
    p = f["parameters"]
    assert f["active_per_token"] == pytest.approx(p["total"] - p["experts"] * 6 / 8)
    assert p["experts"] > 7 * p["attention"]  # 8 experts of the dense MLP's size in every layer


def test_the_live_check_names_each_field_with_the_planners_message(alice_api):
    bad = {
        **contract("model.json"),
        "num_kv_heads": 7,
        "moe": {"num_experts": 4, "top_k": 8, "expert_ffn_hidden_size": 64},
    }
    r = alice_api.post("/api/models/validate/", bad, format="json")
    assert r.status_code == 400
    assert set(r.json()) >= {"num_kv_heads", "moe.top_k"}, r.json()
    ok = alice_api.post("/api/models/validate/", contract("model.json"), format="json")
    assert ok.status_code == 200 and ok.json()["figures"]["parameters"]["total"] > 1e11


def test_a_plan_keeps_its_model_document_through_an_edit(alice, alice_api, alice_pages):
    from controlplane.planning.models import StoredModelSpec, StoredPlan

    row = StoredPlan.objects.get(pk=import_tiny_cpu_plan(alice_api)["id"])
    model = StoredModelSpec.objects.create(team=row.team, name=row.model_doc["name"], spec=row.model_doc)
    StoredPlan.objects.filter(pk=row.pk).update(model_spec=model)
    assert (
        alice_pages.get(f"/planning/plans/{row.pk}/").context["data"]["model_row"]["changed_since"] is False
    )
    r = alice_api.put(
        f"/api/models/{model.pk}/", {**model.spec, "num_layers": model.spec["num_layers"] * 2}, format="json"
    )
    assert r.status_code == 200, r.content
    data = alice_pages.get(f"/planning/plans/{row.pk}/").context["data"]
    assert data["model_row"] == {"id": model.pk, "name": model.name, "changed_since": True}
    assert data["reproduced"]["difference_text"] == "the same"
    assert [p["planned_on_earlier"] for p in alice_pages.get(f"/models/{model.pk}/").context["plans"]] == [
        True
    ]


def test_another_teams_model_is_a_404_on_every_page(alice_api, bob):
    pk = alice_api.post("/api/models/", contract("model.json"), format="json").json()["id"]
    theirs = Client()
    theirs.force_login(bob)
    for url in (f"/models/{pk}/", f"/models/{pk}/edit/", f"/models/{pk}/copy/", f"/models/{pk}/model.yaml"):
        assert theirs.get(url).status_code == 404, url
    assert theirs.post(f"/models/{pk}/delete/", {"confirm": "1"}).status_code == 404
    assert contract("model.json")["name"] not in theirs.get("/models/").content.decode()
