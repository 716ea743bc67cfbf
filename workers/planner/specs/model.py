"""``model.json``: a decoder-only transformer (:class:`ModelSpec`) and its mixture-of-experts part
(:class:`MoESpec`), with the parameter count the cost model starts from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .validation import DocumentChecker, fields_as_dict

ACTIVATIONS = ("gelu", "swiglu", "relu", "geglu")


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts part of a model (``model.json`` ``moe``); absent/null for dense models."""

    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts each token is routed to."""
    expert_ffn_hidden_size: int
    """Hidden size of one expert's MLP."""
    num_shared_experts: int = 0
    """Experts every token goes through (DeepSeek-style), each of ``expert_ffn_hidden_size``."""
    first_dense_layers: int = 0
    """Leading layers that use a dense MLP of ``ffn_hidden_size`` instead of experts."""
    layer_frequency: int = 1
    """After the dense prefix, every ``layer_frequency``-th layer is an MoE layer (1 = all)."""
    capacity_factor: float | None = None
    """Expert capacity as a multiple of the balanced share; tokens above it are dropped. null = dropless."""
    load_imbalance: float | None = None
    """Tokens of the busiest expert-parallel rank divided by the mean (>= 1); scales all-to-all and
    expert compute of the critical rank. null = derived per layout from ep, top_k and the tokens of a
    micro-batch (``workers/planner/moe.py``: uniform routing, or the expert load measured by past runs);
    a number given here overrides the derived figure."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoESpec:
        c = DocumentChecker(d, "moe")
        num_experts = c.integer("num_experts")
        top_k = c.integer("top_k")
        spec = dict(
            num_experts=num_experts,
            top_k=top_k,
            expert_ffn_hidden_size=c.integer("expert_ffn_hidden_size"),
            num_shared_experts=c.integer("num_shared_experts", minimum=0, default=0),
            first_dense_layers=c.integer("first_dense_layers", minimum=0, default=0),
            layer_frequency=c.integer("layer_frequency", default=1),
            capacity_factor=c.number("capacity_factor", default=None),
            load_imbalance=c.number("load_imbalance", default=None),
        )
        if num_experts and top_k and top_k > num_experts:
            c.fail("top_k", f"must be <= num_experts ({num_experts}), got {top_k}")
        if spec["load_imbalance"] is not None and spec["load_imbalance"] < 1.0:
            c.fail("load_imbalance", f"must be >= 1 (busiest rank / mean), got {spec['load_imbalance']}")
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return fields_as_dict(self)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (``model.json``)."""

    name: str
    """Free-form model name."""
    num_layers: int
    """Transformer layers."""
    hidden_size: int
    """Model width h."""
    num_attention_heads: int
    """Query heads a; head dim = h / a."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention when < num_attention_heads)."""
    ffn_hidden_size: int
    """Hidden size of the dense MLP."""
    vocab_size: int
    """Vocabulary size V (embedding and logits)."""
    seq_length: int
    """Tokens per sequence s."""
    activation: str = "gelu"
    """MLP activation: gelu / relu (two matrices) or swiglu / geglu (gated, three matrices)."""
    moe: MoESpec | None = None
    """Mixture-of-experts settings; None for a dense model."""
    tied_embeddings: bool = False
    """Input embedding and output projection share weights."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        c = DocumentChecker(d, "model")
        spec = dict(
            name=c.text("name", default="model"),
            num_layers=c.integer("num_layers"),
            hidden_size=c.integer("hidden_size"),
            num_attention_heads=c.integer("num_attention_heads"),
            num_kv_heads=c.integer("num_kv_heads", default=c.get("num_attention_heads")),
            ffn_hidden_size=c.integer("ffn_hidden_size"),
            vocab_size=c.integer("vocab_size"),
            seq_length=c.integer("seq_length"),
            activation=c.choice("activation", ACTIVATIONS, default="gelu"),
            moe=c.nested("moe", MoESpec.from_dict, default=None),
            tied_embeddings=bool(c.get("tied_embeddings", False)),
        )
        h, a, kv = spec["hidden_size"], spec["num_attention_heads"], spec["num_kv_heads"]
        if h and a and h % a:
            c.fail("hidden_size", f"must be divisible by num_attention_heads ({a}), got {h}")
        if a and kv and a % kv:
            c.fail("num_kv_heads", f"must divide num_attention_heads ({a}), got {kv}")
        moe = spec["moe"]
        if moe and spec["num_layers"] and moe.first_dense_layers >= spec["num_layers"]:
            c.fail("moe.first_dense_layers", f"must be < num_layers ({spec['num_layers']})")
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        d = fields_as_dict(self)
        if not self.tied_embeddings:
            d.pop("tied_embeddings")
        return d

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def gated(self) -> bool:
        """A gated MLP (swiglu / geglu): three weight matrices instead of two."""
        return self.activation in ("swiglu", "geglu")

    def is_moe_layer(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` (0-based) has a mixture-of-experts MLP."""
        if self.moe is None or layer_id < self.moe.first_dense_layers:
            return False
        return (layer_id - self.moe.first_dense_layers) % self.moe.layer_frequency == 0

    @property
    def moe_layer_ids(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (``len(moe_layer_ids)`` without the list)."""
        if self.moe is None:
            return 0
        rest = self.num_layers - self.moe.first_dense_layers
        return (rest + self.moe.layer_frequency - 1) // self.moe.layer_frequency

    def parameter_count(self) -> dict[str, float]:
        """Parameters by kind: ``attention``, ``dense_mlp``, ``experts``, ``shared`` (router, shared
        experts), ``embedding``, ``norms`` and ``total`` (Megatron-LM layer layout)."""
        h, f, hd = self.hidden_size, self.ffn_hidden_size, self.head_dim
        mats = 3 if self.gated else 2
        # QKV with GQA + output projection (Megatron-LM ParallelAttention layout)
        attention = h * (h + 2 * self.num_kv_heads * hd) + h * h
        dense_mlp = mats * h * f
        n_moe = self.num_moe_layers
        n_dense = self.num_layers - n_moe
        experts = shared = 0.0
        if self.moe:
            fe = self.moe.expert_ffn_hidden_size
            experts = n_moe * self.moe.num_experts * mats * h * fe
            shared = n_moe * (self.moe.num_shared_experts * mats * h * fe + h * self.moe.num_experts)
        embedding = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        norms = self.num_layers * 4 * h + 2 * h
        total = self.num_layers * attention + n_dense * dense_mlp + experts + shared + embedding + norms
        return {
            "attention": float(self.num_layers * attention),
            "dense_mlp": float(n_dense * dense_mlp),
            "experts": float(experts),
            "shared": float(shared),
            "embedding": float(embedding),
            "norms": float(norms),
            "total": float(total),
        }
