"""The knowledge base and searches: CRUD and team scoping per model, import/export round trips,
a search end to end through a real Celery worker with progress streamed over a real websocket,
similar plans for the next search, what-if, and measured figures landing beside a prediction."""

from __future__ import annotations

import asyncio
import copy
import json
import time

import pytest
import websockets
import yaml
from asgiref.sync import sync_to_async
from rest_framework.test import APIClient

from tests.api_mixins import TeamScopedApiTests
from tests.conftest import import_tiny_cpu_plan
from workers.planner.examples import contract

pytestmark = [pytest.mark.django_db(transaction=True)]

SEED_TRAINING = {"global_batch_size": 1536, "dtype": "bf16", "optimizer": "adam"}


class TestModelSpecApi(TeamScopedApiTests):
    endpoint = "/api/models/"

    def valid_payload(self, n):
        return {**contract("model.json"), "name": f"gpt-{n}"}

    def update_payload(self):
        return {"num_layers": 48}

    def invalid_payloads(self):
        bad_heads = {**self.valid_payload(2), "num_attention_heads": "many"}
        moe = {**self.valid_payload(3), "moe": {**contract("model-moe.json")["moe"], "top_k": 0}}
        return [(bad_heads, "num_attention_heads"), (moe, "moe.top_k")]


class TestHardwareProfileApi(TeamScopedApiTests):
    endpoint = "/api/hardware-profiles/"

    def valid_payload(self, n):
        return {
            "name": f"Ascend-910B-{n}",
            "confidence": "soft",
            "peak_tflops": {"bf16": 313},
            "memory_GiB": 64,
            "sources": {"peak_tflops": "third-party claims range 256-320 TFLOP/s fp16 (soft)"},
        }

    def update_payload(self):
        return {"peak_tflops": {"bf16": 280}}

    def invalid_payloads(self):
        return [
            ({**self.valid_payload(2), "sources": {}}, "sources"),
            ({**self.valid_payload(3), "memory_GiB": -1}, "memory_GiB"),
        ]


def test_cluster_import_export_round_trips_in_json_and_yaml(alice_api):
    atlas = contract("cluster-atlas900.json")
    r = alice_api.post("/api/clusters/", yaml.safe_dump(atlas), content_type="application/yaml")
    assert r.status_code == 201, r.content
    exported = alice_api.get(f"/api/clusters/{r.json()['id']}/?format=yaml")
    assert exported.status_code == 200
    doc = yaml.safe_load(exported.content)
    assert {k: v for k, v in doc.items() if k not in {"id", "team", "created_at", "updated_at"}} == atlas
    as_json = alice_api.get(f"/api/clusters/{r.json()['id']}/").json()
    assert {k: v for k, v in as_json.items() if k not in {"id", "team", "created_at", "updated_at"}} == atlas


def test_cluster_validation_is_the_planners(alice_api):
    bad = copy.deepcopy(contract("cluster-atlas900.json"))
    bad["inter_node"]["bandwidth_GBps"] = -3
    bad["tiers"][0]["nodes"] = 0
    r = alice_api.post("/api/clusters/", bad, format="json")
    assert r.status_code == 400
    assert any(k.startswith("inter_node.bandwidth_GBps") for k in r.json()), r.json()
    assert any(k.startswith("tiers") for k in r.json()), r.json()


def test_plan_import_is_costed_by_the_planner_and_filterable(alice_api):
    body = {
        "name": "my gpt3 plan",
        "model": contract("model.json"),
        "cluster": contract("cluster.json"),
        "training": contract("training.json"),
        "strategy": {**contract("strategy.json"), "dp": 48},
        "predicted": {"step_time_s": 0.001},
    }
    r = alice_api.post("/api/plans/", body, format="json")
    assert r.status_code == 201, r.content
    plan = r.json()
    assert plan["source"] == "imported" and plan["feasible"] is True
    assert plan["predicted"]["step_time_s"] > 1  # the planner's own prediction, not the one sent
    assert alice_api.get("/api/plans/?device=A100-SXM4-80GB").json()["count"] == 1
    assert alice_api.get("/api/plans/?device=H100").json()["count"] == 0
    exported = alice_api.get(f"/api/plans/{plan['id']}/plan-json/").json()
    assert set(exported) == {"strategy", "feasible", "reason", "predicted"}
    bad = {**body, "strategy": {**body["strategy"], "dp": 7}}
    r = alice_api.post("/api/plans/", bad, format="json")
    assert r.status_code == 400 and any(k.startswith("strategy") for k in r.json())


