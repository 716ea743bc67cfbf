"""A model as a person reads it: its architecture, its parameters by part (embedding, attention, MLP or
experts, active per token) and its FLOPs per token, computed from the ``model.json`` document alone with
the planner's own counts (``ModelSpec.parameter_count``, ``costmodel.compute.forward_flops_per_sequence``)
for the model pages (``controlplane.planning``)."""

from __future__ import annotations

from typing import Any

from .costmodel.compute import forward_flops_per_sequence
from .specs import ModelSpec


def model_figures(model: ModelSpec) -> dict[str, Any]:
    """``parameters`` by part and in all, ``active_per_token`` (a token passes through top_k of the routed
    experts, every other weight), ``flops_per_token`` (forward, and training: forward + backward = 3x,
    no recompute; the attention scores' s^2 term included, spread over the sequence) and ``architecture``
    rows (label, value)."""
    p = model.parameter_count()
    experts = p["experts"]
    routed_share = model.moe.top_k / model.moe.num_experts if model.moe else 1.0
    active = p["total"] - experts + experts * routed_share
    flops = forward_flops_per_sequence(model)
    forward = sum(v for k, v in flops.items() if k != "core") / model.seq_length
    rows = [
        ("layers", model.num_layers),
        ("hidden size", model.hidden_size),
        ("attention heads", model.num_attention_heads),
        ("key/value heads", model.num_kv_heads),
        ("head width", model.head_dim),
        ("FFN hidden size", model.ffn_hidden_size),
        ("activation", model.activation),
        ("vocabulary", model.vocab_size),
        ("sequence length", model.seq_length),
        ("tied embeddings", "yes" if model.tied_embeddings else "no"),
        ("family", model.arch.family),
    ]
    if model.moe:
        m = model.moe
        rows += [
            ("experts", m.num_experts),
            ("experts per token (top-k)", m.top_k),
            ("shared experts", m.num_shared_experts),
            ("expert FFN hidden size", m.expert_ffn_hidden_size),
            ("MoE layers", f"{model.num_moe_layers} of {model.num_layers}"),
        ]
    return {
        "parameters": {
            "embedding": p["embedding"],
            "attention": p["attention"],
            "mlp": p["dense_mlp"],
            "experts": experts,
            "router_and_shared": p["shared"],
            "norms": p["norms"],
            "total": p["total"],
        },
        "parameter_rows": [
            ("embedding" if model.tied_embeddings else "embedding and output", p["embedding"]),
            ("attention", p["attention"]),
            ("dense MLP", p["dense_mlp"]),
            *([("routed experts", experts), ("router and shared experts", p["shared"])] if model.moe else []),
            ("norms", p["norms"]),
        ],
        "active_per_token": active,
        "flops_per_token": {"forward": forward, "training": 3 * forward},
        "attention_score_share": flops["core"] / (forward * model.seq_length) if forward else 0.0,
        "architecture": rows,
        "is_moe": model.moe is not None,
    }
