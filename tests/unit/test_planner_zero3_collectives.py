"""Achievable compute as a property of the device (a cited matmul figure turned into gemm_max) and ZeRO-3
collectives as a property of the framework (``hardware.FrameworkCollectives``): derived as documented,
charged as documented, and shown in the plan."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from workers.planner import ClusterSpec, CostModel, Layouts, ModelSpec, TrainingConfig
from workers.planner.costmodel import GroupLinks, shard_collective_time
from workers.planner.examples import reference_runs
from workers.planner.hardware import (
    achievable_compute,
    collectives_for,
    constants_of,
    derive_gemm,
    efficiency_for,
    find_profile,
    model_constants,
    profile_origin,
)
from workers.planner.search import search
from workers.planner.specs import SpecError, Strategy

# GPT-3 175B's shape (Brown et al. 2020, Table 2.1) on DGX A100 nodes with one 25 GB/s NIC per GPU
RUN = reference_runs()[0]
GPT3 = dict(
    RUN["model"],
    name="gpt3-175b",
    num_layers=96,
    hidden_size=12288,
    num_attention_heads=96,
    num_kv_heads=96,
    ffn_hidden_size=4 * 12288,
)


def _cluster(nodes: int) -> ClusterSpec:
    return ClusterSpec.from_dict(dict(RUN["cluster"], num_nodes=nodes))


def _zero3(dp: int, mbs: int) -> Strategy:
    doc = dict(tp=1, pp=1, dp=dp, ep=1, cp=1, vpp=1, micro_batch_size=mbs, recompute="full")
    return Strategy.from_dict(dict(doc, zero_stage=3, sequence_parallel=False), partial=False)


def _training(framework: str | None, gbs: int = 1536) -> TrainingConfig:
    doc = {"global_batch_size": gbs, "dtype": "fp16", "optimizer": "adam"}
    return TrainingConfig.from_dict(doc | ({"framework": framework} if framework else {}))


def test_a100_ceiling_derived_from_its_matmul_figure_is_the_fitted_one():
    """The A100's gemm_max / gemm_half_intensity come out of its MAMF fraction and the two shared
    constants, and equal the values the A100 fit found (the tuning set is untouched by the change)."""
    _name, profile = find_profile("A100-SXM4-80GB")
    derived = derive_gemm(profile)
    assert derived["gemm_max"] == pytest.approx(0.734, abs=5e-4)
    assert derived["gemm_half_intensity"] == pytest.approx(67.5, rel=2e-3)
    eff = efficiency_for("A100")[1]
    assert eff.gemm_max == pytest.approx(derived["gemm_max"])
    # the inverse gives the shared constants back
    back = constants_of(eff, profile)
    for k, v in model_constants().items():
        assert back[k] == pytest.approx(v, rel=1e-6)


def test_h100_ceiling_follows_its_own_matmul_figure_and_bandwidth():
    """H100: gemm_max scales with its lower MAMF fraction (80.3% vs the A100's 86.9%), the half-efficiency
    intensity with its peak / bandwidth ratio; both cited in the plan's efficiency profile."""
    a100 = efficiency_for("A100")[1]
    h100 = efficiency_for("H100")[1]
    assert h100.gemm_max == pytest.approx(a100.gemm_max * (794.5 / 989) / (271.2 / 312), rel=1e-3)
    ratio = (989.4 * h100.gemm_max / 3350) / (312 * a100.gemm_max / 2039)
    assert h100.gemm_half_intensity / a100.gemm_half_intensity == pytest.approx(ratio, rel=1e-3)
    shown = profile_origin("H100-SXM5-80GB")["achievable_compute"]
    assert shown["matmul_fraction_of_peak"] == pytest.approx(0.8033, abs=1e-4)
    assert "794.5" in shown["source"] and shown["confidence"] == "published"
    # the Ascend 910B has no published figure: the plan says it is assumed
    assert achievable_compute("Ascend-910B")["confidence"] == "assumed"
    # the measured cpu and the generic fallback list their own ceiling: nothing derived to show
    assert achievable_compute("some-unknown-chip") is None


def _links(size: int, per_node: int, inter: bool) -> GroupLinks:
    one = np.array([1.0])
    return GroupLinks(
        size=one * size,
        per_node=one * per_node,
        inter=np.array([inter]),
        bw_intra=one * 200e9,
        bw_inter=one * 20e9,
        lat_intra=2e-6,
        lat_inter=5e-6,
    )


def test_shard_collective_ring_vs_own_link_by_hand():
    """Ring: (p-1)/p of the buffer through min(intra, k x NIC) plus (p-1) latency steps per call; own link:
    the off-node share (p-k)/p through one NIC."""
    g = _links(64, 8, True)
    n = 10e9
    ring = shard_collective_time(g, n, calls=10)
    assert ring[0] == pytest.approx(10 * 63 * 5e-6 + 63 / 64 * n / 160e9)
    own = shard_collective_time(g, n, calls=10, per_device_link=True)
    assert own[0] == pytest.approx(10 * 63 * 5e-6 + max(7 / 64 * n / 200e9, 56 / 64 * n / 20e9))
    # inside one node both are the NVLink ring
    g1 = _links(8, 8, False)
    assert shard_collective_time(g1, n)[0] == pytest.approx(
        shard_collective_time(g1, n, per_device_link=True)[0]
    )
    assert shard_collective_time(_links(1, 1, False), n)[0] == 0.0


def test_framework_is_validated_at_the_edge():
    assert TrainingConfig.from_dict({"global_batch_size": 8}).framework == "cann-train"
    assert "framework" not in TrainingConfig.from_dict({"global_batch_size": 8}).to_dict()
    with pytest.raises(SpecError, match="framework"):
        TrainingConfig.from_dict({"global_batch_size": 8, "framework": "horovod"})
    assert collectives_for("deepspeed").zero3_inter_node == "per_device_link"
    assert collectives_for("fsdp").zero3_unit == "layer"
    for name in ("cann-train", "fsdp", "megatron-lm", "deepspeed"):
        described = collectives_for(name).describe()
        assert set(described["sources"]) >= {"zero3_inter_node", "zero3_unit"}


def _tflops(framework: str | None, nodes: int) -> float:
    dp = nodes * 8
    result = search(
        ModelSpec.from_dict(GPT3),
        _cluster(nodes),
        _training(framework),
        _zero3(dp, 1536 // dp),
        top_k=1,
        scaling=False,
    )
    assert result.best is not None, result.stats
    return result.best.predicted["hardware_tflops_per_device"]


def test_zero3_at_fixed_batch_per_device_link_falls_with_scale_ring_does_not():
    """175B, ZeRO-3, one micro-batch per GPU at a fixed global batch: with every rank's gathers on its own
    NIC (DeepSpeed) the gathered bytes per GPU stay ~3x the model while its compute halves per doubling,
    so throughput per GPU falls towards 1/N; rings over the node's 8 NICs (FSDP) stay compute-bound."""
    ring = [_tflops(None, n) for n in (48, 192)]
    own = [_tflops("deepspeed", n) for n in (48, 192)]
    assert ring[1] > 0.8 * ring[0]
    assert own[1] < 0.5 * own[0]
    assert own[0] < ring[0]


def test_zero3_memory_follows_the_framework_and_the_plan_shows_it():
    """FSDP holds two whole gathered blocks and one block's gradients; DeepSpeed at most
    max_live_parameters (never less than its widest matrix) and one reduce bucket."""
    model = ModelSpec.from_dict(GPT3)
    layouts = Layouts.from_strategies([_zero3(384, 4)], model.num_layers)
    eff = efficiency_for("A100")[1]
    fsdp = CostModel(model, _cluster(48), _training("fsdp"), eff).memory(layouts)
    ds = CostModel(model, _cluster(48), _training("deepspeed"), eff).memory(layouts)
    per_layer = 12 * 12288**2  # parameters of one GPT-3 block (Narayanan et al. SC'21 eq. 2, weights)
    shard = model.parameter_count()["total"] / 384
    assert fsdp["params"][0] / 2**30 == pytest.approx(
        (shard + 2 * per_layer * (1 - 1 / 384)) * 2 / 2**30, rel=0.02
    )
    assert ds["params"][0] < fsdp["params"][0] - per_layer * 2
    result = search(model, _cluster(48), _training("deepspeed"), _zero3(384, 4), top_k=1, scaling=False)
    shown = result.best.predicted["zero3_collectives"]
    assert shown["framework"] == "deepspeed" and shown["max_live_parameters"] == 1e9
    assert "deepspeed/runtime/zero/config.py" in shown["sources"]["max_live_parameters"]
    # a ZeRO-1 plan has no ZeRO-3 gathers to describe
    z1 = copy.deepcopy(_zero3(384, 4).to_dict()) | {"zero_stage": 1}
    other = search(model, _cluster(48), _training(None), Strategy.from_dict(z1), top_k=1, scaling=False)
    assert other.best is None or "zero3_collectives" not in other.best.predicted
