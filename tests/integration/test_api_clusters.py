import copy
import json

from tests.api_mixins import TeamScopedApiTests
from workers.planner.examples import CONTRACTS

CLUSTER = {
    "name": "a100-80gb-superpod-384n",
    "num_nodes": 384,
    "devices_per_node": 8,
    "device": {
        "name": "A100-SXM4-80GB",
        "peak_tflops": {"bf16": 312, "fp16": 312, "fp32": 19.5},
        "memory_GiB": 80,
        "memory_bandwidth_GBps": 2039,
        "tdp_watts": 400,
    },
    "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 300, "latency_us": 3},
    "inter_node": {"kind": "infiniband-hdr", "bandwidth_GBps": 25, "latency_us": 5},
    "tiers": [
        {"name": "leaf", "nodes": 20, "oversubscription": 1.0},
        {"name": "spine", "nodes": 384, "oversubscription": 1.0},
    ],
}


class TestClusterApi(TeamScopedApiTests):
    endpoint = "/api/clusters/"

    def valid_payload(self, n):
        return {**copy.deepcopy(CLUSTER), "name": f"cluster-{n}"}

    def update_payload(self):
        return {"num_nodes": 16}

    def invalid_payloads(self):
        wrong_type = {**self.valid_payload(2), "num_nodes": "many"}
        negative = {**self.valid_payload(3), "devices_per_node": -8}
        bad_link = self.valid_payload(4)
        bad_link["inter_node"] = {"kind": "ib", "bandwidth_GBps": "fast", "latency_us": 5}
        missing = self.valid_payload(5)
        del missing["device"]
        return [
            (wrong_type, "num_nodes"),
            (negative, "devices_per_node"),
            (bad_link, "inter_node"),
            (missing, "device"),
        ]

    def test_export_round_trips_the_contract_document(self, alice):
        obj = self.create(alice)
        document = {k: v for k, v in obj.items() if k not in {"id", "team", "created_at", "updated_at"}}
        assert document == self.valid_payload(1)

    def test_duplicate_name_is_a_400_not_a_500(self, alice):
        self.create(alice)
        r = self.client_for(alice).post(self.endpoint, self.valid_payload(1), format="json")
        assert r.status_code == 400
        assert "name" in r.json()

    def test_shipped_contract_example_is_accepted(self, alice):
        example = json.loads((CONTRACTS / "cluster-atlas900.json").read_text())
        r = self.client_for(alice).post(self.endpoint, example, format="json")
        assert r.status_code == 201, r.content
