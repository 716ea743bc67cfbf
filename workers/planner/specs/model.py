"""``model.json``: a decoder-only transformer (:class:`ModelSpec`) and its mixture-of-experts part
(:class:`MoESpec`), with the parameter count the cost model starts from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .validation import DocumentChecker, fields_as_dict

ACTIVATIONS = ("gelu", "swiglu", "relu", "geglu")
ROTARY_LAYOUTS = ("interleaved", "half")
ROUTERS = ("sigmoid-bias", "softmax")
OWN_FAMILY = "cann-gpt"


@dataclass(frozen=True)
class ArchitectureSpec:
    """What a model family adds to the contract's decoder (``model.json`` ``architecture``; absent: the
    project's own GPT, ``cann-gpt``). :func:`workers.planner.specs.hf.spec_from_hf_config` reads it from a
    Hugging Face ``config.json``; the runtime model builds it and the planner counts it."""

    family: str = OWN_FAMILY
    """The model family: ``cann-gpt`` (ours) or a Hugging Face ``model_type`` (``llama``, ``qwen3``, ...)."""
    head_dim: int | None = None
    """Width of one attention head; null = hidden_size / num_attention_heads (Qwen3 sets its own)."""
    rope_theta: float = 10000.0
    """Rotary base (Su et al. 2021): 10,000 in Llama 2, 500,000 in Llama 3, 1,000,000 in Qwen2.5/3."""
    rope_scaling: dict | None = None
    """Rotary frequency scaling: ``{"rope_type": "linear", "factor"}`` or Llama 3.1's ``{"rope_type":
    "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}``."""
    rotary: str = "interleaved"
    """Which pairs of a head rotate together: ``interleaved`` (2i, 2i+1; ours) or ``half`` (i, i + d/2;
    Hugging Face's ``rotate_half``, which the families' checkpoints are laid out for)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (``rms_norm_eps``)."""
    qkv_bias: bool = False
    """Bias on the query, key and value projections (Qwen2, or ``attention_bias``)."""
    out_bias: bool = False
    """Bias on the attention output projection (``attention_bias`` in Llama, Mistral, Qwen3)."""
    mlp_bias: bool = False
    """Biases on the dense MLP's projections (Llama's ``mlp_bias``)."""
    qk_norm: bool = False
    """RMSNorm of each query and key head before the rotation (Qwen3)."""
    router: str = "sigmoid-bias"
    """MoE gating: ``sigmoid-bias`` (DeepSeek-V3 sigmoid affinities with an auxiliary-loss-free balancing
    bias; ours) or ``softmax`` (Mixtral, Qwen-MoE: softmax over the experts, no bias)."""
    norm_topk_prob: bool = True
    """The chosen experts' gates renormalised to sum to 1 (Mixtral always; Qwen-MoE's ``norm_topk_prob``)."""
    shared_expert_gate: bool = False
    """The shared experts' output scaled by a learnt sigmoid gate (Qwen2-MoE)."""
    hf_config: dict | None = None
    """The source ``config.json``, whole: an export writes it back with the fields above brought up to
    date (token ids, ``initializer_range`` and whatever else the family keeps, untouched)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchitectureSpec:
        c = DocumentChecker(d, "architecture")
        hf_config = c.get("hf_config")
        if hf_config is not None and not isinstance(hf_config, dict):
            c.fail("hf_config", f"must be a JSON object (a config.json), got {type(hf_config).__name__}")
        scaling = c.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            c.fail("rope_scaling", f"must be a JSON object or null, got {scaling!r}")
        spec = dict(
            family=c.text("family", default=OWN_FAMILY),
            head_dim=c.integer("head_dim", default=None),
            rope_theta=c.number("rope_theta", default=10000.0),
            rope_scaling=scaling,
            rotary=c.choice("rotary", ROTARY_LAYOUTS, default="interleaved"),
            norm_eps=c.number("norm_eps", default=1e-5),
            qkv_bias=c.boolean("qkv_bias", default=False),
            out_bias=c.boolean("out_bias", default=False),
            mlp_bias=c.boolean("mlp_bias", default=False),
            qk_norm=c.boolean("qk_norm", default=False),
            router=c.choice("router", ROUTERS, default="sigmoid-bias"),
            norm_topk_prob=c.boolean("norm_topk_prob", default=True),
            shared_expert_gate=c.boolean("shared_expert_gate", default=False),
            hf_config=hf_config if isinstance(hf_config, dict) else None,
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return fields_as_dict(self)


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
    shared_expert_ffn_hidden_size: int | None = None
    """Hidden size of each shared expert's MLP where it is not ``expert_ffn_hidden_size`` (Qwen2-MoE's
    ``shared_expert_intermediate_size``)."""
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
            shared_expert_ffn_hidden_size=c.integer("shared_expert_ffn_hidden_size", default=None),
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
        d = fields_as_dict(self)
        if self.shared_expert_ffn_hidden_size is None:
            d.pop("shared_expert_ffn_hidden_size")
        return d

    @property
    def shared_ffn_hidden_size(self) -> int:
        """Hidden width of all shared experts together (0 without any)."""
        return self.num_shared_experts * (self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size)


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
    architecture: ArchitectureSpec | None = None
    """What the model's family adds (head width, rotary, biases, norms, gating); null: our own GPT."""

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
            architecture=c.nested("architecture", ArchitectureSpec.from_dict, default=None),
        )
        h, a, kv = spec["hidden_size"], spec["num_attention_heads"], spec["num_kv_heads"]
        explicit_head_dim = spec["architecture"] is not None and spec["architecture"].head_dim
        if h and a and h % a and not explicit_head_dim:
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
        if self.architecture is None:
            d.pop("architecture")
        return d

    @property
    def arch(self) -> ArchitectureSpec:
        """The family's additions (ours when the document names none)."""
        return self.architecture or OWN_ARCHITECTURE

    @property
    def head_dim(self) -> int:
        return self.arch.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_width(self) -> int:
        """Width of all query heads together (the hidden size, unless the family sets a head width)."""
        return self.num_attention_heads * self.head_dim

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
        experts), ``embedding``, ``norms`` and ``total``. Our GPT is counted in Megatron-LM's layer layout
        (LayerNorms with biases); a Hugging Face family as its modules are, biases, RMSNorms and gates
        included, which is ``transformers``' ``num_parameters()`` for the same config."""
        h, f, hd = self.hidden_size, self.ffn_hidden_size, self.head_dim
        arch = self.arch
        own = arch.family == OWN_FAMILY
        mats = 3 if self.gated else 2
        kv, q = self.num_kv_heads * hd, self.q_width
        # q, k, v (grouped-query) and the output projection, with the family's biases and q/k norms
        attention = h * (q + 2 * kv) + q * h
        attention += (q + 2 * kv) * arch.qkv_bias + h * arch.out_bias + 2 * hd * arch.qk_norm
        dense_mlp = mats * h * f + ((mats - 1) * f + h) * arch.mlp_bias
        n_moe = self.num_moe_layers
        n_dense = self.num_layers - n_moe
        experts = shared = 0.0
        if self.moe:
            fe = self.moe.expert_ffn_hidden_size
            experts = n_moe * self.moe.num_experts * mats * h * fe
            gate = h if arch.shared_expert_gate else 0
            shared = n_moe * (mats * h * self.moe.shared_ffn_hidden_size + h * self.moe.num_experts + gate)
        embedding = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        # LayerNorm weight + bias twice per layer and once at the end (Megatron), or RMSNorm weights
        norms = self.num_layers * 4 * h + 2 * h if own else self.num_layers * 2 * h + h
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


OWN_ARCHITECTURE = ArchitectureSpec()
