"""The visualizer's pure helpers against schedules and placements worked out by hand."""

import json
from pathlib import Path

import pytest

from tests.unit.planner_helpers import a100_cluster, full_strategy
from workers.planner import ClusterSpec, ModelSpec, TrainingConfig, evaluate
from workers.planner.visual import (
    SCHEDULE_BLOCK_CAP,
    drawn_micro_batches,
    pipeline_schedule,
    placement_map,
    plan_breakdown,
    plan_visuals,
    schedule_idle_fraction,
)

ROOT = Path(__file__).resolve().parents[2]
# the planner's vendored copy of the contracts, else the shared originals beside the repository
CONTRACTS = next(
    (p for p in (ROOT / "workers/planner/data/contracts", ROOT.parent / "shared/contracts") if p.exists()),
    ROOT / "workers/planner/data/contracts",
)


def cluster(num_nodes, devices_per_node, tiers=(), oversubscription=1.0):
    return a100_cluster(num_nodes, devices_per_node, tiers=tuple(tiers), oversubscription=oversubscription)


strategy = full_strategy


def ops(blocks, stage):
    return [(b["kind"], b["micro_batch"], b["chunk"]) for b in blocks if b["stage"] == stage]


def makespan(blocks):
    return max(b["end"] for b in blocks)


def assert_valid_schedule(blocks, pp, vpp, m):
    """Every (kind, micro-batch, virtual stage) runs once, a stage never runs two blocks at a time, and
    every block starts after the one it depends on."""
    end = {}
    for b in blocks:
        key = (b["kind"], b["micro_batch"], b["chunk"] * pp + b["stage"])
        assert key not in end
        end[key] = b["end"]
    assert len(end) == 2 * m * pp * vpp
    for s in range(pp):
        mine = sorted((b for b in blocks if b["stage"] == s), key=lambda b: b["start"])
        for a, b in zip(mine, mine[1:], strict=False):
            assert b["start"] >= a["end"] - 1e-12
    last = pp * vpp - 1
    for b in blocks:
        k = b["chunk"] * pp + b["stage"]
        if b["kind"] == "F" and k > 0:
            assert b["start"] >= end[("F", b["micro_batch"], k - 1)] - 1e-12
        if b["kind"] == "B":
            dep = ("B", b["micro_batch"], k + 1) if k < last else ("F", b["micro_batch"], k)
            assert b["start"] >= end[dep] - 1e-12


# ------------------------------------------------------------------ pipeline schedule


def test_1f1b_two_stages_four_micro_batches_matches_the_hand_drawn_schedule():
    blocks = pipeline_schedule(2, 1, 4, t_forward=1.0, t_backward=2.0, schedule="1f1b")
    # stage 0: one warm-up forward, then 1F1B, then the last backward
    assert ops(blocks, 0) == [
        ("F", 0, 0),
        ("F", 1, 0),
        ("B", 0, 0),
        ("F", 2, 0),
        ("B", 1, 0),
        ("F", 3, 0),
        ("B", 2, 0),
        ("B", 3, 0),
    ]
    assert ops(blocks, 1) == [(k, i, 0) for i in range(4) for k in ("F", "B")]
    times = [(b["start"], b["end"]) for b in blocks if b["stage"] == 0]
    assert times == [(0, 1), (1, 2), (4, 6), (6, 7), (7, 9), (9, 10), (10, 12), (13, 15)]
    last = [(b["start"], b["end"]) for b in blocks if b["stage"] == 1]
    assert last == [(1, 2), (2, 4), (4, 5), (5, 7), (7, 8), (8, 10), (10, 11), (11, 13)]
    # (m + p - 1)(t_f + t_b)
    assert makespan(blocks) == 15.0
    assert schedule_idle_fraction(blocks, 2) == pytest.approx(1 / 4)


def test_interleaved_four_stages_two_chunks_eight_micro_batches():
    blocks = pipeline_schedule(4, 2, 8, t_forward=1.0, t_backward=2.0, schedule="interleaved")
    assert_valid_schedule(blocks, 4, 2, 8)
    # Megatron-LM: stage 0 warms up with 2(p-1) + (v-1)p = 10 forwards, micro-batches in groups of p
    first = ops(blocks, 0)[:11]
    assert first == [
        ("F", 0, 0),
        ("F", 1, 0),
        ("F", 2, 0),
        ("F", 3, 0),
        ("F", 0, 1),
        ("F", 1, 1),
        ("F", 2, 1),
        ("F", 3, 1),
        ("F", 4, 0),
        ("F", 5, 0),
        ("F", 6, 0),
    ]
    assert ops(blocks, 0)[11] == ("B", 0, 1)  # the first backward runs the last chunk
    # the last stage warms up with (v-1)p = 4 forwards
    assert ops(blocks, 3)[:6] == [
        ("F", 0, 0),
        ("F", 1, 0),
        ("F", 2, 0),
        ("F", 3, 0),
        ("F", 0, 1),
        ("B", 0, 1),
    ]
    # bubble (p-1)(t_f + t_b)/v: 8 * 3 + 3 * 3 / 2
    assert makespan(blocks) == pytest.approx(28.5)
    assert schedule_idle_fraction(blocks, 4) == pytest.approx(3 / (2 * 8))


