"""Hostile input found by an operator's probe (issue 36, item 6), each a 400 that names the field and
creates nothing: a lone UTF-16 surrogate in any text of a document, a seed beyond numpy's range, a global
batch one rank would accumulate forever, a key that is no field of an imported plan, an energy zone that is
no zone code, a job-list filter on a state that does not exist, a multipart body that cannot be parsed."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_jobs import job_payload
from workers.planner.examples import contract

pytestmark = pytest.mark.django_db

SURROGATE = '"model \\ud800 one"'  # JSON's escape of a lone high surrogate: no text is made of it


def _raw(client, path: str, body: str):
    return client.post(path, body, content_type="application/json")


@pytest.mark.parametrize(
    ("path", "document", "field"),
    [
        ("/api/models/", contract("model.json"), "name"),
        ("/api/clusters/", contract("cluster.json"), "name"),
        ("/api/jobs/", job_payload(), "name"),
    ],
)
def test_a_lone_surrogate_in_a_name_is_a_400_naming_the_field(alice_api, path, document, field):
    from controlplane.clusters.models import Cluster
    from controlplane.jobs.models import TrainingJob
    from controlplane.planning.models import StoredModelSpec

    text = json.dumps({**document, field: "placeholder"}).replace('"placeholder"', SURROGATE)
    r = _raw(alice_api, path, text)
    assert r.status_code == 400, r.content
    assert list(r.json()) == [field] and "lone UTF-16 surrogate" in r.json()[field][0], r.json()
    assert not (StoredModelSpec.objects.exists() or Cluster.objects.exists() or TrainingJob.objects.exists())


def test_a_lone_surrogate_deep_in_a_document_is_named_by_its_path(alice_api):
    body = job_payload()
    text = json.dumps({**body, "tags": ["ok", "placeholder"]}).replace('"placeholder"', '"\\udfff"')
    r = _raw(alice_api, "/api/jobs/", text)
    assert r.status_code == 400 and list(r.json()) == ["tags[1]"], r.json()
    # a surrogate pair is a character like any other (an emoji)
    r = _raw(alice_api, "/api/jobs/", json.dumps({**body, "name": "run \U0001f600"}, ensure_ascii=True))
    assert r.status_code == 201, r.content


def test_a_seed_beyond_numpys_range_and_a_batch_no_step_could_finish_are_400s(alice_api):
    from controlplane.jobs.models import TrainingJob

    r = alice_api.post("/api/jobs/", {**job_payload(), "seed": 2**70}, format="json")
    assert r.status_code == 400 and "seed" in r.json(), r.json()
    assert "4294967295" in json.dumps(r.json()["seed"]), r.json()
    body = job_payload()
    body["training"] = {**body["training"], "global_batch_size": 10**9}
    body["strategy"] = {**body["strategy"], "dp": 1, "micro_batch_size": 1}
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 400, r.content
    message = json.dumps(r.json())
    assert "training.global_batch_size" in message and "micro-batches a step per rank" in message, message
    assert not TrainingJob.objects.exists()


def test_a_key_that_is_no_field_of_an_imported_plan_is_a_400_and_an_exported_plan_goes_back_in(alice_api):
    from controlplane.planning.models import StoredPlan

    body = {
        "name": "imported",
        "model": contract("model.json"),
        "cluster": contract("cluster.json"),
        "training": contract("training.json"),
        "strategy": {**contract("strategy.json"), "dp": 48},
    }
    r = alice_api.post("/api/plans/", {**body, "stratgey": {"tp": 2}}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["stratgey"], r.json()
    assert not StoredPlan.objects.exists()
    r = alice_api.post("/api/plans/", body, format="json")
    assert r.status_code == 201, r.content
    exported = alice_api.get(f"/api/plans/{r.json()['id']}/").json()
    r = alice_api.post("/api/plans/", {**exported, "name": "round trip"}, format="json")
    assert r.status_code == 201, r.content


@pytest.mark.parametrize("zone", ["G B!", "<script>", "1GB"])
def test_an_energy_zone_that_is_no_zone_code_is_a_400(alice_api, zone):
    r = alice_api.post("/api/jobs/", {**job_payload(), "energy": {"zone": zone}}, format="json")
    assert r.status_code == 400, r.content
    assert "energy.zone must be a grid zone code" in json.dumps(r.json()), r.json()


def test_an_unknown_state_filter_is_a_400_listing_the_states(alice_api):
    r = alice_api.get("/api/jobs/?state=bogus")
    assert r.status_code == 400 and list(r.json()) == ["state"], r.content
    assert "unknown state 'bogus'" in r.json()["state"][0] and "running" in r.json()["state"][0]
    assert alice_api.get("/api/jobs/?state=running").status_code == 200


def test_a_malformed_multipart_body_is_a_400_that_says_what_to_send(alice_api):
    r = alice_api.post(
        "/api/models/from-hf-config/",
        b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="c.json"\r\n\r\n{}',
        content_type="multipart/form-data",  # no boundary
    )
    assert r.status_code == 400, r.content
    detail = r.json()["detail"]
    assert "not a readable multipart/form-data upload" in detail and "curl -F file=@" in detail, detail
