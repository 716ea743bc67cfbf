"""The API holds request bodies to the contracts: a key that is no field (of a contract document, or of the
request itself) is a 400 naming it, and nothing is created; plan.json documents with their extra fields
still work. The OpenAPI schema describes every JSON field as the object or array it is."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_jobs import example, job_payload
from workers.planner.examples import contract

pytestmark = pytest.mark.django_db


def search_body(**extra) -> dict:
    return {
        "cluster_doc": contract("cluster.json"),
        "model_doc": contract("model.json"),
        "training": contract("training.json"),
        **extra,
    }


def test_a_strategy_with_an_unknown_field_is_a_400_and_no_job(alice_api):
    from controlplane.jobs.models import TrainingJob

    r = alice_api.post("/api/jobs/", {**job_payload(), "strategy": {"dp": 2, "tpp": 2}}, format="json")
    assert r.status_code == 400
    assert list(r.json()) == ["strategy.tpp"]
    assert r.json()["strategy.tpp"][0].startswith("is not a field of strategy.json (known: tp, pp, dp")
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize(
    ("document", "field"),
    [("model", "num_layer"), ("training", "global_batch")],
)
def test_a_job_document_with_an_unknown_field_is_a_400_naming_it(alice_api, document, field):
    body = job_payload()
    body[document] = {**body[document], field: 4}
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 400 and list(r.json()) == [f"{document}.{field}"], r.json()


def test_an_unknown_field_of_the_job_request_is_a_400_naming_it(alice_api):
    from controlplane.jobs.models import TrainingJob

    r = alice_api.post("/api/jobs/", {**job_payload(), "stpes": 3}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["stpes"]
    assert "is not a field of this request" in r.json()["stpes"][0] and "steps" in r.json()["stpes"][0]
    assert not TrainingJob.objects.exists()


def test_an_unknown_field_of_the_search_request_is_a_400_naming_it(alice_api):
    from controlplane.planning.models import StrategySearch

    r = alice_api.post("/api/searches/", search_body(topk=3), format="json")
    assert r.status_code == 400 and list(r.json()) == ["topk"]
    r = alice_api.post(
        "/api/searches/", search_body(model_doc={**contract("model.json"), "layers": 2}), format="json"
    )
    assert r.status_code == 400 and list(r.json()) == ["model.layers"]
    r = alice_api.post("/api/searches/", search_body(strategy={"tp": 8, "pipeline": 4}), format="json")
    assert r.status_code == 400 and list(r.json()) == ["strategy.pipeline"]
    assert not StrategySearch.objects.exists()


def test_stored_documents_with_an_unknown_field_are_a_400_naming_it(alice_api):
    r = alice_api.post("/api/clusters/", {**contract("cluster.json"), "gpus_per_node": 8}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["gpus_per_node"]
    r = alice_api.post("/api/models/", {**contract("model.json"), "layers": 96}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["layers"]
    plan = {
        "name": "typo",
        "model": {**contract("model.json"), "heads": 96},
        "cluster": contract("cluster.json"),
        "training": contract("training.json"),
        "strategy": {**contract("strategy.json"), "dp": 48},
    }
    r = alice_api.post("/api/plans/", plan, format="json")
    assert r.status_code == 400 and list(r.json()) == ["model.heads"]
    r = alice_api.post(
        "/api/plans/evaluate/",
        {
            "model": contract("model.json"),
            "cluster": contract("cluster.json"),
            "training": {**contract("training.json"), "precision": "bf16"},
            "strategy": {**contract("strategy.json"), "dp": 48},
        },
        format="json",
    )
    assert r.status_code == 400 and list(r.json()) == ["training.precision"]


def test_a_plan_json_with_its_extra_fields_launches(alice_api):
    """plan.json carries predicted, feasible, reason (and, exported from here, id and name): the job takes
    its strategy."""
    plan = {
        "id": 12,
        "name": "tp1-pp1-dp2-ep1",
        "strategy": example("dp2.json"),
        "feasible": True,
        "reason": "",
        "predicted": {"step_time_s": 0.05, "tokens_per_s": 5120.0},
    }
    body = {k: v for k, v in job_payload(plan=plan).items() if k != "strategy"}
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["config"]["strategy"]["dp"] == 2 and r.json()["plan"]["name"] == "tp1-pp1-dp2-ep1"


# --- OpenAPI ----------------------------------------------------------------------------------------------


def resolved(prop: dict, components: dict) -> dict:
    """A property's schema with its ``$ref`` / ``allOf: [$ref]`` (drf-spectacular's nullable wrapper) followed."""
    if "allOf" in prop:
        prop = prop["allOf"][0]
    if "$ref" in prop:
        return components[prop["$ref"].rsplit("/", 1)[1]]
    return prop


def test_the_openapi_schema_types_json_fields_as_objects_and_arrays(alice_api):
    r = alice_api.get("/api/schema/?format=json")
    assert r.status_code == 200
    schema = json.loads(r.content)
    components = schema["components"]["schemas"]

    def prop(component: str, name: str) -> dict:
        return resolved(components[component]["properties"][name], components)

    expected = {
        "TrainingJob": {"config": "object", "plan": "object", "measured": "object", "exit_codes": "array"},
        "StrategySearch": {
            "request": "object",
            "stats": "object",
            "similar_plans": "array",
            "what_if": "object",
        },
        "Plan": {
            "model": "object",
            "cluster": "object",
            "training": "object",
            "strategy": "object",
            "predicted": "object",
            "measured": "object",
        },
        "JobCreate": {"model": "object", "plan": "object", "strategy": "object", "training": "object"},
        "SearchCreate": {
            "cluster_doc": "object",
            "model_doc": "object",
            "training": "object",
            "strategy": "object",
        },
        "Evaluate": {"model": "object", "cluster": "object", "training": "object", "strategy": "object"},
        "Evaluation": {"plan": "object", "visuals": "object"},
        "CommComparison": {"request": "object", "result": "object"},
    }
    for component, fields in expected.items():
        for name, json_type in fields.items():
            assert prop(component, name).get("type") == json_type, (component, name, prop(component, name))

    # the contract documents are described field by field, as the planner reads them
    config = prop("TrainingJob", "config")
    assert {"model", "strategy", "training", "steps"} <= set(config["properties"])
    assert config["properties"]["strategy"]["properties"]["tp"]["type"] == "integer"
    assert prop("Plan", "model")["properties"]["num_layers"]["type"] == "integer"
    assert prop("JobCreate", "strategy")["additionalProperties"] is False
    assert prop("SearchCreate", "cluster_doc")["properties"]["tiers"]["type"] == "array"
    assert prop("TrainingJob", "plan")["properties"]["predicted"]["type"] == "object"
    assert {"model", "cluster", "training", "strategy"} <= set(
        prop("StrategySearch", "request")["properties"]
    )
    assert {"num_nodes", "device", "id", "team"} <= set(components["Cluster"]["properties"])
    assert {"num_layers", "moe", "id"} <= set(components["ModelSpec"]["properties"])
    candidates = schema["paths"]["/api/searches/{id}/candidates/"]["get"]["responses"]["200"]
    assert candidates["content"]["application/json"]["schema"]["type"] == "array"
    plan_json = schema["paths"]["/api/plans/{id}/plan-json/"]["get"]["responses"]["200"]
    assert "strategy" in plan_json["content"]["application/json"]["schema"]["properties"]

    # and no property anywhere is left untyped (what a generated alice_api turns into a string)
    untyped = [
        f"{component}.{name}"
        for component, body in components.items()
        for name, p in (body.get("properties") or {}).items()
        if not ({"type", "$ref", "allOf", "oneOf", "anyOf", "enum"} & set(p))
    ]
    assert not untyped, untyped