@pytest.mark.parametrize(
    "pp, vpp, m, tf, tb",
    [
        (2, 1, 4, 1.0, 2.0),
        (4, 1, 8, 1.0, 2.0),
        (4, 1, 2, 1.0, 3.0),  # fewer micro-batches than stages
        (8, 1, 24, 0.5, 1.0),
        (4, 2, 4, 1.0, 2.0),  # m == p: Megatron runs every forward first
        (4, 2, 8, 1.0, 2.0),
        (8, 4, 16, 1.0, 2.0),
        (8, 2, 24, 1.0, 3.0),
        (1, 1, 5, 1.0, 2.0),
    ],
)
def test_idle_time_equals_the_analytic_bubble(pp, vpp, m, tf, tb):
    blocks = pipeline_schedule(pp, vpp, m, tf, tb)
    assert_valid_schedule(blocks, pp, vpp, m)
    # Narayanan et al. SC'21 §2.2: (p - 1) / (v m) of the ideal time m (t_f + t_b)
    assert schedule_idle_fraction(blocks, pp) == pytest.approx((pp - 1) / (vpp * m))
    assert makespan(blocks) == pytest.approx(m * (tf + tb) * (1 + (pp - 1) / (vpp * m)))


def test_schedule_rejects_what_megatron_rejects():
    with pytest.raises(ValueError, match="divisible by pp"):
        pipeline_schedule(4, 2, 6, 1.0, 2.0)
    with pytest.raises(ValueError, match="one chunk per stage"):
        pipeline_schedule(4, 2, 8, 1.0, 2.0, schedule="1f1b")
    with pytest.raises(ValueError, match="schedule must be"):
        pipeline_schedule(4, 1, 8, 1.0, 2.0, schedule="gpipe")


def test_huge_micro_batch_counts_are_drawn_as_about_three_pp():
    assert drawn_micro_batches(4, 1, 6) == 6  # few: all of them
    assert drawn_micro_batches(4, 1, 1000) == 12
    assert drawn_micro_batches(8, 8, 48) == 16  # 3 pp would be 3,072 blocks: the cap allows two rounds
    k = drawn_micro_batches(64, 1, 1536)
    assert k == 64 and 2 * k * 64 <= SCHEDULE_BLOCK_CAP + 2 * 64 * 64
    for pp, vpp in ((8, 2), (16, 4), (32, 2)):
        k = drawn_micro_batches(pp, vpp, 10_000)
        assert k % pp == 0 and pp <= k <= 3 * pp


# ------------------------------------------------------------------ placement