def test_the_plan_page_advises_a_power_cap_from_the_plans_prediction_and_applies_nothing(alice_api, alice):
    """The plan page's power-cap card is the engine's advice for the plan's predicted step (a labelled model:
    the device's TDP from the cluster, Zeus's cost at eta 0.5), with its time cost beside its saving."""
    from controlplane.planning.models import StoredPlan
    from workers.green.powercap import plan_powercap_block
    from workers.planner.energy import device_power_profile
    from workers.planner.specs import ClusterSpec

    body = {
        "name": "capped",
        "model": contract("model.json"),
        "cluster": contract("cluster.json"),
        "training": contract("training.json"),
        "strategy": {**contract("strategy.json"), "dp": 48},
    }
    r = alice_api.post("/api/plans/", body, format="json")
    assert r.status_code == 201, r.content
    plan = StoredPlan.objects.get(pk=r.json()["id"])
    cluster = ClusterSpec.from_dict(plan.cluster_doc)
    expected = plan_powercap_block(
        plan.predicted,
        cluster.num_nodes * cluster.devices_per_node,
        device_power_profile(cluster),
        cluster.device.name,
    )
    limit, tdp = expected["recommended"]["limit_w"], expected["max_power_w"]
    assert 0 < limit < tdp and expected["slowdown_pct"] > 0 and expected["energy_saving_pct"] > 0
    alice_api.force_login(alice)
    page = alice_api.get(f"/planning/plans/{plan.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert (
        'id="powercap-advice"' in html
        and "never applied" in html
        and "model: predicted from the plan" in html
    )
    assert f"<b>{limit:.0f} W</b> of {tdp:.0f} W" in html
    assert f"+{expected['slowdown_pct']:.1f} %" in html and f"−{expected['energy_saving_pct']:.1f} %" in html
    assert html.count('class="chosen"') == 1 and "nvidia-smi" in html
    # the page computes it; nothing was stored with the plan
    plan.refresh_from_db()
    assert "powercap" not in (plan.predicted.get("energy") or {})


def wait_search(search_id, timeout=120):
    from controlplane.planning.models import StrategySearch

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = StrategySearch.objects.get(pk=search_id)
        if s.is_finished:
            return s
        time.sleep(0.2)
    raise AssertionError(f"search {search_id} still {s.state}")


@pytest.mark.slow
async def test_seed_search_end_to_end_with_live_progress(live_stack, alice, token_for):
    """The seed scenario (1.25T MoE on the Atlas 900 PoD) through the API, a real worker and a websocket."""
    from controlplane.planning.models import StoredPlan
    from controlplane.planning.seed import seed_knowledge_base

    token = await sync_to_async(token_for)(alice)
    team = await sync_to_async(lambda: alice.teams.first())()
    await sync_to_async(seed_knowledge_base)(team=team)
    from controlplane.clusters.models import Cluster
    from controlplane.planning.models import StoredModelSpec

    cluster = await sync_to_async(Cluster.objects.get)(team=team, name="atlas-900-pod-1024x910b")
    model = await sync_to_async(StoredModelSpec.objects.get)(team=team, name="moe-transformer-1.2t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    body = {"cluster": cluster.pk, "model": model.pk, "training": SEED_TRAINING, "top_k": 5}
    r = await sync_to_async(client.post)("/api/searches/", body, format="json")
    assert r.status_code == 201, r.content
    search_id, stream = r.json()["id"], r.json()["stream"]

    events = []
    async with websockets.connect(
        live_stack.ws_url, additional_headers={"Authorization": f"Token {token}"}
    ) as ws:
        await ws.send(json.dumps({"action": "subscribe", "stream": stream, "last_seq": 0}))
        while True:
            m = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if "seq" in m:
                events.append(m)
                if m["kind"] == "event" and m["values"].get("state") in {"succeeded", "failed", "cancelled"}:
                    break
    kinds = [(e["kind"], e["values"].get("state")) for e in events]
    assert (
        kinds[0] == ("event", "queued")
        and ("event", "running") in kinds
        and kinds[-1] == ("event", "succeeded")
    )
    progress = [e["values"] for e in events if e["kind"] == "progress"]
    assert len(progress) >= 2
    fractions = [p["fraction"] for p in progress]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert progress[-1]["best"]["feasible"] and progress[-1]["evaluated"] > 100_000
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))

    search = await sync_to_async(wait_search)(search_id)
    best = await sync_to_async(lambda: search.best_plan)()
    assert best is not None and best.rank == 1 and best.device_count == 1024
    assert best.predicted["step_time_s"] == progress[-1]["best"]["predicted"]["step_time_s"]
    assert len(search.candidates) > 100 and search.stats["feasible"] > 0
    n_plans = await sync_to_async(StoredPlan.objects.filter(search_id=search_id).count)()
    assert n_plans >= 5

    # the next search of a similar scenario shows this plan as a similar plan, re-evaluated here
    r = await sync_to_async(client.post)("/api/searches/", {**body, "top_k": 3}, format="json")
    second = await sync_to_async(wait_search)(r.json()["id"])
    similar_ids = [p["id"] for p in second.similar_plans]
    assert best.pk in similar_ids
    entry = second.similar_plans[similar_ids.index(best.pk)]
    assert entry["reevaluated"]["predicted"]["step_time_s"] == pytest.approx(
        best.predicted["step_time_s"], rel=1e-6
    )

    # what-if: lose 57 nodes → a child search on 71 nodes
    r = await sync_to_async(client.post)(
        f"/api/searches/{search_id}/what-if/", {"lose_nodes": 57}, format="json"
    )
    assert r.status_code == 201, r.content
    child = await sync_to_async(wait_search)(r.json()["id"])
    assert child.parent_id == search_id and child.what_if == {"lose_nodes": 57}
    assert child.state == "succeeded", child.human_readable_error
    # 71 nodes = 568 devices admit no layout (the prime 71 divides no degree: pp = 71 would need more
    # stages than the 64 layers, uneven stages or not): the best plan leaves some nodes idle
    used = child.stats["nodes_used"]
    assert used < 71 and "no layout uses all 71 nodes" in child.stats["note"]
    child_best = await sync_to_async(lambda: child.best_plan)()
    assert child_best.device_count == used * 8 and child.request["cluster"]["num_nodes"] == used
    r = await sync_to_async(client.post)(
        f"/api/searches/{search_id}/what-if/", {"lose_nodes": 128}, format="json"
    )
    assert r.status_code == 400 and "lose_nodes" in r.json()


