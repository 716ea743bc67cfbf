"""Each Hugging Face family against ``transformers`` itself, one process: the parameter count, the logits of
the same tokens (fp32, within 1e-4), and an export round trip that ``from_pretrained`` loads with the same
logits. Bad checkpoints and unsupported configs are errors naming what is wrong."""

from __future__ import annotations

import json

import pytest
import torch

from tests.engines.training.hf.tiny import FAMILIES, MOE, logits, save_tiny
from workers.planner.specs import SpecError
from workers.training.hf import HFWeightsError, load_hf_weights, save_hf, spec_from_hf_config
from workers.training.model import Transformer, num_params

SEQ = 32
TOL = 1e-4


def runtime_model(directory, **kw):
    spec = spec_from_hf_config(directory, seq_length=SEQ, **kw)
    model = Transformer(spec).eval()
    load_hf_weights(model, spec, directory)
    return spec, model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_runtime_is_the_family_parameters_logits_and_export(family, tmp_path):
    from transformers import AutoModelForCausalLM

    ref = save_tiny(family, tmp_path / "hf")
    spec, ours = runtime_model(tmp_path / "hf")
    counted = sum(p.numel() for p in ours.parameters())
    assert (
        ref.num_parameters() == spec.parameter_count()["total"] == counted == num_params(spec, active=False)
    )
    assert spec.arch.family == json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"]
    assert (spec.moe is not None) == (family in MOE)

    tokens = torch.randint(0, spec.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    expected, got = logits(ref, tokens), logits(ours, tokens)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOL

    save_hf(ours.state_dict(), spec, tmp_path / "out")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert (logits(back, tokens) - got).abs().max().item() <= TOL
    assert back.num_parameters() == counted
    # and the exported directory reads back as the same model spec
    again = spec_from_hf_config(tmp_path / "out", seq_length=SEQ)
    assert {k: v for k, v in again.to_dict().items() if k != "architecture"} == {
        k: v for k, v in spec.to_dict().items() if k != "architecture"
    }


def test_llama31_rope_scaling_is_applied_not_ignored(tmp_path):
    ref = save_tiny("llama3.1", tmp_path / "hf")
    spec, ours = runtime_model(tmp_path / "hf")
    assert spec.arch.rope_scaling["rope_type"] == "llama3" and spec.arch.rope_theta == 500000.0
    unscaled = Transformer(
        spec.__class__.from_dict(
            {**spec.to_dict(), "architecture": {**spec.arch.to_dict(), "rope_scaling": None}}
        )
    ).eval()
    unscaled.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, spec.vocab_size, (1, SEQ))
    assert (logits(ours, tokens) - logits(ref, tokens)).abs().max() <= TOL
    assert (logits(unscaled, tokens) - logits(ref, tokens)).abs().max() > 1e-3


def test_a_sharded_export_has_an_index_transformers_reads(tmp_path):
    from transformers import AutoModelForCausalLM

    save_tiny("qwen2_moe", tmp_path / "hf")
    spec, ours = runtime_model(tmp_path / "hf")
    save_hf(ours.state_dict(), spec, tmp_path / "out", shard_bytes=64 << 10)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 2 and all((tmp_path / "out" / s).exists() for s in shards)
    tokens = torch.randint(0, spec.vocab_size, (1, SEQ))
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert (logits(back, tokens) - logits(ours, tokens)).abs().max() <= TOL
    # and the runtime reads its own sharded directory too
    _, again = runtime_model(tmp_path / "out")
    assert (logits(again, tokens) - logits(ours, tokens)).abs().max() == 0


def test_a_pipeline_stage_reads_only_its_layers(tmp_path):
    save_tiny("llama", tmp_path / "hf")
    spec = spec_from_hf_config(tmp_path / "hf", seq_length=SEQ)
    stage = Transformer(spec)
    for layer_id in ("0", "1"):
        del stage.layers[layer_id]
    stage.tok_embeddings = None
    assert (
        load_hf_weights(stage, spec, tmp_path / "hf") == 2 * 9 + 2
    )  # layers 2, 3 (9 tensors each), norm, lm_head


def test_checkpoints_that_do_not_fit_name_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    save_tiny("llama", tmp_path / "hf")
    spec = spec_from_hf_config(tmp_path / "hf", seq_length=SEQ)
    weights = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(weights)

    missing = {k: v for k, v in tensors.items() if k != "model.layers.2.mlp.up_proj.weight"}
    save_file(missing, weights)
    with pytest.raises(HFWeightsError, match=r"lacks 1 tensor.*layers\.2\.mlp\.up_proj"):
        load_hf_weights(Transformer(spec), spec, tmp_path / "hf")

    save_file({**tensors, "model.layers.2.mlp.up_proj.weight": torch.zeros(3, 64)}, weights)
    with pytest.raises(
        HFWeightsError, match=r"up_proj.weight: shape \(3, 64\) in the checkpoint, \(96, 64\)"
    ):
        load_hf_weights(Transformer(spec), spec, tmp_path / "hf")

    save_file({**tensors, "model.layers.9.mlp.up_proj.weight": torch.zeros(96, 64)}, weights)
    with pytest.raises(HFWeightsError, match=r"not of this model \(llama, 4 layers\).*layers\.9"):
        load_hf_weights(Transformer(spec), spec, tmp_path / "hf")

    weights.write_bytes(b"not safetensors")
    with pytest.raises(HFWeightsError, match="not a readable safetensors file"):
        load_hf_weights(Transformer(spec), spec, tmp_path / "hf")
    weights.unlink()
    with pytest.raises(HFWeightsError, match="no model.safetensors"):
        load_hf_weights(Transformer(spec), spec, tmp_path / "hf")


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"model_type": "deepseek_v3"}, "model_type", "multi-head latent attention"),
        ({"model_type": "bert"}, "model_type", "supported: llama, mistral, qwen2, qwen3, mixtral"),
        ({"sliding_window": 16}, "sliding_window", "at most 16 tokens"),
        ({"hidden_act": "gelu"}, "hidden_act", "only SiLU"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling", "'yarn' is not supported"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "rope_scaling.low_freq_factor",
            "is required",
        ),
        ({"max_position_embeddings": 16}, "max_position_embeddings", "shorter than seq_length 32"),
        ({"num_hidden_layers": None}, "num_hidden_layers", "is required"),
        ({"mlp_only_layers": [1, 3]}, "mlp_only_layers", "only leading dense layers"),
    ],
)
def test_an_unsupported_config_is_an_error_naming_the_key(changes, field, words):
    from tests.engines.training.hf.tiny import hf_config

    family = "qwen3_moe" if "mlp_only_layers" in changes else "mistral"
    cfg = hf_config(family).to_dict()
    if "rope_scaling" in changes:  # a transformers 4 config: rope_scaling, no rope_parameters
        cfg.pop("rope_parameters", None)
    cfg.update(changes)
    cfg = {k: v for k, v in cfg.items() if v is not None or k not in changes}
    with pytest.raises(SpecError) as err:
        spec_from_hf_config(cfg, seq_length=SEQ)
    assert field in err.value.errors, err.value.errors
    assert any(words in m for m in err.value.errors[field]), err.value.errors


def test_a_window_as_long_as_the_sequence_is_plain_causal_attention(tmp_path):
    ref = save_tiny("mistral", tmp_path / "hf", sliding_window=SEQ)
    spec, ours = runtime_model(tmp_path / "hf")
    tokens = torch.randint(0, spec.vocab_size, (1, SEQ))
    assert (logits(ours, tokens) - logits(ref, tokens)).abs().max() <= TOL