def test_placement_of_tp2_dp2_pp2_on_two_nodes_of_four():
    c = cluster(2, 4, tiers=[("leaf", 2)])
    pm = placement_map(c, strategy(tp=2, dp=2, pp=2))
    d = pm["devices"]
    assert d["rank"] == list(range(8))
    assert d["node"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert d["local"] == [0, 1, 2, 3, 0, 1, 2, 3]
    # tp-cp-ep-dp-pp: tp innermost (stride 1), then dp (stride 2), then pp (stride 4)
    assert d["coord"]["tp"] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert d["coord"]["dp"] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert d["coord"]["pp"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert d["group"]["tp"] == [0, 0, 1, 1, 2, 2, 3, 3]  # {0,1} {2,3} {4,5} {6,7}
    assert d["group"]["dp"] == [0, 1, 0, 1, 2, 3, 2, 3]  # {0,2} {1,3} {4,6} {5,7}
    assert d["group"]["pp"] == [0, 1, 2, 3, 0, 1, 2, 3]  # {0,4} {1,5} ...
    links = pm["links"]
    assert links["tp"]["tier"] == "intra-node" and links["tp"]["link"] == "nvswitch"
    assert links["dp"]["tier"] == "intra-node" and links["dp"]["groups_by_tier"] == {"intra-node": 4}
    assert links["pp"]["tier"] == "leaf" and links["pp"]["link"] == "ib"
    assert links["pp"]["groups_by_tier"] == {"leaf": 4}
    assert links["ep"]["tier"] == "none" and links["ep"]["bandwidth_GBps"] is None
    assert [n["stages"] for n in pm["nodes"]] == [[0], [1]]
    assert pm["drawn_nodes"] == 2 and "all 2 nodes" in pm["note"]


@pytest.mark.parametrize(
    "order, dp_tier, pp_tier",
    [("tp-cp-ep-dp-pp", "leaf", "spine"), ("tp-cp-ep-pp-dp", "spine", "leaf")],
)
def test_dp_crosses_a_leaf_or_the_spine_depending_on_the_order(order, dp_tier, pp_tier):
    # 4 nodes x 2 devices, 2 nodes per leaf switch (2:1 oversubscribed), one spine over all four
    c = cluster(4, 2, tiers=[("leaf", 2), ("spine", 4)], oversubscription=2.0)
    pm = placement_map(c, strategy(tp=2, dp=2, pp=2, order=order))
    links = pm["links"]
    assert links["tp"]["actual_tier"] == "intra-node"
    # every one of the 4 DP and 4 PP groups spans a leaf or the spine
    assert links["dp"]["groups_by_tier"] == {dp_tier: 4} and links["dp"]["actual_tier"] == dp_tier
    assert links["pp"]["groups_by_tier"] == {pp_tier: 4} and links["pp"]["actual_tier"] == pp_tier
    assert links["pp"]["tier"] == pp_tier  # the cost model's view agrees


def test_dp_tier_and_oversubscription_follow_the_cost_model():
    c = cluster(4, 2, tiers=[("leaf", 2), ("spine", 4)], oversubscription=2.0)
    pm = placement_map(c, strategy(tp=2, dp=2, pp=2))
    links = pm["links"]
    assert links["dp"]["tier"] == "leaf" and links["pp"]["tier"] == "spine"
    # traffic leaving the leaf is slowed by its 2:1 oversubscription (costmodel.group_links)
    assert links["pp"]["oversubscription_factor"] == 2.0 and links["dp"]["oversubscription_factor"] == 1.0
    assert links["pp"]["bandwidth_GBps"] == pytest.approx(links["dp"]["bandwidth_GBps"] / 2)
    assert [n["switch"] for n in pm["nodes"]] == [
        {"leaf": 0, "spine": 0},
        {"leaf": 0, "spine": 0},
        {"leaf": 1, "spine": 0},
        {"leaf": 1, "spine": 0},
    ]


def test_cost_model_dp_tier_matches_the_actual_groups_when_cp_is_not_next_to_dp():
    c = cluster(4, 2, tiers=[("leaf", 2), ("spine", 4)], oversubscription=2.0)
    links = placement_map(c, strategy(tp=2, dp=2, pp=2, order="tp-cp-ep-pp-dp"))["links"]
    assert links["dp"]["tier"] == links["dp"]["actual_tier"] == "spine"


def test_expert_groups_take_consecutive_members_of_the_cp_dp_block():
    pm = placement_map(cluster(1, 8), strategy(cp=2, dp=4, ep=4))
    d = pm["devices"]
    # cp innermost, then dp: the joint index is the rank; EP = 4 consecutive ranks, EDP the other axis
    assert d["group"]["ep"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert d["coord"]["ep"] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert d["group"]["edp"] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert d["group"]["dp"] == [0] * 8  # the gradient group is dp x cp
    assert pm["links"]["ep"]["size"] == 4 and pm["links"]["edp"]["stride"] == 4


def test_large_clusters_list_devices_of_the_first_nodes_only():
    pm = placement_map(cluster(16, 8), strategy(dp=128), max_nodes=4)
    assert pm["drawn_nodes"] == 4 and len(pm["devices"]["rank"]) == 32
    assert len(pm["nodes"]) == 16 and "first 4 of 16" in pm["note"]


def test_placement_rejects_a_strategy_of_another_size():
    with pytest.raises(ValueError, match="device count"):
        placement_map(cluster(2, 4), strategy(tp=2))


# ------------------------------------------------------------------ the bundle


def load(name):
    return json.loads((CONTRACTS / name).read_text())


@pytest.fixture(scope="module")
def dense():
    model = {
        "name": "gpt-small",
        "num_layers": 16,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 16,
        "ffn_hidden_size": 8192,
        "vocab_size": 32000,
        "seq_length": 2048,
    }
    return ModelSpec.from_dict(model), ClusterSpec.from_dict(cluster(2, 8, tiers=[("leaf", 2)]))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_plan_visuals_schedule_reproduces_the_predicted_bubble(dense, recompute):
    model, c = dense
    training = TrainingConfig.from_dict({"global_batch_size": 32})
    s = strategy(tp=2, pp=4, dp=2, vpp=2, recompute=recompute)
    plan = evaluate(model, c, training, s).to_dict()
    pred = plan["predicted"]
    v = plan_visuals(model, c, training, plan)
    sched = v["schedule"]
    assert (sched["kind"], sched["pp"], sched["vpp"], sched["m"]) == ("interleaved", 4, 2, 16)
    assert sched["drawn_micro_batches"] == 12 and "first 12 of 16" in sched["note"]
    passes = 4.0 if recompute == "full" else 3.0
    assert sched["t_backward"] == pytest.approx(sched["t_forward"] * (passes - 1))
    ideal = pred["compute_s"] + pred["inline_comm_s"]
    assert 16 * (sched["t_forward"] + sched["t_backward"]) == pytest.approx(ideal)
    assert sched["bubble_fraction"] == pytest.approx(3 / 32)
    assert sched["makespan_s"] == pytest.approx(ideal + pred["bubble_s"], rel=1e-3)
    assert sched["drawn_bubble_fraction"] == pytest.approx(3 / 24, rel=1e-4)
    assert sched["layers_per_chunk"] == 2
    # the full schedule, simulated, ends where the cost model says
    full = pipeline_schedule(4, 2, 16, sched["t_forward"], sched["t_backward"])
    assert makespan(full) == pytest.approx(ideal + pred["bubble_s"], rel=1e-3)


def test_plan_visuals_breakdowns_add_up_to_the_prediction(dense):
    model, c = dense
    training = TrainingConfig.from_dict({"global_batch_size": 32, "overlap_grad_reduce": True})
    plan = evaluate(model, c, training, strategy(tp=2, pp=2, dp=2, cp=2, zero_stage=1)).to_dict()
    pred = plan["predicted"]
    v = plan_visuals(model, c, training, plan)
    st = v["step_time"]
    assert sum(st["parts"].values()) == pytest.approx(pred["step_time_s"], abs=1e-3)
    assert sum(k["exposed"] for k in st["comm"].values()) == pytest.approx(pred["exposed_comm_s"], abs=1e-3)
    for kind, c_ in st["comm"].items():
        assert c_["exposed"] + c_["overlapped"] == pytest.approx(c_["total"], abs=1e-4), kind
    assert st["comm"]["tp"]["overlapped"] == 0.0  # TP all-reduces are never hidden
    assert st["comm"]["cp"]["overlapped"] > 0.0  # ring attention hides behind the attention core
    mem = v["memory"]
    parts = sum(mem["parts"].values()) + mem["other"]
    assert parts == pytest.approx(pred["memory_GiB_per_device"]["total"], abs=0.02)
    assert mem["capacity"] == 80 and mem["fits"]
    assert v["placement"]["degrees"] == {"tp": 2, "cp": 2, "dp": 2, "pp": 2, "ep": 1}
    # any other plan on a page gets the same breakdowns from its predicted figures alone (no cluster at
    # hand: the capacity is read back from the headroom)
    light = plan_breakdown(pred)
    assert light["step_time"] == st
    assert light["memory"]["capacity"] == pytest.approx(80) and light["memory"]["parts"] == mem["parts"]
    assert plan_breakdown({}) is None and plan_breakdown(None) is None


@pytest.mark.skipif(not CONTRACTS.exists(), reason="contracts not present")
def test_seed_scenario_expert_groups_fill_a_leaf_and_data_parallel_crosses_the_spine():
    model = ModelSpec.from_dict(load("model-moe.json"))
    c = ClusterSpec.from_dict(load("cluster-atlas900.json"))
    training = TrainingConfig.from_dict(load("training.json"))
    s = strategy(cp=2, dp=512, ep=128, recompute="selective", zero_stage=3)
    v = plan_visuals(model, c, training, evaluate(model, c, training, s).to_dict())
    links = v["placement"]["links"]
    assert links["ep"]["span_nodes"] == 16 and links["ep"]["tier"] == "leaf"  # 128 ranks = one leaf
    assert links["ep"]["groups_by_tier"] == {"leaf": 8}
    assert links["dp"]["tier"] == "spine" and links["cp"]["tier"] == "intra-node"
    assert v["schedule"]["pp"] == 1 and v["schedule"]["bubble_fraction"] == 0.0
    assert len(v["placement"]["devices"]["rank"]) == 1024
    assert len(json.dumps(v)) < 400_000  # light enough to embed in a page
