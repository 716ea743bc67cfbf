"""The cluster pages without a browser (tests/browser/test_cluster_pages.py drives the form): the list and
a cluster's page show the totals and drawing worked from its document, the plans planned on it and the
ones planned on an earlier version; the live check answers the planner's messages per field; an edit
leaves every plan's figures where they were; delete asks for confirmation and keeps the plans."""

from __future__ import annotations

import copy

import pytest
import yaml
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import import_tiny_cpu_plan
from workers.planner.examples import contract

pytestmark = pytest.mark.django_db


def superpod(name="superpod", **changes) -> dict:
    return {**copy.deepcopy(contract("cluster.json")), "name": name, **changes}


def test_the_list_and_a_clusters_page_show_its_totals_and_drawing(alice_api, alice_pages):
    r = alice_api.post("/api/clusters/", superpod(), format="json")
    assert r.status_code == 201, r.content
    pk = r.json()["id"]
    listing = alice_pages.get("/clusters/").content.decode()
    assert f'href="/clusters/{pk}/"' in listing and "38,400 GB/s" in listing  # 1,536 devices x 25 GB/s
    page = alice_pages.get(f"/clusters/{pk}/")
    assert page.status_code == 200
    data = page.context["drawing"]
    assert any(b["label"] == "+17 more nodes" for b in data["boxes"])
    html = page.content.decode()
    assert 'id="topology-data"' in html and "3072" in html
    # the device's figures beside their sources (the shipped A100 profile)
    rows = {r["field"]: r for r in page.context["device"]["rows"]}
    assert rows["peak_tflops.bf16"]["value"] == 312 and "Narayanan" in rows["peak_tflops.bf16"]["source"]
    assert page.context["device"]["origin"] == "data/hardware_profiles.json"
    # downloads round-trip through the API unchanged
    exported = yaml.safe_load(alice_pages.get(f"/clusters/{pk}/cluster.yaml").content)
    assert exported == superpod()


def test_the_live_check_answers_the_planners_messages_per_field(alice_api):
    ok = alice_api.post("/api/clusters/validate/", superpod(), format="json")
    assert ok.status_code == 200
    assert ok.json()["figures"]["bisection_GBps"] == 38400 and ok.json()["drawing"]["boxes"]
    bad = superpod(devices_per_node=0)
    bad["device"]["memory_GiB"] = "lots"
    bad["tiers"][1]["nodes"] = 10  # fewer than the leaf below it
    r = alice_api.post("/api/clusters/validate/", bad, format="json")
    assert r.status_code == 400
    errors = r.json()
    assert set(errors) >= {"devices_per_node", "device.memory_GiB", "tiers[1].nodes"}, errors
    assert "innermost first" in errors["tiers[1].nodes"][0]
    # a name the team already has is refused as a create would, but not for the cluster being edited
    pk = alice_api.post("/api/clusters/", superpod(), format="json").json()["id"]
    assert "name" in alice_api.post("/api/clusters/validate/", superpod(), format="json").json()
    assert alice_api.post(f"/api/clusters/validate/?id={pk}", superpod(), format="json").status_code == 200
    # YAML, as the form's paste box sends it
    r = alice_api.post(
        "/api/clusters/validate/", yaml.safe_dump(superpod(name="from yaml")), content_type="application/yaml"
    )
    assert r.status_code == 200 and r.json()["document"]["name"] == "from yaml"


def test_editing_a_cluster_leaves_its_plans_reproducible(alice, alice_api, alice_pages):
    from controlplane.clusters.models import Cluster
    from controlplane.planning.models import StoredPlan

    plan = import_tiny_cpu_plan(alice_api, "planned before the edit")
    row = StoredPlan.objects.get(pk=plan["id"])
    cluster = Cluster.objects.create(team=row.team, name=row.cluster_doc["name"], spec=row.cluster_doc)
    StoredPlan.objects.filter(pk=row.pk).update(cluster=cluster)
    before = alice_pages.get(f"/planning/plans/{row.pk}/").context["data"]["reproduced"]
    assert before["difference_text"] == "the same"

    doc = {**cluster.spec, "inter_node": {**cluster.spec["inter_node"], "bandwidth_GBps": 1.0}}
    doc["device"] = {
        **doc["device"],
        "peak_tflops": {k: v / 4 for k, v in doc["device"]["peak_tflops"].items()},
    }
    r = alice_api.put(f"/api/clusters/{cluster.pk}/", doc, format="json")
    assert r.status_code == 200, r.content

    page = alice_pages.get(f"/planning/plans/{row.pk}/")
    data = page.context["data"]
    assert data["cluster_row"] == {"id": cluster.pk, "name": cluster.name, "changed_since": True}
    assert data["reproduced"]["step_time_s"] == pytest.approx(row.predicted["step_time_s"])
    assert 'id="plan-cluster-changed"' in page.content.decode()
    listed = alice_pages.get(f"/clusters/{cluster.pk}/").context["plans"]
    assert [(p["plan"].pk, p["planned_on_earlier"]) for p in listed] == [(row.pk, True)]
    # a new evaluation on the edited cluster is slower: the edit applies to new plans
    again = APIClient()
    again.force_authenticate(alice)
    evaluated = again.post(
        "/api/plans/evaluate/",
        {"model": row.model_doc, "cluster": doc, "training": row.training, "strategy": row.strategy},
        format="json",
    )
    assert evaluated.json()["plan"]["predicted"]["step_time_s"] > row.predicted["step_time_s"]


def test_delete_asks_first_and_plans_keep_their_document(alice_api, alice_pages):
    from controlplane.clusters.models import Cluster
    from controlplane.planning.models import StoredPlan

    plan = import_tiny_cpu_plan(alice_api)
    row = StoredPlan.objects.get(pk=plan["id"])
    cluster = Cluster.objects.create(team=row.team, name="to delete", spec=row.cluster_doc)
    StoredPlan.objects.filter(pk=row.pk).update(cluster=cluster)
    assert alice_pages.post(f"/clusters/{cluster.pk}/delete/").status_code == 302
    assert Cluster.objects.filter(pk=cluster.pk).exists()  # not without "I mean it"
    r = alice_pages.post(f"/clusters/{cluster.pk}/delete/", {"confirm": "1"}, follow=True)
    assert "1 plan(s) planned on it keep the document" in r.content.decode()
    assert not Cluster.objects.filter(pk=cluster.pk).exists()
    row.refresh_from_db()
    assert row.cluster is None and row.cluster_doc["num_nodes"] == 1


def test_another_teams_cluster_is_a_404_on_every_page(alice_api, bob):
    pk = alice_api.post("/api/clusters/", superpod(), format="json").json()["id"]
    theirs = Client()
    theirs.force_login(bob)
    for url in (
        f"/clusters/{pk}/",
        f"/clusters/{pk}/edit/",
        f"/clusters/{pk}/copy/",
        f"/clusters/{pk}/cluster.json",
    ):
        assert theirs.get(url).status_code == 404, url
    assert theirs.post(f"/clusters/{pk}/delete/", {"confirm": "1"}).status_code == 404
    assert "superpod" not in theirs.get("/clusters/").content.decode()


def test_a_copy_starts_from_the_document_under_a_free_name(alice_api, alice_pages):
    pk = alice_api.post("/api/clusters/", superpod(), format="json").json()["id"]
    alice_api.post("/api/clusters/", superpod(name="superpod (copy)"), format="json")
    data = alice_pages.get(f"/clusters/{pk}/copy/").context["form_data"]
    assert data["document"]["name"] == "superpod (copy 2)" and data["id"] is None
    assert data["document"]["tiers"] == superpod()["tiers"]
