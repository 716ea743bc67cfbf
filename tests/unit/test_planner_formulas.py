"""The cost model's formulas against values computed by hand from their sources."""

import numpy as np
import pytest

from tests.unit.planner_helpers import a100_cluster, full_strategy
from workers.planner import ClusterSpec, CostModel, Layouts, ModelSpec, TrainingConfig
from workers.planner.costmodel import all_reduce_time, group_links
from workers.planner.hardware import efficiency_for

GPT3 = {
    "name": "gpt3-175b",
    "num_layers": 96,
    "hidden_size": 12288,
    "num_attention_heads": 96,
    "num_kv_heads": 96,
    "ffn_hidden_size": 49152,
    "vocab_size": 51200,
    "seq_length": 2048,
    "activation": "gelu",
    "moe": None,
}
A100_NODE = a100_cluster(8, 8, tiers=(("leaf", 4), ("spine", 8)), oversubscription=2.0, name="dgx")


def cost_model(model=GPT3, cluster=A100_NODE, gbs=64):
    m, c = ModelSpec.from_dict(model), ClusterSpec.from_dict(cluster)
    # the paper's layout: attention scores stored, gradients reduced after the backward (Korthikanti et al.)
    t = TrainingConfig.from_dict(
        {"global_batch_size": gbs, "dtype": "bf16", "flash_attention": False, "overlap_grad_reduce": False}
    )
    return CostModel(m, c, t, efficiency_for(c.device.name)[1])


def layouts(**kw):
    return Layouts.from_strategies([full_strategy(**{"tp": 8, "dp": 8, **kw})])


def test_model_flops_match_megatron_formula():
    # Narayanan et al. SC'21 eq. (3) without recompute: 72 B s l h^2 (1 + s/6h + V/12lh)
    cm = cost_model()
    f = cm.forward_flops_per_sequence()
    B, s, n_layers, h, V = 1536, 2048, 96, 12288, 51200
    expected = 72 * B * s * n_layers * h**2 * (1 + s / (6 * h) + V / (12 * n_layers * h))
    assert 3 * B * (f["layers"] + f["logits"]) == pytest.approx(expected, rel=1e-12)


def test_hardware_flops_with_full_recompute_match_megatron_formula():
    # same paper, with full recompute: 96 B s l h^2 (1 + s/6h + V/16lh)
    cm = cost_model()
    f = cm.forward_flops_per_sequence()
    B, s, n_layers, h, V = 1, 2048, 96, 12288, 51200
    expected = 96 * B * s * n_layers * h**2 * (1 + s / (6 * h) + V / (16 * n_layers * h))
    assert 4 * f["layers"] + 3 * f["logits"] == pytest.approx(expected, rel=1e-12)


def test_gpt3_parameter_count():
    total = ModelSpec.from_dict(GPT3).parameter_count()["total"]
    assert total == pytest.approx(174.6e9, rel=0.005)


@pytest.mark.parametrize("sp", [False, True])
def test_activation_bytes_per_layer_match_korthikanti(sp):
    # Korthikanti et al. 2022 eq. 2 (TP) and eq. 3 (TP + SP), s=2048, b=1, h=12288, a=96, t=8
    cm = cost_model()
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    act = cm.layer_activation_bytes(layouts(sequence_parallel=sp))
    rep = act["replicated"] / t if sp else act["replicated"]
    got = float((rep + act["dense_split"] / t + act["core"] / t)[0])
    if sp:
        expected = s * b * h / t * (34 + 5 * a * s / h)
    else:
        expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert got == pytest.approx(expected, rel=1e-12)


def test_activation_memory_of_a_stage_follows_korthikanti_recompute_modes():
    # eq. 4/6: first stage of 1F1B holds p micro-batches of L/p layers; selective keeps 34 sbh/t per layer,
    # full keeps 2 sbh/t (with SP); plus the working set of one recomputed layer / attention core
    cm = cost_model(gbs=64)
    s, h, a, t, L, p = 2048, 12288, 96, 8, 96, 8
    sel = cm.memory(layouts(pp=p, dp=1, recompute="selective", sequence_parallel=True))["activations"][0]
    core_once = 5 * a * s * s / t
    assert sel == pytest.approx(34 * s * h / t * L + core_once, rel=1e-9)
    full = cm.memory(layouts(pp=p, dp=1, recompute="full", sequence_parallel=True))["activations"][0]
    one_layer = s * h / t * (34 + 5 * a * s / h)
    assert full == pytest.approx(2 * s * h / t * L + one_layer, rel=1e-9)


def test_ring_all_reduce_time_inside_a_node():
    cm = cost_model()
    eff = cm.eff
    g = group_links(cm.cluster, eff, np.array([8]), np.array([1]))
    n = 1e9
    bw = 300e9 * eff.collective_efficiency_intra
    # Thakur et al. 2005: 2(p-1) alpha + 2 (p-1)/p n / B
    expected = 2 * 7 * 3e-6 + 2 * 7 / 8 * n / bw
    assert float(all_reduce_time(g, n)[0]) == pytest.approx(expected, rel=1e-12)


def test_oversubscribed_tier_slows_groups_that_cross_it():
    cm = cost_model()  # 8 nodes of 8, 4 nodes under a 2:1 leaf
    inside_leaf = group_links(cm.cluster, cm.eff, np.array([4]), np.array([8]))  # 4 nodes under one leaf
    # one member per leaf: every edge of the ring leaves its leaf, and every rank of a leaf runs such a ring
    across = group_links(cm.cluster, cm.eff, np.array([2]), np.array([32]))
    assert float(across.bw_inter[0]) == pytest.approx(float(inside_leaf.bw_inter[0]) / 2.0)
    # 8 nodes, 4 under each leaf: the ring leaves each leaf on 1 of its 4 node edges there, a quarter of
    # what the nodes send, within the leaf's half-rate uplinks: not slowed
    wide = group_links(cm.cluster, cm.eff, np.array([8]), np.array([8]))
    assert float(wide.bw_inter[0]) == pytest.approx(float(inside_leaf.bw_inter[0]))


def test_bubble_is_p_minus_1_over_v_m_of_the_ideal_time():
    cm = cost_model(gbs=64)
    for vpp in (1, 3):
        tm = cm.timing(layouts(pp=8, dp=1, vpp=vpp, recompute="full"))
        m = 64
        assert float(tm["bubble"][0]) == pytest.approx(float(tm["ideal"][0]) * 7 / (vpp * m), rel=1e-12)


def test_shrinking_gemms_lowers_their_efficiency():
    from workers.planner.costmodel import gemm_efficiency

    eff = cost_model().eff
    big = gemm_efficiency(eff, 2048, 12288 * 3, 12288)
    tp8 = gemm_efficiency(eff, 2048, 12288 * 3 / 8, 12288)
    tp64 = gemm_efficiency(eff, 2048, 12288 * 3 / 64, 12288)
    assert big > tp8 > tp64
    # by hand: I = 1 / (1/2048 + 1/576 + 1/12288) = 438.9, eff = gemm_max I / (I + I_half)
    intensity = 1 / (1 / 2048 + 1 / 576 + 1 / 12288)
    assert tp64 == pytest.approx(eff.gemm_max * intensity / (intensity + eff.gemm_half_intensity))
