"""A plain GPT-style decoder: RMSNorm, rotary positions, SwiGLU or GELU feed-forward, optional MoE layers.

One module for our GPT and the Hugging Face families (``model.json`` ``architecture``: Llama, Mistral,
Qwen2/3, Mixtral, Qwen-MoE), which differ only in what the architecture names: head width, rotary base,
scaling and layout, biases, q/k norms, norm epsilon, router and a gated shared expert
(:mod:`workers.training.hf` maps their checkpoints onto these names).

The model knows nothing about parallelism (``parallelize.py`` applies it), in the layout torchtitan uses so
that torch's TP plans and pipeline splitting address the same names: ``tok_embeddings``, ``layers`` (a
``ModuleDict`` keyed by layer id so a pipeline stage can delete the others), ``norm``, ``output``. A
pipeline stage sets the parts it does not own to ``None`` and ``forward`` skips them.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from workers.planner.specs import OWN_ARCHITECTURE, OWN_FAMILY, ArchitectureSpec
from workers.training.config import ModelConfig, MoEConfig


def rotary_frequencies(head_dim: int, theta: float = 10000.0, scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim/2]`` (Su et al. 2021, RoFormer eq. 34), scaled as ``scaling`` says:
    ``linear`` (positions divided by ``factor``: Chen et al. 2023, position interpolation) or Llama 3.1's
    ``llama3`` (low frequencies divided by ``factor``, high ones kept, a smooth ramp between; the formula of
    Meta's reference ``apply_scaling`` in llama-models, which ``transformers`` implements too: written here,
    not imported, so that a rank does not load ``transformers`` to start)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
        old_context = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
        return torch.where(medium, smoothed, scaled)
    if kind != "default":
        raise ValueError(f"rope_type {kind!r} is not supported")
    return inv_freq


def rotary_tables(
    head_dim: int, seq_length: int, theta: float = 10000.0, scaling: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[seq, head_dim/2]``."""
    angles = torch.outer(
        torch.arange(seq_length, dtype=torch.float32), rotary_frequencies(head_dim, theta, scaling)
    )
    return angles.cos(), angles.sin()


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved"
) -> torch.Tensor:
    """Rotate pairs of ``x [b, s, h, d]`` by position-dependent angles: ``(x[2i], x[2i+1])`` (``interleaved``)
    or ``(x[i], x[i + d/2])`` (``half``: the Hugging Face checkpoints' ``rotate_half`` layout)."""
    cos, sin = cos[: x.shape[1]].view(1, x.shape[1], 1, -1), sin[: x.shape[1]].view(1, x.shape[1], 1, -1)
    if layout == "half":
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)
    x_even, x_odd = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal multi-head attention with grouped key/value heads. Head counts are inferred from the
    projection widths at run time, so a tensor-parallel shard runs its local heads unchanged."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        arch = cfg.arch
        self.head_dim = cfg.head_dim
        self.rotary = arch.rotary
        self.kv_repeat = cfg.num_attention_heads // cfg.num_kv_heads
        kv_width = cfg.num_kv_heads * self.head_dim
        self.wq = nn.Linear(cfg.hidden_size, cfg.q_width, bias=arch.qkv_bias)
        self.wk = nn.Linear(cfg.hidden_size, kv_width, bias=arch.qkv_bias)
        self.wv = nn.Linear(cfg.hidden_size, kv_width, bias=arch.qkv_bias)
        self.wo = nn.Linear(cfg.q_width, cfg.hidden_size, bias=arch.out_bias)
        # Qwen3: each head's query and key RMS-normalised before the rotation
        self.q_norm = nn.RMSNorm(self.head_dim, eps=arch.norm_eps) if arch.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=arch.norm_eps) if arch.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin, self.rotary), apply_rotary(k, cos, sin, self.rotary)
        if self.kv_repeat > 1:
            k = k.repeat_interleave(self.kv_repeat, dim=2)
            v = v.repeat_interleave(self.kv_repeat, dim=2)
        out = self.core_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))

    @staticmethod
    def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# model.json ``activation`` -> (the nonlinearity, gated). Gated variants (Shazeer 2020, "GLU Variants Improve
# Transformer"): ``w2(act(w1 x) * w3 x)``; plain ones: ``w2(act(w1 x))``.
ACTIVATIONS = {
    "swiglu": (F.silu, True),
    "geglu": (F.gelu, True),
    "gelu": (F.gelu, False),
    "relu": (F.relu, False),
}


