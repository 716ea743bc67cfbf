"""Uneven pipeline stages (``strategy.layers_per_stage``): the balanced split the search proposes when pp
does not divide the layers, each stage charged its own layers (the embedding on the first, the LM head on
the last), step time and memory following the heaviest stage, clear errors for a bad split, and the
training runtime building the same stages."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from tests.unit.planner_helpers import a100_cluster, full_strategy
from workers.planner import (
    ClusterSpec,
    CostModel,
    Layouts,
    ModelSpec,
    SpecError,
    Strategy,
    TrainingConfig,
    evaluate,
    search,
)
from workers.planner.cli import format_result
from workers.planner.hardware import efficiency_for
from workers.planner.search import R_PP, R_VPP_UNEVEN
from workers.planner.specs import balanced_stage_split, document_schema, stage_split_summary
from workers.planner.visual import plan_visuals

# Llama 3 405B (Dubey et al. 2024, Table 3): 126 layers, 16,384 wide, 128 heads, 8 KV heads, FFN 53,248,
# vocabulary 128K (128,256 in the released tokenizer); trained on pp = 16 with one layer fewer on the first
# and the last stage (§3.3.2)
LLAMA3_405B = {
    "name": "llama3-405b",
    "num_layers": 126,
    "hidden_size": 16384,
    "num_attention_heads": 128,
    "num_kv_heads": 8,
    "ffn_hidden_size": 53248,
    "vocab_size": 128256,
    "seq_length": 8192,
    "activation": "swiglu",
}


def dense(num_layers: int, vocab_size: int = 51200) -> ModelSpec:
    return ModelSpec.from_dict(
        {
            "name": f"dense-{num_layers}",
            "num_layers": num_layers,
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "num_kv_heads": 16,
            "ffn_hidden_size": 8192,
            "vocab_size": vocab_size,
            "seq_length": 2048,
        }
    )


def plan_of(model: ModelSpec, split=None, nodes: int = 1, **fields):
    s = full_strategy(**{"pp": 4, "dp": 2, **fields})
    if split is not None:
        s = dataclasses.replace(s, layers_per_stage=tuple(split))
    cluster = ClusterSpec.from_dict(a100_cluster(nodes))
    return evaluate(model, cluster, TrainingConfig(global_batch_size=32), s, scaling=False)


def llama_inputs():
    cluster = ClusterSpec.from_dict(a100_cluster(16))  # 128 devices: tp 8 x pp 16
    return ModelSpec.from_dict(LLAMA3_405B), cluster, TrainingConfig(global_batch_size=64)


# ---------------------------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("num_layers", [1, 2, 5, 24, 61, 64, 96, 126])
def test_the_balanced_split_is_as_even_as_possible_and_keeps_the_end_stages_lightest(num_layers):
    for pp in range(1, num_layers + 1):
        split = balanced_stage_split(num_layers, pp)
        base, extra = divmod(num_layers, pp)
        assert len(split) == pp and sum(split) == num_layers
        assert max(split) - min(split) <= 1  # as even as possible
        if extra == 0:
            assert split == (base,) * pp  # pp divides the layers: the even split, as before
            continue
        if pp >= 3 and extra <= pp - 2:
            # the remainder goes to the middle stages, from stage 1 on: the ends keep the base count
            assert split[0] == split[-1] == base
            assert split[1 : 1 + extra] == (base + 1,) * extra
        else:  # the remainder is pp - 1: every middle stage and the first take one more
            assert split[-1] == base and split[:-1] == (base + 1,) * (pp - 1)


def test_llama3_405b_on_pp16_gets_its_published_layout_by_the_rule():
    split = balanced_stage_split(126, 16)
    base, extra = divmod(126, 16)
    assert extra == 16 - 2  # one extra layer for each of the 14 middle stages
    assert split[0] == split[-1] == base and set(split[1:-1]) == {base + 1}
    assert split == (7,) + (8,) * 14 + (7,)  # Dubey et al. 2024 §3.3.2


def test_the_cost_models_vectorised_split_is_the_balanced_split():
    for num_layers in (1, 7, 24, 61, 126):
        cm = CostModel(dense(num_layers), ClusterSpec.from_dict(a100_cluster(1)), TrainingConfig(8), _eff())
        pps = np.arange(1, num_layers + 1)
        L = Layouts.from_strategies([full_strategy(pp=int(p)) for p in pps])
        got = cm.stage_layers(L)
        want = np.array([stage_split_summary(balanced_stage_split(num_layers, int(p))) for p in pps])
        assert np.array_equal(np.stack([got["first"], got["middle"], got["last"]], axis=1), want)


def _eff():
    return efficiency_for("A100")[1]


# ---------------------------------------------------------------------------------------------- the search


def test_126_layers_on_pp16_is_evaluated_and_the_plan_lists_its_split():
    model, cluster, training = llama_inputs()
    s = full_strategy(tp=8, pp=16, dp=1, recompute="full", sequence_parallel=True, zero_stage=1)
    plan = evaluate(model, cluster, training, s, scaling=False)
    assert plan.strategy.layers_per_stage == balanced_stage_split(126, 16)
    doc = plan.to_dict()["strategy"]
    assert doc["layers_per_stage"] == list(balanced_stage_split(126, 16))
    assert Strategy.from_dict(doc) == plan.strategy  # the plan's strategy reads back as the same layout
    assert plan.predicted["step_time_s"] > 0 and plan.predicted["memory_GiB_per_device"]["total"] > 0


def test_the_search_proposes_the_balanced_split_for_a_pp_that_does_not_divide_the_layers():
    model, cluster, training = llama_inputs()
    result = search(model, cluster, training, fixed={"tp": 8, "pp": 16}, top_k=3, scaling=False)
    assert result.best is not None, result.stats
    assert R_PP not in result.stats["rejected"]
    for plan in result.top + result.pareto:
        assert plan.strategy.layers_per_stage == balanced_stage_split(126, 16)
        assert plan.strategy.vpp == 1  # interleaving needs equal stages
    assert all(c["strategy"]["layers_per_stage"][0] == 7 for c in result.candidates)
    text = format_result(result, model, cluster, training)
    assert "layers per stage (first to last): 7, 8 x 14, 7" in text


def test_a_free_search_mixes_even_and_uneven_pipelines_and_writes_out_only_the_uneven_splits():
    model = dense(6)  # pp 4 does not divide 6 layers; 1 and 2 do
    cluster = ClusterSpec.from_dict(a100_cluster(1, 4))
    result = search(model, cluster, TrainingConfig(global_batch_size=16), top_k=1000, scaling=False)
    seen = {}
    for plan in result.top:
        seen.setdefault(plan.strategy.pp, plan.strategy.layers_per_stage)
    assert seen[4] == balanced_stage_split(6, 4) == (1, 2, 2, 1)
    assert seen[1] is None and seen[2] is None  # even splits stay implicit: the contract's fields only


def test_more_stages_than_layers_is_refused_with_the_reason():
    model = dense(4)
    cluster = ClusterSpec.from_dict(a100_cluster(1))
    with pytest.raises(SpecError) as exc:
        evaluate(model, cluster, TrainingConfig(global_batch_size=8), full_strategy(pp=8), scaling=False)
    assert "exceeds num_layers (4)" in exc.value.errors["strategy.pp"][0]
    result = search(model, cluster, TrainingConfig(global_batch_size=8), scaling=False)
    assert result.stats["rejected"][R_PP] >= 1 and R_PP == "pp exceeds num_layers"
    assert all(p.strategy.pp <= 4 for p in result.top)


def test_interleaving_uneven_stages_is_refused_clearly():
    model, cluster, training = llama_inputs()
    s = full_strategy(tp=8, pp=16, dp=1, vpp=2)
    with pytest.raises(SpecError) as exc:
        evaluate(model, cluster, training, s, scaling=False)
    (message,) = exc.value.errors["strategy.vpp"]
    assert "equal layers per stage" in message and "7, 8 x 14, 7" in message and "not supported" in message
    result = search(model, cluster, training, fixed={"tp": 8, "pp": 16, "vpp": 2}, scaling=False)
    assert result.best is None and result.stats["rejected"][R_VPP_UNEVEN] >= 1
    with pytest.raises(SpecError) as exc:
        Strategy.from_dict({"pp": 4, "vpp": 2, "layers_per_stage": [1, 2, 2, 1]})
    assert "need vpp = 1" in exc.value.errors["layers_per_stage"][0]
    # an even list interleaves as before
    assert Strategy.from_dict({"pp": 2, "vpp": 2, "layers_per_stage": [4, 4]}).layers_per_stage == (4, 4)


# ------------------------------------------------------------------------------------------ the cost model

PER_STAGE = ("step_time_s", "bubble_s", "compute_s", "inline_comm_s", "dp_exposed_s", "optimizer_s")


def _per_stage_figures(plan) -> dict:
    p = plan.predicted
    return {
        **{k: p[k] for k in PER_STAGE},
        **{f"memory.{k}": v for k, v in p["memory_GiB_per_device"].items()},
        **{f"comm.{k}": v for k, v in p["comm_s"].items()},
        "volume": p["comm_volume_GB_per_device"],
    }


@pytest.mark.parametrize(("num_layers", "split"), [(31, (8, 8, 7, 8)), (30, (8, 7, 7, 8))])
def test_an_uneven_split_costs_what_an_even_split_with_the_same_heaviest_stages_costs(num_layers, split):
    # 32 layers on pp 4: 8 a stage. Taking layers off middle stages leaves every stage that binds (the first
    # with the embedding and the most micro-batches in flight, the last with the LM head) as it was
    even = plan_of(dense(32))
    uneven = plan_of(dense(num_layers), split)
    assert even.strategy.layers_per_stage is None and uneven.strategy.layers_per_stage == split
    assert _per_stage_figures(uneven) == _per_stage_figures(even)
    # what is not per stage follows the whole model: fewer layers, fewer model FLOPs in the same step
    ratio = uneven.predicted["model_tflops_per_device"] / even.predicted["model_tflops_per_device"]
    assert 0.9 < ratio < 1.0


def test_step_time_and_memory_follow_the_heaviest_stage():
    model = dense(24)
    even = plan_of(model)  # 6, 6, 6, 6
    heavy_middle = plan_of(model, (4, 12, 4, 4))
    for name in ("step_time_s", "bubble_s", "compute_s"):
        assert heavy_middle.predicted[name] > 1.5 * even.predicted[name]
    assert (
        heavy_middle.predicted["memory_GiB_per_device"]["activations"]
        > even.predicted["memory_GiB_per_device"]["activations"]
    )
    # the steady state and the bubble both run at the slowest stage's pace, wherever it sits
    later = plan_of(model, (4, 4, 12, 4))
    assert later.predicted["step_time_s"] == heavy_middle.predicted["step_time_s"]
    p = heavy_middle.predicted
    ideal = p["compute_s"] + p["inline_comm_s"]
    assert p["bubble_s"] == pytest.approx(ideal * (4 - 1) / p["num_micro_batches"], rel=1e-3)


def test_the_embedding_sits_on_the_first_stage_and_the_lm_head_on_the_last():
    model = dense(24, vocab_size=256_000)  # a large vocabulary: the LM head costs more than a layer
    light_last = plan_of(model, (7, 6, 6, 5))
    heavy_last = plan_of(model, (5, 6, 6, 7))
    # the same layer counts at the ends, mirrored: the LM head makes a heavy last stage the slower one
    assert heavy_last.predicted["step_time_s"] > light_last.predicted["step_time_s"]

    cm = CostModel(model, ClusterSpec.from_dict(a100_cluster(1)), TrainingConfig(32), _eff())
    L = Layouts.from_strategies(
        [dataclasses.replace(full_strategy(pp=4, dp=2), layers_per_stage=(6, 6, 6, 6))]
    )
    by_stage = cm.parameters_by_stage(L)
    vocab_matrix = model.vocab_size * model.hidden_size
    # first and last: the middle stage's layers plus one vocabulary matrix each; the middle: none
    for end in ("first", "last"):
        assert by_stage[end]["dense"][0] - by_stage["middle"]["dense"][0] == pytest.approx(vocab_matrix)
    assert cm.stage_parameters(L)["dense"][0] == pytest.approx(by_stage["first"]["dense"][0])
    # a single stage holds both ends: the whole model (its final norm aside)
    one = Layouts.from_strategies([full_strategy(dp=8)])
    assert cm.stage_parameters(one)["dense"][0] == pytest.approx(model.parameter_count()["total"], rel=1e-5)


# ---------------------------------------------------------------------------------------------- the contract


def test_layers_per_stage_is_optional_and_round_trips():
    assert "layers_per_stage" not in Strategy.from_dict({"pp": 4}).to_dict()
    doc = {**full_strategy(pp=3).to_dict(), "layers_per_stage": [1, 2, 1]}
    s = Strategy.from_dict(doc, partial=False)
    assert s.layers_per_stage == (1, 2, 1) and s.to_dict() == doc
    assert s.stage_layers(4) == (1, 2, 1)
    assert Strategy.from_dict({"pp": 3}).stage_layers(4) == balanced_stage_split(4, 3)
    prop = document_schema(Strategy)["properties"]["layers_per_stage"]
    assert prop["type"] == "array" and prop["items"] == {"type": "integer"} and prop["nullable"] is True


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([8, 8, 8], "one layer count per pipeline stage (pp=4), got 3"),
        ([8, 0, 8, 8], "integers >= 1"),
        ([8, -1, 8, 8], "integers >= 1"),
        ([8, 8.5, 8, 8], "integers >= 1"),
        ([8, True, 8, 8], "integers >= 1"),
        ([], "non-empty list"),
        ("8,8,8,8", "non-empty list"),
    ],
)
def test_a_bad_layers_per_stage_is_an_error_naming_the_field(value, words):
    with pytest.raises(SpecError) as exc:
        Strategy.from_dict({"pp": 4, "layers_per_stage": value})
    assert set(exc.value.errors) == {"layers_per_stage"}
    assert words in exc.value.errors["layers_per_stage"][0]


def test_a_split_that_does_not_sum_to_the_layers_is_an_error_naming_the_field():
    model, cluster, training = llama_inputs()
    split = (8,) * 16  # 128 layers, the model has 126
    s = dataclasses.replace(full_strategy(tp=8, pp=16, dp=1), layers_per_stage=split)
    with pytest.raises(SpecError) as exc:
        evaluate(model, cluster, training, s, scaling=False)
    assert exc.value.errors["strategy.layers_per_stage"] == [
        "must sum to num_layers (126), got 128 (" + ", ".join(["8"] * 16) + ")"
    ]
    with pytest.raises(SpecError) as exc:  # a partial strategy: the search checks it before enumerating
        search(model, cluster, training, fixed={"layers_per_stage": list(split)}, scaling=False)
    assert "strategy.layers_per_stage" in exc.value.errors


def test_a_pinned_split_pins_pp_and_is_costed_as_given():
    model, cluster, training = llama_inputs()
    split = [6] + [8] * 14 + [8]  # a hand-made layout: the first stage two layers lighter
    result = search(model, cluster, training, fixed={"tp": 8, "layers_per_stage": split}, scaling=False)
    assert result.best is not None
    assert {p.strategy.pp for p in result.top} == {16}
    assert all(p.strategy.layers_per_stage == tuple(split) for p in result.top)
    assert all(c["strategy"]["layers_per_stage"] == split for c in result.candidates)


def test_the_visualizer_shows_the_plans_split():
    model, cluster, training = llama_inputs()
    s = full_strategy(tp=8, pp=16, dp=1, recompute="full", sequence_parallel=True, zero_stage=1)
    plan = evaluate(model, cluster, training, s, scaling=False).to_dict()
    schedule = plan_visuals(model, cluster, training, plan)["schedule"]
    assert schedule["layers_per_stage"] == list(balanced_stage_split(126, 16))
    assert schedule["layers_per_chunk"] == 8  # the heaviest stage's
    small = ClusterSpec.from_dict(a100_cluster(1))
    even = evaluate(dense(24), small, training, full_strategy(pp=4, dp=2), scaling=False).to_dict()
    assert plan_visuals(dense(24), small, training, even)["schedule"]["layers_per_stage"] == [6, 6, 6, 6]


# ---------------------------------------------------------------------------------------------- the runtime

EXAMPLES = Path(__file__).resolve().parents[2] / "workers" / "training" / "examples"


def _tiny(num_layers: int) -> dict:
    return {**json.loads((EXAMPLES / "tiny-dense.json").read_text()), "num_layers": num_layers}


def test_the_runtime_builds_the_listed_stages_and_they_compose_to_the_model():
    import torch

    from workers.training.config import parse_model
    from workers.training.model import Transformer
    from workers.training.parallel.pipeline import pipeline_split

    cfg = parse_model(_tiny(5))
    model = Transformer(cfg)
    model.init_weights(3)
    tokens = torch.randint(0, 256, (2, cfg.seq_length))
    expected = model(tokens)
    for split, pp in (((1, 3, 1), 3), (None, 3), ((4, 1), 2)):
        stages = {}
        for pp_rank in range(pp):
            ((index, part),) = pipeline_split(model, pp_rank, pp=pp, vpp=1, layers_per_stage=split)
            stages[index] = part
        want = split or balanced_stage_split(5, pp)  # absent: what the planner costs
        layers = [[int(k) for k in stages[i].layers.keys()] for i in range(pp)]
        assert [len(ids) for ids in layers] == list(want)
        assert sum(layers, []) == list(range(5))
        assert stages[0].tok_embeddings is not None and stages[pp - 1].output is not None
        h = tokens
        for i in range(pp):
            h = stages[i](h)
        assert torch.allclose(h, expected, atol=1e-6)


def test_the_runtime_accepts_an_uneven_plan_and_refuses_a_split_that_does_not_fit():
    from workers.training.config import ConfigError, JobConfig

    strategy = {**full_strategy(pp=3).to_dict(), "micro_batch_size": 1}
    job = {"model": _tiny(5), "training": {"global_batch_size": 4}, "steps": 1}
    cfg = JobConfig.from_dict({**job, "strategy": {**strategy, "layers_per_stage": [1, 3, 1]}})
    assert cfg.strategy.layers_per_stage == (1, 3, 1)
    assert JobConfig.from_dict(cfg.to_dict()).strategy == cfg.strategy
    with pytest.raises(ConfigError) as exc:
        JobConfig.from_dict({**job, "strategy": {**strategy, "layers_per_stage": [1, 1, 1]}})
    assert exc.value.field == "strategy.layers_per_stage" and "must sum to num_layers (5)" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        JobConfig.from_dict({**job, "strategy": {**strategy, "layers_per_stage": [2, 3]}})
    assert exc.value.field == "strategy.layers_per_stage" and "pp=3" in str(exc.value)
