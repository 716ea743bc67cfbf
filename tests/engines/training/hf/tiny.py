"""Tiny random-initialised models of each Hugging Face family the runtime reads, built with ``transformers``
itself and saved as the hub lays a model out (no download): the reference every equivalence test compares
the runtime against."""

from __future__ import annotations

from pathlib import Path

import torch

BASE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=320,
    max_position_embeddings=64,
)
# one config per family and feature (model_type first), small enough that every test builds its own
FAMILIES = {
    "llama": dict(model_type="llama"),
    "llama3.1": dict(
        model_type="llama",
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "llama-tied-biases": dict(
        model_type="llama", tie_word_embeddings=True, attention_bias=True, mlp_bias=True
    ),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3", head_dim=24),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(
        model_type="qwen2_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=2,
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=[0],
    ),
}
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")


def hf_config(family: str, **changes):
    from transformers import AutoConfig

    kw = {**FAMILIES[family], **changes}
    return AutoConfig.for_model(kw.pop("model_type"), **{**BASE, **kw})


def save_tiny(family: str, directory: Path, seed: int = 0, std: float = 0.2, **changes):
    """``transformers``' model of ``family``, every weight drawn from N(0, std) (not the family's init:
    routers, gates, biases and norms all take part), saved to ``directory``; returns the model (eval)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, **changes)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    model.save_pretrained(directory)
    return model


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(tokens)
    return (out.logits if hasattr(out, "logits") else out).float()
