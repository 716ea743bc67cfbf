"""The plain model: shapes, MoE routing figures, pipeline splitting, parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from workers.planner.specs import ModelSpec
from workers.training.config import ConfigError, ModelConfig, parse_model
from workers.training.model import Transformer, num_params
from workers.training.parallelize import (
    ContextParallelAttention,
    ParallelDims,
    cp_positions,
    pipeline_bubble_fraction,
    pipeline_split,
    stage_layer_ranges,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "workers" / "training" / "examples"


def load(name: str) -> ModelConfig:
    return parse_model(json.loads((EXAMPLES / name).read_text()))


@pytest.mark.parametrize("name", ["tiny-dense.json", "tiny-gelu.json", "tiny-moe.json"])
def test_forward_gives_logits_over_the_vocabulary_and_counts_match(name):
    cfg = load(name)
    model = Transformer(cfg)
    model.init_weights(0)
    tokens = torch.randint(0, 256, (2, cfg.seq_length))
    logits = model(tokens)
    assert logits.shape == (2, cfg.seq_length, cfg.vocab_size)
    assert torch.isfinite(logits).all()
    assert num_params(cfg, active=False) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("activation", "gated"), [("relu", False), ("geglu", True), ("swiglu", True)])
def test_every_contract_activation_trains_with_the_planners_matrix_count(activation, gated):
    d = {**json.loads((EXAMPLES / "tiny-moe.json").read_text()), "activation": activation}
    cfg = parse_model(d)
    model = Transformer(cfg)
    model.init_weights(0)
    block = model.layers["0"].feed_forward
    assert (block.w3 is not None) == gated == cfg.gated
    loss = model(torch.randint(0, 256, (2, cfg.seq_length))).logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert num_params(cfg, active=False) == sum(p.numel() for p in model.parameters())


def test_runtime_reads_model_json_with_the_planners_defaults_and_rules():
    d = json.loads((EXAMPLES / "tiny-moe.json").read_text())
    del d["activation"]
    # one parser: the model the planner costs is the model the runtime trains
    assert parse_model(d) == ModelSpec.from_dict(d)
    assert Transformer(parse_model(d)).layers["0"].feed_forward.w3 is None  # the contract default is gelu
    bad = {**d, "num_kv_heads": 3, "moe": {**d["moe"], "top_k": 99}}
    with pytest.raises(ConfigError) as err:
        parse_model(bad)
    assert set(err.value.errors) == {"model.num_kv_heads", "model.moe.top_k"}  # every problem, named
    for field, change in (
        ("model.hidden_size", {"hidden_size": 36, "num_attention_heads": 4, "num_kv_heads": 4}),  # head dim 9
        ("model.vocab_size", {"vocab_size": 100}),
        ("model", None),
    ):
        with pytest.raises(ConfigError) as err:
            parse_model({**d, **change} if change else [d])
        assert err.value.field == field


def test_same_seed_same_weights_and_causal_outputs():
    cfg = load("tiny-dense.json")
    a, b = Transformer(cfg), Transformer(cfg)
    a.init_weights(7), b.init_weights(7)
    tokens = torch.randint(0, 256, (1, cfg.seq_length))
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 256
    out, out_changed = a(tokens), b(changed)
    assert torch.allclose(out[:, :-1], out_changed[:, :-1], atol=1e-6)  # the future cannot leak backwards
    assert not torch.allclose(out[:, -1], out_changed[:, -1])


def test_moe_routes_top_k_per_token_and_tracks_expert_load():
    cfg = load("tiny-moe.json")
    model = Transformer(cfg)
    model.init_weights(0)
    model(torch.randint(0, 256, (3, cfg.seq_length)))
    layers = model.moe_layers()
    assert sorted(layers) == cfg.moe_layer_ids == [1, 2, 3]  # first_dense_layers = 1
    for moe in layers.values():
        assert moe.tokens_per_expert.sum().item() == 3 * cfg.seq_length * cfg.moe.top_k


def test_expert_bias_steers_routing_without_changing_gate_weights():
    cfg = load("tiny-moe.json")
    model = Transformer(cfg)
    model.init_weights(0)
    moe = model.moe_layers()[1]
    x = torch.randn(1, 8, cfg.hidden_size)
    moe.tokens_per_expert.zero_()
    moe.expert_bias[:] = torch.tensor([10.0, 10.0, -10.0, -10.0])
    moe(x)
    assert moe.tokens_per_expert.tolist() == [8.0, 8.0, 0.0, 0.0]


def test_pipeline_stages_compose_to_the_full_model():
    cfg = load("tiny-dense.json")
    model = Transformer(cfg)
    model.init_weights(1)
    tokens = torch.randint(0, 256, (2, cfg.seq_length))
    expected = model(tokens)
    stages = {}
    for pp_rank in range(2):
        for index, part in pipeline_split(model, pp_rank, pp=2, vpp=2):
            stages[index] = part
    assert sorted(stages) == [0, 1, 2, 3]
    assert [list(stages[i].layers.keys()) for i in range(4)] == [["0"], ["1"], ["2"], ["3"]]
    assert stages[0].tok_embeddings is not None and stages[1].tok_embeddings is None
    assert stages[3].output is not None and stages[2].output is None
    h = tokens
    for i in range(4):
        h = stages[i](h)
    assert torch.allclose(h, expected, atol=1e-6)


def test_stage_ranges_and_ideal_bubble():
    assert [list(r) for r in stage_layer_ranges(5, 2)] == [[0, 1, 2], [3, 4]]
    assert pipeline_bubble_fraction(1, 1, 8) == 0.0
    assert pipeline_bubble_fraction(4, 1, 8) == pytest.approx(3 / 11)
    assert pipeline_bubble_fraction(4, 2, 8) == pytest.approx(3 / 19)


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_chunks_cover_the_sequence_once_with_equal_causal_work(cp):
    seq = 32
    positions = [cp_positions(seq, cp, r) for r in range(cp)]
    assert sorted(torch.cat(positions).tolist()) == list(range(seq))
    assert positions[0].tolist()[: seq // (2 * cp)] == list(range(seq // (2 * cp)))  # rank 0: first chunk
    assert positions[0][-1].item() == seq - 1  # ... and the last
    work = []
    for r in range(cp):
        mask = ContextParallelAttention(None, positions, r, torch.device("cpu")).mask
        # each local query sees exactly the keys at or before its true position
        assert mask.sum(1).tolist() == (positions[r] + 1).tolist()
        work.append(int(mask.sum()))
    assert len(set(work)) == 1  # load-balanced: every rank computes the same number of scores


def test_rank_layout_puts_tp_innermost_then_cp():
    dims = ParallelDims(dp=2, tp=2, pp=2, ep=2, world_size=16, cp=2)
    coords = [dims.coordinates(r) for r in range(16)]
    assert [c["tp"] for c in coords[:4]] == [0, 1, 0, 1]
    assert [c["cp"] for c in coords[:4]] == [0, 0, 1, 1]
    assert [c["dp"] for c in coords[:8:2]] == [0, 0, 1, 1] and coords[8]["pp"] == 1
    # expert-parallel groups are consecutive ranks of the flattened dp x cp group
    assert [(c["ep"], c["edp"]) for c in coords[:8:2]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    with pytest.raises(ValueError, match="dp\\*cp"):
        ParallelDims(dp=1, tp=1, pp=1, ep=4, world_size=2, cp=2)


@pytest.mark.parametrize("name", ["tiny-dense.json", "tiny-moe.json"])
def test_build_skips_only_the_default_init_that_init_weights_overwrites(name):
    cfg = load(name)
    slow = Transformer(cfg)
    slow.init_weights(3)
    fast = Transformer.build(cfg, 3)
    assert slow.state_dict().keys() == fast.state_dict().keys()
    for key, value in slow.state_dict().items():  # parameters and buffers, bit for bit
        assert torch.equal(value, fast.state_dict()[key]), key
    # torch.nn.init is itself again afterwards
    t = torch.zeros(4)
    torch.nn.init.ones_(t)
    assert t.eq(1).all()
