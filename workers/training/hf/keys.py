"""Which tensor of a Hugging Face checkpoint is which parameter of the runtime's :class:`Transformer`.

The checkpoints' names are the hub's (what ``save_pretrained`` writes and the hub serves): per-expert
tensors (``...experts.3.gate_proj.weight``), which the runtime stacks into one ``[E, ...]`` parameter per
projection (``moe.experts.w1``: expert parallelism keeps a slice of dim 0). Gate / up / down are the
runtime's ``w1`` / ``w3`` / ``w2`` (torchtitan's names; Mixtral's checkpoints use them too).
"""

from __future__ import annotations

import re

from workers.planner.specs import ModelSpec

TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# a layer's parameters that every family names alike (the runtime's suffix -> the checkpoint's)
LAYER = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.wo.bias": "self_attn.o_proj.bias",
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w1.bias": "mlp.gate_proj.bias",
    "feed_forward.w3.bias": "mlp.up_proj.bias",
    "feed_forward.w2.bias": "mlp.down_proj.bias",
}
MOE_LAYER = {
    "mixtral": {"moe.router.weight": "block_sparse_moe.gate.weight"},
    "qwen": {
        "moe.router.weight": "mlp.gate.weight",
        "moe.shared_experts.w1.weight": "mlp.shared_expert.gate_proj.weight",
        "moe.shared_experts.w3.weight": "mlp.shared_expert.up_proj.weight",
        "moe.shared_experts.w2.weight": "mlp.shared_expert.down_proj.weight",
        "moe.shared_gate.weight": "mlp.shared_expert_gate.weight",
    },
}
# a stacked expert parameter -> the checkpoint's name of expert {e}'s slice of it
EXPERTS = {
    "mixtral": {
        "moe.experts.w1": "block_sparse_moe.experts.{e}.w1.weight",
        "moe.experts.w3": "block_sparse_moe.experts.{e}.w3.weight",
        "moe.experts.w2": "block_sparse_moe.experts.{e}.w2.weight",
    },
    "qwen": {
        "moe.experts.w1": "mlp.experts.{e}.gate_proj.weight",
        "moe.experts.w3": "mlp.experts.{e}.up_proj.weight",
        "moe.experts.w2": "mlp.experts.{e}.down_proj.weight",
    },
}
STACKED = ("moe.experts.w1", "moe.experts.w2", "moe.experts.w3")


def is_stacked(name: str) -> bool:
    """A runtime parameter that stacks one checkpoint tensor per expert."""
    return name.endswith(STACKED)


# checkpoint tensors that are not parameters (older Llama exports kept the rotary table)
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_LAYER_NAME = re.compile(r"^layers\.(\d+)\.(.+)$")


def _moe_kind(spec: ModelSpec) -> str:
    return "mixtral" if spec.arch.family == "mixtral" else "qwen"


def checkpoint_names(spec: ModelSpec, name: str) -> list[str]:
    """The checkpoint tensors behind the runtime parameter (or persistent buffer) ``name``: one, or one
    per expert for a stacked expert weight (in expert order), or none for what the checkpoint does not
    hold (the balancing bias of our own router, a tied output projection)."""
    if name in TOP:
        return [] if name == "output.weight" and spec.tied_embeddings else [TOP[name]]
    match = _LAYER_NAME.match(name)
    if match is None:
        raise KeyError(f"{name}: not a parameter the Hugging Face layout names")
    layer, rest = match.groups()
    prefix = f"model.layers.{layer}."
    if rest in LAYER:
        return [prefix + LAYER[rest]]
    kind = _moe_kind(spec)
    if rest in MOE_LAYER[kind]:
        return [prefix + MOE_LAYER[kind][rest]]
    if rest in EXPERTS[kind]:
        return [prefix + EXPERTS[kind][rest].format(e=e) for e in range(spec.moe.num_experts)]
    if rest == "moe.expert_bias":
        return []
    raise KeyError(f"{name}: not a parameter the Hugging Face layout names")
