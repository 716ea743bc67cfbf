"""A Hugging Face ``config.json`` as ``model.json`` (:class:`ModelSpec` with its :class:`ArchitectureSpec`), and
back: the families users train most, read without ``transformers`` (a planner runs where no torch is).

Families read (``model_type``): Llama (2, 3, 3.1 with its ``llama3`` rope scaling), Mistral, Qwen2 / Qwen2.5
(q/k/v bias), Qwen3 (q/k norm, its own head width), Mixtral, Qwen2-MoE (a gated shared expert) and Qwen3-MoE.
What a config needs that the runtime lacks is a :class:`SpecError` naming the key and what it would take
(sliding-window attention shorter than the sequence, MLA, a rope scaling other than linear / llama3, an
activation other than SiLU), never a model that trains something else. Both the legacy ``rope_theta`` /
``rope_scaling`` keys and ``transformers`` 5's ``rope_parameters`` are read; an export writes the legacy
keys, which both read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .model import ArchitectureSpec, ModelSpec
from .validation import SpecError

DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")
FAMILIES = DENSE_FAMILIES + MOE_FAMILIES
# model_type -> the class transformers builds (config.json "architectures")
CAUSAL_LM_CLASSES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
# families we are asked for and cannot train yet, with what they need
NOT_YET = {
    "deepseek_v2": "multi-head latent attention (MLA) and grouped expert routing",
    "deepseek_v3": "multi-head latent attention (MLA), grouped expert routing and multi-token prediction",
    "gemma": "embedding scaling, (1 + w) RMSNorm and a GeLU-tanh MLP",
    "gemma2": "sliding-window and logit soft-capping attention",
    "gemma3": "sliding-window attention, q/k norm and dual rotary bases",
    "phi3": "fused qkv / gate-up projections and LongRoPE",
    "gpt2": "learnt absolute positions, LayerNorm and a fused qkv projection",
    "llama4": "chunked attention, interleaved no-rope layers and its MoE",
}
ROPE_TYPES = ("default", "linear", "llama3")
DEFAULT_SEQ_LENGTH = 4096  # a model spec's training sequence when none is asked for (capped by the context)


def read_hf_config(source: str | Path | dict) -> dict:
    """A ``config.json`` (its path, the directory holding it, or the parsed document)."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError("config", f"no config.json at {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError("config", f"{path} is not a readable JSON document: {exc}") from None
    if not isinstance(doc, dict):
        raise SpecError("config", f"{path} must hold a JSON object, got {type(doc).__name__}")
    return doc


def spec_from_hf_config(
    source: str | Path | dict, *, seq_length: int | None = None, name: str | None = None
) -> ModelSpec:
    """The planner's and the runtime's model for a Hugging Face config. ``seq_length`` is the training
    sequence (default: the context, ``max_position_embeddings``, capped at 4,096)."""
    cfg = read_hf_config(source)
    family = cfg.get("model_type")
    if family not in FAMILIES:
        need = f" (it needs {NOT_YET[family]})" if family in NOT_YET else ""
        raise SpecError(
            "model_type",
            f"{family!r} is not a family cann-train trains{need}; supported: {', '.join(FAMILIES)}",
        )
    r = _Reader(cfg)
    hidden, heads = r.integer("hidden_size"), r.integer("num_attention_heads")
    context = r.integer("max_position_embeddings", default=None)
    seq = seq_length or min(context or DEFAULT_SEQ_LENGTH, DEFAULT_SEQ_LENGTH)
    if context and seq > context:
        r.fail(
            "max_position_embeddings",
            f"the model's context is {context} tokens, shorter than seq_length {seq}",
        )
    if (act := cfg.get("hidden_act", "silu")) != "silu":
        r.fail("hidden_act", f"{act!r}: only SiLU (a SwiGLU MLP) is trained for these families")
    if float(cfg.get("attention_dropout") or 0.0) != 0.0:
        r.fail("attention_dropout", "the runtime has no attention dropout (fine-tuning sets it to 0.0)")
    _check_window(r, cfg, family, seq)
    theta, scaling = _rope(r, cfg)
    head_dim = cfg.get("head_dim")
    if head_dim is not None and hidden and heads and head_dim == hidden // heads:
        head_dim = None  # the default width: the contract says nothing more
    attention_bias = bool(cfg.get("attention_bias", False))
    arch = ArchitectureSpec(
        family=family,
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        rotary="half",
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=family in ("qwen2", "qwen2_moe") or attention_bias,
        out_bias=family not in ("qwen2", "qwen2_moe") and attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        router="softmax",
        norm_topk_prob=True if family == "mixtral" else bool(cfg.get("norm_topk_prob", False)),
        shared_expert_gate=family == "qwen2_moe",
        hf_config=cfg,
    )
    moe = _moe(r, cfg, family) if family in MOE_FAMILIES else None
    r.done()
    doc = {
        "name": name or _name(cfg, family),
        "num_layers": cfg["num_hidden_layers"],
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": cfg.get("num_key_value_heads") or heads,
        "ffn_hidden_size": cfg["intermediate_size"],
        "vocab_size": cfg["vocab_size"],
        "seq_length": seq,
        "activation": "swiglu",
        "moe": moe,
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "architecture": arch.to_dict(),
    }
    return ModelSpec.from_dict(doc)


def hf_config_from_spec(spec: ModelSpec) -> dict:
    """The ``config.json`` of ``spec`` (a family's): its source document with every field the spec models
    written from the spec, so ``transformers`` builds the same model."""
    arch = spec.arch
    if arch.family not in FAMILIES:
        raise SpecError(
            "architecture.family",
            f"{arch.family!r} has no Hugging Face form; families: {', '.join(FAMILIES)}",
        )
    cfg = {k: v for k, v in (arch.hf_config or {}).items() if k not in ("rope_parameters", "rope_scaling")}
    cfg.update(
        model_type=arch.family,
        architectures=[CAUSAL_LM_CLASSES[arch.family]],
        num_hidden_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.ffn_hidden_size,
        vocab_size=spec.vocab_size,
        max_position_embeddings=max(spec.seq_length, int(cfg.get("max_position_embeddings") or 0)),
        hidden_act="silu",
        rms_norm_eps=arch.norm_eps,
        rope_theta=arch.rope_theta,
        tie_word_embeddings=spec.tied_embeddings,
    )
    if arch.rope_scaling:
        cfg["rope_scaling"] = dict(arch.rope_scaling)
    if arch.family not in ("qwen2", "qwen2_moe"):
        cfg["attention_bias"] = arch.out_bias
    if arch.family in ("llama",):
        cfg["mlp_bias"] = arch.mlp_bias
    m = spec.moe
    if arch.family == "mixtral" and m is not None:
        cfg.update(num_local_experts=m.num_experts, num_experts_per_tok=m.top_k)
        cfg["intermediate_size"] = m.expert_ffn_hidden_size
    elif m is not None:
        cfg.pop("num_local_experts", None)
        cfg.update(
            num_experts=m.num_experts,
            num_experts_per_tok=m.top_k,
            moe_intermediate_size=m.expert_ffn_hidden_size,
            norm_topk_prob=arch.norm_topk_prob,
            decoder_sparse_step=m.layer_frequency,
            mlp_only_layers=list(range(m.first_dense_layers - (m.layer_frequency - 1))),
        )
        if arch.family == "qwen2_moe":
            cfg["shared_expert_intermediate_size"] = m.shared_ffn_hidden_size
    return cfg


class _Reader:
    """Required keys of a config, every problem collected into one :class:`SpecError`."""

    def __init__(self, cfg: dict):
        self.cfg, self.errors = cfg, {}

    def fail(self, key: str, message: str) -> None:
        self.errors.setdefault(key, []).append(message)

    def integer(self, key: str, default: Any = ...) -> int | None:
        value = self.cfg.get(key, None if default is ... else default)
        if value is None:
            if default is ...:
                self.fail(key, "is required in config.json")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fail(key, f"must be a positive integer, got {value!r}")
            return None
        return value

    def done(self) -> None:
        for key in ("num_hidden_layers", "intermediate_size", "vocab_size"):
            self.integer(key)
        if self.errors:
            raise SpecError(self.errors)


def _name(cfg: dict, family: str) -> str:
    path = str(cfg.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1]
    return path or family


def _check_window(r: _Reader, cfg: dict, family: str, seq: int) -> None:
    """Sliding-window attention is not built: a window at least as long as the sequence is full causal
    attention (Mistral 7B v0.1's 4,096 on 4,096 tokens), a shorter one is refused."""
    window = cfg.get("sliding_window")
    used = window is not None and (
        family not in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") or cfg.get("use_sliding_window")
    )
    if used and isinstance(window, int) and window < seq:
        r.fail(
            "sliding_window",
            f"sliding-window attention ({window} tokens) is not supported: train on sequences of at most "
            f"{window} tokens (seq_length), where it is plain causal attention",
        )


def _rope(r: _Reader, cfg: dict) -> tuple[float, dict | None]:
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ROPE_TYPES:
        r.fail("rope_scaling", f"rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
        return theta, None
    if kind == "default":
        return theta, None
    params.pop("type", None)
    params["rope_type"] = kind
    needs = (
        ("factor",)
        if kind == "linear"
        else ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    )
    for key in needs:
        if not isinstance(params.get(key), int | float) or isinstance(params.get(key), bool):
            r.fail(f"rope_scaling.{key}", f"is required for rope_type {kind!r}")
    return theta, {k: params[k] for k in ("rope_type", *needs) if k in params}


def _moe(r: _Reader, cfg: dict, family: str) -> dict | None:
    if family == "mixtral":
        return {
            "num_experts": cfg.get("num_local_experts"),
            "top_k": cfg.get("num_experts_per_tok"),
            "expert_ffn_hidden_size": cfg.get("intermediate_size"),
        }
    step = cfg.get("decoder_sparse_step") or 1
    dense = sorted(cfg.get("mlp_only_layers") or [])
    # transformers: layer i has experts when i is not in mlp_only_layers and (i + 1) % step == 0. The
    # contract's rule is a dense prefix then every layer_frequency-th layer: the same when the dense
    # layers are a prefix and step is 1, or step alone sets them (first dense = step - 1)
    if dense and (dense != list(range(len(dense))) or step != 1):
        r.fail(
            "mlp_only_layers",
            f"{dense} with decoder_sparse_step {step}: only leading dense layers, or a sparse step alone, "
            "map onto model.json's first_dense_layers / layer_frequency",
        )
    moe = {
        # transformers 5 writes Qwen3-MoE's "num_experts" as "num_local_experts" (and reads either)
        "num_experts": cfg.get("num_experts", cfg.get("num_local_experts")),
        "top_k": cfg.get("num_experts_per_tok"),
        "expert_ffn_hidden_size": cfg.get("moe_intermediate_size"),
        "first_dense_layers": len(dense) if dense else step - 1,
        "layer_frequency": step,
    }
    if family == "qwen2_moe" and cfg.get("shared_expert_intermediate_size"):
        moe["num_shared_experts"] = 1
        moe["shared_expert_ffn_hidden_size"] = cfg["shared_expert_intermediate_size"]
    return moe