class FeedForward(nn.Module):
    """The MLP: SwiGLU/GeGLU ``w2(act(w1 x) * w3 x)`` or GELU/ReLU ``w2(act(w1 x))``."""

    def __init__(self, dim: int, hidden: int, activation: str, bias: bool = False):
        super().__init__()
        self.activation = activation
        self.act, gated = ACTIVATIONS[activation]
        self.w1 = nn.Linear(dim, hidden, bias=bias)
        self.w2 = nn.Linear(hidden, dim, bias=bias)
        self.w3 = nn.Linear(dim, hidden, bias=bias) if gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(self.act(self.w1(x)) * self.w3(x))
        return self.w2(self.act(self.w1(x)))


class GroupedExperts(nn.Module):
    """``num_experts`` feed-forwards stored as stacked weights ``[E, ...]`` (torchtitan layout), so expert
    parallelism can keep a slice of dim 0. ``forward`` takes tokens already sorted by expert."""

    def __init__(self, dim: int, hidden: int, num_experts: int, activation: str):
        super().__init__()
        self.activation = activation
        self.act, gated = ACTIVATIONS[activation]
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim)) if gated else None

    @property
    def num_local_experts(self) -> int:
        return self.w1.shape[0]

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        # A loop over experts: torch._grouped_mm is CUDA-only in 2.13, and this runs everywhere.
        outputs = []
        for e, chunk in enumerate(torch.split(x, tokens_per_expert.tolist(), dim=0)):
            h = chunk @ self.w1[e].T
            h = self.act(h) * (chunk @ self.w3[e].T) if self.w3 is not None else self.act(h)
            outputs.append(h @ self.w2[e].T)
        return torch.cat(outputs, dim=0) if outputs else x.new_zeros(0, x.shape[-1])


class MoE(nn.Module):
    """Token-choice top-k MoE. Our router (``sigmoid-bias``) is DeepSeek-V3's auxiliary-loss-free balancing
    (Liu et al. 2024, sec. 2.1.2): sigmoid affinities, a per-expert ``expert_bias`` added only when
    *choosing* experts, gating weights from the unbiased affinities normalised over the chosen k; the
    trainer nudges ``expert_bias`` after each step towards under-loaded experts from the global
    ``tokens_per_expert`` counts. The Hugging Face families' (``softmax``: Mixtral, Qwen-MoE) take the
    softmax over every expert, the top k of it, renormalised where the family says (``norm_topk_prob``),
    and no bias; Qwen2-MoE scales its shared expert by a sigmoid gate (``shared_gate``)."""

    def __init__(self, dim: int, moe: MoEConfig, activation: str, arch: ArchitectureSpec = OWN_ARCHITECTURE):
        super().__init__()
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.softmax_router, self.norm_topk_prob = arch.router == "softmax", arch.norm_topk_prob
        self.router = nn.Linear(dim, moe.num_experts, bias=False)
        self.experts = GroupedExperts(dim, moe.expert_ffn_hidden_size, moe.num_experts, activation)
        self.shared_experts = (
            FeedForward(dim, moe.shared_ffn_hidden_size, activation) if moe.num_shared_experts else None
        )
        self.shared_gate = (
            nn.Linear(dim, 1, bias=False) if arch.shared_expert_gate and moe.num_shared_experts else None
        )
        self.register_buffer("expert_bias", torch.zeros(moe.num_experts), persistent=True)
        # Tokens routed to each expert since the trainer last read it (the figure behind ``expert_load``).
        # Activation recomputation re-runs the forward and counts twice; the trainer reports fractions and
        # the bias update uses only the sign, so neither is affected (torchtitan makes the same trade).
        self.register_buffer("tokens_per_expert", torch.zeros(moe.num_experts), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, dim = x.shape
        x = x.reshape(-1, dim)
        if self.softmax_router:
            weights, chosen = torch.topk(torch.softmax(self.router(x).float(), dim=-1), self.top_k, dim=-1)
            if self.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        else:
            scores = torch.sigmoid(self.router(x).float())
            chosen = torch.topk(scores + self.expert_bias, self.top_k, dim=-1).indices
            weights = scores.gather(-1, chosen)
            weights = weights / weights.sum(dim=-1, keepdim=True)
        counts = torch.bincount(chosen.flatten(), minlength=self.num_experts)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts.to(self.tokens_per_expert.dtype))
        order = torch.argsort(chosen.flatten(), stable=True)
        token_ids = order // self.top_k
        routed = self.experts(x[token_ids], counts)
        routed = routed * weights.flatten()[order].unsqueeze(-1).to(routed.dtype)
        out = torch.zeros_like(x).index_add_(0, token_ids, routed)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out.view(bs, seqlen, dim)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig):
        super().__init__()
        self.layer_id = layer_id
        eps = cfg.arch.norm_eps
        self.attention_norm = nn.RMSNorm(cfg.hidden_size, eps=eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.hidden_size, eps=eps)
        if cfg.is_moe_layer(layer_id):
            self.moe = MoE(cfg.hidden_size, cfg.moe, cfg.activation, cfg.arch)
            self.feed_forward = None
        else:
            self.moe = None
            self.feed_forward = FeedForward(
                cfg.hidden_size, cfg.ffn_hidden_size, cfg.activation, cfg.arch.mlp_bias
            )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        ffn = self.moe if self.moe is not None else self.feed_forward
        return h + ffn(self.ffn_norm(h))


