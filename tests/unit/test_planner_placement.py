"""Placement is part of the search (issue 15): the rank order of the best layouts, oversubscribed switch
tiers, and the cross-switch bytes a plan reports against the topology-blind placement."""

import json

import numpy as np
import pytest

from tests.unit.planner_helpers import a100_cluster
from workers.planner import ClusterSpec, ModelSpec, TrainingConfig, search
from workers.planner.costmodel import DEFAULT_ORDER, cross_tier_fraction, group_links
from workers.planner.examples import CONTRACTS
from workers.planner.hardware import efficiency_for
from workers.planner.visual import plan_visuals

# the seed MoE scenario's degrees, the rest searched: tp=2 x cp=2 fill half a node, so the 8-wide EP group
# spans two nodes in every candidate order (with cp innermost too: tp sits between cp and dp)
DEGREES = {"tp": 2, "pp": 16, "dp": 16, "ep": 8, "cp": 2}


def load(name):
    return json.loads((CONTRACTS / name).read_text())


def atlas(tiers):
    doc = load("cluster-atlas900.json")
    doc["tiers"] = tiers
    return ClusterSpec.from_dict(doc)


@pytest.fixture(scope="module")
def moe():
    return ModelSpec.from_dict(load("model-moe.json")), TrainingConfig.from_dict(load("training.json"))


OVERSUBSCRIBED = [
    {"name": "leaf", "nodes": 4, "oversubscription": 4.0},
    {"name": "spine", "nodes": 128, "oversubscription": 1.0},
]


def test_oversubscribed_two_tier_cluster_keeps_the_fastest_order_and_measures_it(moe):
    """Every candidate order is timed and the fastest kept. With the groups' true spans (an EP group of
    tp2 x cp2 x ep8 spans 16 ranks in every candidate order: tests/unit/test_rank_order.py) Megatron's
    default order is already the fastest here, so the plan says it saves nothing against itself."""
    model, training = moe
    result = search(model, atlas(OVERSUBSCRIBED), training, fixed=DEGREES, top_k=1, scaling=False)
    best = result.best
    placement = best.predicted["placement"]
    assert len(result.stats["orders_tried"]) > 1
    assert best.to_dict()["strategy"].get("order", DEFAULT_ORDER) == best.strategy.order
    assert placement["order"] == best.strategy.order
    blind = placement["topology_blind"]
    assert blind["order"] == DEFAULT_ORDER
    assert best.predicted["step_time_s"] <= blind["step_time_s"]
    assert placement["cross_switch_GB_per_step"] == pytest.approx(blind["cross_switch_GB_per_step"])
    assert placement["saving_pct"] == pytest.approx(0.0, abs=0.2)


def test_a_worse_order_pays_for_the_bytes_it_sends_across_the_leaf(moe):
    """dp inside cp (tp-dp-cp-ep-pp) strides the cp ring and the EP group over more leaves: the plan
    reports more cross-switch bytes than the topology-blind placement (a negative saving) and a slower
    step, charged through the 4:1 leaf uplinks."""
    model, training = moe
    fixed = {**DEGREES, "order": "tp-dp-cp-ep-pp"}
    best = search(model, atlas(OVERSUBSCRIBED), training, fixed=fixed, top_k=1, scaling=False).best
    placement = best.predicted["placement"]
    blind = placement["topology_blind"]
    assert placement["cross_switch_GB_per_step"] > 2 * blind["cross_switch_GB_per_step"]
    assert best.predicted["step_time_s"] > blind["step_time_s"]
    assert placement["saving_pct"] == pytest.approx(
        100 * (1 - placement["cross_switch_GB_per_step"] / blind["cross_switch_GB_per_step"]), abs=0.2
    )
    assert placement["saving_pct"] < 0


@pytest.mark.parametrize("order", [DEFAULT_ORDER, "tp-dp-cp-ep-pp"])
def test_a_pinned_order_is_kept(moe, order):
    model, training = moe
    result = search(
        model, atlas(OVERSUBSCRIBED), training, fixed={**DEGREES, "order": order}, top_k=1, scaling=False
    )
    assert result.best.strategy.order == order
    assert result.stats["orders_tried"] == [order]
    assert result.best.predicted["placement"]["order"] == order


@pytest.mark.parametrize(
    "tiers", [[], [{"name": "leaf", "nodes": 128, "oversubscription": 3.0}]], ids=["no tiers", "one switch"]
)
def test_on_a_single_switch_cluster_nothing_crosses(moe, tiers):
    model, training = moe
    best = search(model, atlas(tiers), training, fixed=DEGREES, top_k=1, scaling=False).best
    placement = best.predicted["placement"]
    assert placement["cross_switch_GB_per_step"] == 0.0
    assert placement["topology_blind"]["cross_switch_GB_per_step"] == 0.0
    assert placement["saving_pct"] == 0.0
    assert "nothing crosses" in placement["note"] or "nothing leaves" in placement["note"]


