"""Scaling a big plan down to this machine (``workers.planner.scale.scale_down``): the same kinds of
parallelism at degree 2 as far as the ranks allow, dropped in a fixed order when they do not, a small model
whose shape keeps the original's (attention kind, FFN ratio, MoE), every change listed with its reason, and
a result the planner and the training runtime both accept."""

from __future__ import annotations

import pytest

from workers import planner
from workers.planner.examples import contract, this_machine_cluster
from workers.planner.scale import KEEP_ORDER, scale_down
from workers.planner.specs import PLAIN_STRATEGY
from workers.training.config import JobConfig

SEED_MODEL = planner.ModelSpec.from_dict(contract("model-moe.json"))
SEED_TRAINING = planner.TrainingConfig.from_dict(contract("training.json"))
GPT3 = planner.ModelSpec.from_dict(
    {
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
)
LLAMA_GQA = planner.ModelSpec.from_dict(
    {
        "name": "llama3-70b-like",
        "num_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_kv_heads": 8,
        "ffn_hidden_size": 28672,
        "vocab_size": 128256,
        "seq_length": 8192,
        "activation": "swiglu",
        "moe": None,
    }
)
HERE = planner.ClusterSpec.from_dict(this_machine_cluster()[0])


def strategy(**kw) -> dict:
    return {**PLAIN_STRATEGY, **kw}


def runtime_accepts(scaled) -> JobConfig:
    return JobConfig.from_dict(
        {
            "model": scaled.model.to_dict(),
            "strategy": scaled.strategy.to_dict(),
            "training": scaled.training.to_dict(),
            "steps": 2,
            "device": "cpu",
        }
    )


def test_seed_best_plan_keeps_cp_ep_and_dp_at_two_on_four_ranks():
    # the seed scenario's best plan: tp1-pp1-dp512-ep128-cp2, ZeRO-3, selective recompute (1024 devices)
    big = strategy(dp=512, ep=128, cp=2, recompute="selective", zero_stage=3)
    scaled = scale_down(big, SEED_MODEL, SEED_TRAINING, max_devices=4, target=HERE)
    s = scaled.strategy
    assert (s.tp, s.pp, s.dp, s.ep, s.cp) == (1, 1, 2, 2, 2)
    assert scaled.kept == ["cp", "ep", "dp"] and scaled.dropped == []
    assert (s.recompute, s.zero_stage) == ("selective", 3)  # the rest of the layout is the plan's
    assert scaled.model.moe is not None and scaled.model.moe.num_experts % s.ep == 0
    assert scaled.devices == 4 == scaled.cluster.num_devices and scaled.cluster.num_nodes == 1
    assert scaled.plan.feasible, scaled.plan.reason
    runtime_accepts(scaled)


def test_when_ranks_run_short_kinds_are_dropped_in_keep_order_and_said_so():
    big = strategy(tp=4, pp=8, dp=16, cp=2, vpp=6, zero_stage=1, sequence_parallel=True)
    scaled = scale_down(big, GPT3, SEED_TRAINING, max_devices=4)
    s = scaled.strategy
    assert (s.tp, s.pp, s.cp, s.dp, s.vpp) == (2, 2, 1, 1, 2)  # tp and pp come first; interleaving stays
    assert scaled.kept == ["tp", "pp"] and scaled.dropped == ["cp", "dp"]
    assert s.sequence_parallel is True
    dropped = {c.field: c for c in scaled.changes if c.field in ("strategy.cp", "strategy.dp")}
    assert dropped["strategy.cp"].original == 2 and dropped["strategy.cp"].scaled == 1
    assert "dropped" in dropped["strategy.dp"].why and "4 ranks" in dropped["strategy.dp"].why
    # with room for every kind, nothing is dropped
    roomy = scale_down(big, GPT3, SEED_TRAINING, max_devices=16)
    assert roomy.dropped == [] and roomy.devices == 16


def test_every_changed_field_is_listed_with_original_and_scaled_values():
    big = strategy(tp=8, pp=4, dp=32, micro_batch_size=2, recompute="full", zero_stage=1)
    scaled = scale_down(big, LLAMA_GQA, SEED_TRAINING, max_devices=4, target=HERE)
    changes = {c.field: c for c in scaled.changes}
    assert changes["cluster.devices"].original == 8 * 4 * 32 and changes["cluster.devices"].scaled == 4
    assert (changes["strategy.tp"].original, changes["strategy.tp"].scaled) == (8, 2)
    assert (changes["model.num_layers"].original, changes["model.num_layers"].scaled) == (80, 2)
    assert changes["model.hidden_size"].scaled == 64
    assert changes["training.dtype"].scaled == "fp32"
    assert "strategy.recompute" not in changes and "strategy.zero_stage" not in changes
    for c in scaled.changes:
        assert c.original != c.scaled and c.why
    # grouped-query attention stays grouped; the FFN keeps the 3.5x ratio, divisible by tp
    m = scaled.model
    assert m.num_kv_heads < m.num_attention_heads and m.num_kv_heads % scaled.strategy.tp == 0
    assert m.ffn_hidden_size == 224 and m.ffn_hidden_size % scaled.strategy.tp == 0
    runtime_accepts(scaled)


def test_a_single_rank_keeps_nothing_but_still_runs():
    scaled = scale_down(strategy(tp=2, pp=2, dp=4), GPT3, SEED_TRAINING, max_devices=1)
    assert scaled.devices == 1 and scaled.kept == [] and scaled.dropped == ["tp", "pp", "dp"]
    runtime_accepts(scaled)


@pytest.mark.parametrize("model", [SEED_MODEL, GPT3, LLAMA_GQA], ids=lambda m: m.name)
def test_the_fastest_plans_of_the_seed_cluster_scale_to_plans_both_planner_and_runtime_accept(model):
    cluster = planner.ClusterSpec.from_dict(contract("cluster-atlas900.json"))
    result = planner.search(model, cluster, SEED_TRAINING, top_k=5, scaling=False)
    assert result.best is not None
    for plan in result.top:
        scaled = scale_down(plan.strategy, model, SEED_TRAINING, max_devices=4, target=HERE)
        used = [k for k in KEEP_ORDER if getattr(plan.strategy, k) > 1]
        assert set(scaled.kept) | set(scaled.dropped) == set(used)
        assert all(getattr(scaled.strategy, k) == 2 for k in scaled.kept)
        assert scaled.devices <= 4 and scaled.plan.feasible
        runtime_accepts(scaled)