_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "kaiming_uniform_",
                   "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "orthogonal_")  # fmt: skip


@contextlib.contextmanager
def skip_default_init():
    """Modules built inside leave their parameters as allocated: ``torch.nn.init``'s functions do nothing
    (what ``transformers``' ``no_init_weights`` does). For a model whose every parameter is set right after
    (:meth:`Transformer.build`): the default init -- ``nn.Linear``'s kaiming_uniform_ -- was 1.4 s of a
    99.5M-parameter model's start-up, all of it overwritten, and every restart after a fault pays start-up."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    try:
        for name in _INIT_FUNCTIONS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


class Transformer(nn.Module):
    @classmethod
    def build(cls, cfg: ModelConfig, seed: int) -> Transformer:
        """The model with its deterministic init (:meth:`init_weights`), without the default one first."""
        with skip_default_init():
            model = cls(cfg)
        model.init_weights(seed)
        return model

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, cfg) for i in range(cfg.num_layers)})
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.arch.norm_eps)
        self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:  # one matrix: the embedding's rows are the output projection's
            self.output.weight = self.tok_embeddings.weight
        arch = cfg.arch
        cos, sin = rotary_tables(cfg.head_dim, cfg.seq_length, arch.rope_theta, arch.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, seed: int) -> None:
        """Deterministic init from ``seed`` (same on every rank, before any sharding): N(0, 0.02), output
        projections of each block scaled by 1/sqrt(2L) (GPT-2, Radford et al. 2019, sec. 2.3); norms 1,
        biases 0. A Hugging Face family's weights usually come from its checkpoint instead
        (:func:`workers.training.hf.load_hf_weights`)."""
        gen = torch.Generator().manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith(".bias"):
                    param.zero_()
                    continue
                if param.dim() == 1:
                    param.fill_(1.0)  # RMSNorm weights
                    continue
                std = out_std if name.endswith(("wo.weight", "w2.weight", "experts.w2")) else 0.02
                param.copy_(torch.randn(param.shape, generator=gen) * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h).float() if self.output is not None else h

    def moe_layers(self) -> dict[int, MoE]:
        return {
            int(i): block.moe for i, block in self.layers.items() if getattr(block, "moe", None) is not None
        }


def num_params(cfg: ModelConfig, *, active: bool) -> int:
    """Parameter count of ``cfg``; with ``active`` only the experts one token uses (top_k + shared)."""
    if cfg.arch.family != OWN_FAMILY:  # counted as its modules are (the planner's count, transformers')
        counts = cfg.parameter_count()
        idle = counts["experts"] * (1 - cfg.moe.top_k / cfg.moe.num_experts) if active and cfg.moe else 0
        return int(counts["total"] - idle)
    d, h = cfg.hidden_size, cfg.ffn_hidden_size
    kv = cfg.num_kv_heads * (d // cfg.num_attention_heads)
    mats = 3 if cfg.gated else 2
    attn = 2 * d * d + 2 * d * kv
    total = 2 * cfg.vocab_size * d + d
    for i in range(cfg.num_layers):
        total += attn + 2 * d
        if cfg.is_moe_layer(i):
            m = cfg.moe
            experts = (m.top_k if active else m.num_experts) + m.num_shared_experts
            total += d * m.num_experts + experts * mats * d * m.expert_ffn_hidden_size
        else:
            total += mats * d * h
    return total


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6 * active non-embedding params + attention 12 * L * d * s
    (Kaplan et al. 2020 table 1, with the PaLM appendix B attention term; no recompute)."""
    # the embedding lookup costs no FLOPs; a tied matrix is the output projection's, which does
    non_embedding = num_params(cfg, active=True) - cfg.vocab_size * cfg.hidden_size * (
        not cfg.tied_embeddings
    )
    return 6 * non_embedding + 12 * cfg.num_layers * cfg.q_width * cfg.seq_length