def test_a_ring_past_an_oversubscribed_leaf_gets_its_share_of_the_uplinks():
    cluster = ClusterSpec.from_dict(a100_cluster(8, tiers=(("leaf", 2), ("spine", 8)), oversubscription=4.0))
    _name, eff = efficiency_for(cluster.device.name)
    inside, across, apart = group_links(cluster, eff, np.array([16, 32, 4]), np.array([1, 1, 16])).bw_inter
    assert inside == pytest.approx(25e9 * eff.collective_efficiency_inter)
    # 4 nodes over 2 leaves (4:1): the ring's 8 channels leave each leaf on 1 of its 2 node edges there,
    # half of what the leaf's nodes send, through uplinks of a quarter: half the NIC rate
    assert across == pytest.approx(inside / 2.0)
    # one member per leaf: all of it leaves, at a quarter
    assert apart == pytest.approx(inside / 4.0)


def test_uplink_share_of_rings_all_to_alls_and_pipelines():
    from workers.planner.costmodel.placement import uplink_share

    # 16 nodes of 8, 4 nodes per switch; groups of 16 ranks one per node (stride 8): 4 under each switch
    cluster = ClusterSpec.from_dict(a100_cluster(16, tiers=(("leaf", 4), ("spine", 16))))
    size, stride, per_node = np.array([16]), np.array([8]), np.array([1])
    # a ring over 16 nodes leaves each of its 4 switches once: 4 of its 16 node edges
    assert uplink_share(cluster, size, stride, per_node, 4, "ring")[0] == pytest.approx(4 / 16)
    # an all-to-all sends 12 of its 15 off-node shares to other switches
    assert uplink_share(cluster, size, stride, per_node, 4, "all_to_all")[0] == pytest.approx(12 / 15)
    # a pipeline of 16 stages crosses 3 of its 15 stage boundaries
    assert uplink_share(cluster, size, stride, per_node, 4, "p2p")[0] == pytest.approx(3 / 15)
    assert uplink_share(cluster, size, stride, per_node, 16, "ring")[0] == 0.0  # all under one switch


def test_data_parallel_rings_of_many_members_per_pod_are_not_slowed_by_an_oversubscribed_aggregation():
    # Llama 3's RoCE cluster (Dubey et al. 2024 §3.3.1): pods of 3,072 GPUs (384 nodes) at full bisection,
    # joined 1:7; 405B on 16,384 GPUs with tp 8 x pp 16 inside and dp 128 outermost: each dp ring has 24
    # members per pod and leaves it once, 1/24 of what its nodes send, well within the pod's 1/7 uplinks
    cluster = ClusterSpec.from_dict(
        a100_cluster(2048, tiers=(("pod", 384), ("aggregation", 2048)), oversubscription=7.0)
    )
    _name, eff = efficiency_for(cluster.device.name)
    dp = group_links(cluster, eff, np.array([128]), np.array([128]))
    assert float(dp.oversubscription_factor[0]) == 1.0
    # the same ring with one member per pod would share the uplinks with every rank of the pod
    sparse = group_links(cluster, eff, np.array([5]), np.array([3072]))
    assert float(sparse.oversubscription_factor[0]) == pytest.approx(7.0)


def test_cross_tier_fraction_of_rings_all_to_alls_and_pipelines():
    cluster = ClusterSpec.from_dict(a100_cluster(8, tiers=(("leaf", 1), ("spine", 8))))
    one = np.array([16])
    # 16 ranks at stride 1 over 2 switches of 8 ranks: a ring crosses 2 of its 16 edges, an all-to-all
    # sends 8 of its 15 shares away, a pipeline crosses 1 of its 15 stage boundaries
    assert cross_tier_fraction(cluster, one, np.array([1]), 1, "ring")[0] == pytest.approx(2 / 16)
    assert cross_tier_fraction(cluster, one, np.array([1]), 1, "all_to_all")[0] == pytest.approx(8 / 15)
    assert cross_tier_fraction(cluster, one, np.array([1]), 1, "p2p")[0] == pytest.approx(1 / 15)
    # under one switch of all 8 nodes nothing leaves
    assert cross_tier_fraction(cluster, one, np.array([4]), 8, "ring")[0] == 0.0


def test_the_placement_view_carries_the_cross_switch_figures(moe):
    model, training = moe
    cluster = atlas(OVERSUBSCRIBED)
    best = search(model, cluster, training, fixed=DEGREES, top_k=1, scaling=False).best
    traffic = plan_visuals(model, cluster, training, best.to_dict())["placement"]["traffic"]
    assert traffic == best.predicted["placement"]
