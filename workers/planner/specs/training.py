"""``training.json``: what one optimizer step trains (:class:`TrainingConfig`): global batch, dtype,
optimizer and the framework that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .validation import DocumentChecker, fields_as_dict

DTYPES = ("bf16", "fp16", "fp32", "fp8")
OPTIMIZERS = ("adam", "adamw", "sgd")
FRAMEWORKS = ("cann-train", "megatron-lm", "deepspeed", "fsdp")
"""Training frameworks whose collective behaviour the planner models (``hardware_profiles.json``
``frameworks``): ``cann-train`` is this product's runtime (DDP / FSDP2 + DTensor TP, the default),
``megatron-lm`` Megatron-LM / Megatron-Core (also NeMo), ``deepspeed`` DeepSpeed ZeRO (also
Megatron-DeepSpeed), ``fsdp`` PyTorch FSDP / FSDP2 outside this product (Composer, torchtitan, fairseq)."""
# bytes per element of a tensor stored in each dtype
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


@dataclass(frozen=True)
class TrainingConfig:
    """What one optimizer step trains (``training.json``)."""

    global_batch_size: int
    """Sequences per optimizer step."""
    dtype: str = "bf16"
    """Compute and weight dtype (mixed precision keeps fp32 master weights for adam)."""
    optimizer: str = "adam"
    """adam / adamw (two fp32 moments) or sgd (one momentum)."""
    flash_attention: bool = False
    """Fused attention that never materialises the s x s scores (FlashAttention). False follows the
    layout measured in Korthikanti et al. 2022 (scores, softmax and dropout mask stored)."""

    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduction with the backward of the last micro-batch (PyTorch
    DDP/FSDP buckets, Megatron ``--overlap-grad-reduce``). False is the Megatron-LM default: reduce
    after the last backward, then all-gather the parameters after the step."""

    framework: str = "cann-train"
    """Which framework runs the step (:data:`FRAMEWORKS`): it decides how the ZeRO collectives move (see
    ``hardware.FrameworkCollectives``)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainingConfig:
        c = DocumentChecker(d, "training")
        flags = {}
        for name in ("flash_attention", "overlap_grad_reduce"):
            value = c.get(name, False)
            if not isinstance(value, bool):
                c.fail(name, f"must be true or false, got {value!r}")
            flags[name] = bool(value)
        spec = dict(
            global_batch_size=c.integer("global_batch_size"),
            dtype=c.choice("dtype", DTYPES, default="bf16"),
            optimizer=c.choice("optimizer", OPTIMIZERS, default="adam"),
            framework=c.choice("framework", FRAMEWORKS, default="cann-train"),
            **flags,
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        d = fields_as_dict(self)
        for name in ("flash_attention", "overlap_grad_reduce"):
            if not d[name]:
                d.pop(name)
        if d["framework"] == "cann-train":
            d.pop("framework")
        return d