def test_search_that_fits_nothing_fails_with_the_tightest_constraint(live_stack, alice_api):
    tiny_cluster = {**contract("cluster.json"), "num_nodes": 1, "name": "one-node"}
    body = {
        "cluster_doc": tiny_cluster,
        "model_doc": contract("model.json"),
        "training": contract("training.json"),
    }
    r = alice_api.post("/api/searches/", body, format="json")
    assert r.status_code == 201, r.content
    search = wait_search(r.json()["id"])
    assert search.state == "failed"
    assert search.human_readable_error.startswith("No layout fits: needs ≥ ")
    assert "the device has 80 GiB" in search.human_readable_error


def test_search_input_errors_name_the_field(alice_api, make_member):
    r = alice_api.post("/api/searches/", {"training": contract("training.json")}, format="json")
    assert r.status_code == 400 and {"cluster", "model"} <= set(r.json())
    bad_model = {**contract("model.json"), "num_layers": 0}
    r = alice_api.post(
        "/api/searches/",
        {
            "cluster_doc": contract("cluster.json"),
            "model_doc": bad_model,
            "training": contract("training.json"),
        },
        format="json",
    )
    assert r.status_code == 400 and "model.num_layers" in r.json()
    r = alice_api.post(
        "/api/searches/",
        {
            "cluster_doc": contract("cluster.json"),
            "model_doc": contract("model.json"),
            "training": {"global_batch_size": "big"},
        },
        format="json",
    )
    assert r.status_code == 400 and any(k.startswith("training.global_batch_size") for k in r.json())
    # another team's cluster id is not found
    bob = make_member("bob", "Team B")
    bob_client = APIClient()
    bob_client.force_authenticate(bob)
    cid = bob_client.post("/api/clusters/", contract("cluster.json"), format="json").json()["id"]
    r = alice_api.post(
        "/api/searches/",
        {"cluster": cid, "model_doc": contract("model.json"), "training": contract("training.json")},
        format="json",
    )
    assert r.status_code == 400 and "cluster" in r.json()


@pytest.mark.slow
def test_job_from_a_stored_plan_brings_its_measurement_back(live_stack, alice_api):
    """StoredPlan → Launch → a real 2-rank CPU job → its measured step time lands beside the prediction."""
    from controlplane.planning.models import StoredPlan

    imported = import_tiny_cpu_plan(alice_api, "tiny on cpu")
    plan_id = imported["id"]
    r = alice_api.post(
        "/api/jobs/", {"name": "from plan", "plan_id": plan_id, "steps": 5, "device": "cpu"}, format="json"
    )
    assert r.status_code == 201, r.content
    from tests.integration.test_jobs import wait_for_state

    job = wait_for_state(r.json()["id"], {"succeeded", "failed"})
    assert job.state == "succeeded", job.log_tail[-2000:]
    plan = StoredPlan.objects.get(pk=plan_id)
    assert job.source_plan_id == plan_id, job.source_plan_id
    # the planned cluster's link sizes the gradient buckets
    assert job.config["inter_node_GBps"] == imported["cluster"]["inter_node"]["bandwidth_GBps"]
    assert plan.measured["step_time_s"] == job.measured["step_time_s"] > 0
    assert plan.measured_source == f"job/{job.pk}"
    assert alice_api.get(f"/api/plans/{plan_id}/").json()["measured"]["tokens_per_s"] > 0
    # a model far too big for this machine is refused before anything starts
    r = alice_api.post(
        "/api/jobs/",
        {
            "name": "too big",
            "model": contract("model-moe.json"),
            "strategy": imported["strategy"],
            "training": {"global_batch_size": 8},
            "device": "cpu",
        },
        format="json",
    )
    assert r.status_code == 400 and "model" in r.json() and "GiB" in r.json()["model"][0]
