"""The cluster page's figures and drawing (workers.planner.topology): totals worked by hand, the cost
model's taper for the bisection, and a drawing that stays a few dozen boxes at 1,024 devices while every
node and switch is accounted for."""

from __future__ import annotations

import copy
import re

import pytest

from workers.planner import ClusterSpec
from workers.planner.examples import contract
from workers.planner.topology import cluster_figures, cross_tier_taper, topology_drawing

SUPERPOD = contract("cluster.json")  # 384 nodes x 8 A100, leaf 20 nodes, spine 384, non-blocking


def spec(**changes) -> ClusterSpec:
    doc = copy.deepcopy(SUPERPOD)
    doc.update(changes)
    return ClusterSpec.from_dict(doc)


def test_totals_of_the_superpod_worked_by_hand():
    f = cluster_figures(spec())
    assert f["devices"] == 3072
    assert f["peak_tflops"]["bf16"] == pytest.approx(3072 * 312)
    assert f["memory_GiB"] == pytest.approx(3072 * 80)
    # half the devices, each at its 25 GB/s HDR link, through non-blocking tiers
    assert f["bisection_GBps"] == pytest.approx(1536 * 25)
    leaf, spine = f["tiers"]
    assert (leaf["switches"], leaf["children_per_switch"], leaf["uplink_GBps"]) == (20, 20, 20 * 8 * 25)
    assert (spine["switches"], spine["children_per_switch"]) == (1, 20)
    assert not f["beyond_tiers"]


def test_the_bisection_is_tapered_by_every_oversubscribed_tier_it_crosses():
    tiers = [
        {"name": "leaf", "nodes": 16, "oversubscription": 2.0},
        {"name": "spine", "nodes": 128, "oversubscription": 1.5},
    ]
    cluster = spec(num_nodes=128, tiers=tiers)
    assert cross_tier_taper(cluster, 128) == pytest.approx(2.0)  # leaves crossed, not the spine
    assert cross_tier_taper(cluster, 16) == pytest.approx(1.0)
    assert cluster_figures(cluster)["bisection_GBps"] == pytest.approx(128 * 8 / 2 * 25 / 2.0)
    outgrown = spec(num_nodes=256, tiers=tiers)  # the spine holds 128 of 256 nodes: both tiers crossed
    assert cluster_figures(outgrown)["bisection_GBps"] == pytest.approx(256 * 8 / 2 * 25 / 3.0)
    assert cluster_figures(outgrown)["beyond_tiers"]


def test_one_node_is_cut_across_its_scale_up_link():
    f = cluster_figures(spec(num_nodes=1, tiers=[]))
    assert f["bisection_GBps"] == pytest.approx(8 / 2 * 300)
    assert f["bisection_across"]["link"] == "intra_node"


def _represented_nodes(drawing) -> int:
    """Nodes the drawing accounts for: drawn nodes plus what each "+N more nodes" stands for, and each
    collapsed switch times the nodes it holds."""
    total = 0
    for box in drawing["boxes"]:
        if box["kind"] == "node":
            total += 1
        elif box["kind"] == "more":
            n = int(re.match(r"\+(\d+) more", box["label"])[1])
            each = re.match(r"(\d+) nodes each", box["detail"])
            total += n * int(each[1]) if each else n
        elif box["kind"] == "switch" and not any(e["from"] == box["id"] for e in drawing["edges"]):
            total += int(re.match(r"(\d+) nodes", box["detail"])[1])  # a closed switch
    return total


@pytest.mark.parametrize(
    "nodes,tiers",
    [
        (128, [{"name": "leaf", "nodes": 16}, {"name": "spine", "nodes": 128}]),  # 1,024 devices
        (384, SUPERPOD["tiers"]),
        (5, []),
        (130, [{"name": "leaf", "nodes": 16}]),  # beyond the only tier, the last leaf partly full
        (1, []),
    ],
)
def test_the_drawing_is_legible_and_accounts_for_every_node(nodes, tiers):
    drawing = topology_drawing(spec(num_nodes=nodes, tiers=tiers))
    assert len(drawing["boxes"]) <= 30
    assert _represented_nodes(drawing) == nodes
    for box in drawing["boxes"]:  # inside the canvas, no two boxes overlapping
        assert 0 <= box["x"] and box["x"] + box["w"] <= drawing["width"] + 0.5
        assert 0 <= box["y"] and box["y"] + box["h"] <= drawing["height"]
    for a in drawing["boxes"]:
        for b in drawing["boxes"]:
            if a["id"] < b["id"] and a["y"] == b["y"]:
                assert a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"], (a, b)
    assert len(drawing["devices"]) == 8  # the first node's devices
    assert all(e["label"] for e in drawing["edges"] if e["to"] == e["from"] + 1) or nodes == 1
