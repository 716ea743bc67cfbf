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
DEFAULTED_FLAGS = ("flash_attention", "overlap_grad_reduce")
"""The training flags a document may leave to its framework (null or absent)."""
FRAMEWORK_DEFAULTS: dict[str, dict[str, tuple[bool, str]]] = {
    "cann-train": {
        "flash_attention": (
            True,
            "cann-train's attention is torch's scaled_dot_product_attention (workers/training/model.py), fused "
            "(FlashAttention / memory-efficient kernels) and never storing the s x s scores",
        ),
        "overlap_grad_reduce": (
            True,
            "cann-train's DDP all-reduces gradient buckets while the backward runs (Li et al. VLDB 2020, "
            "PyTorch Distributed §3.2.3) and FSDP2 reduce-scatters each block as its backward ends",
        ),
    },
    "fsdp": {
        "flash_attention": (
            True,
            "torchtitan's attention is F.scaled_dot_product_attention; llm-foundry's MPT uses attn_impl "
            "'flash'/'triton' (FlashAttention)",
        ),
        "overlap_grad_reduce": (
            True,
            "FSDP reduce-scatters each unit's gradients during the backward (Zhao et al. VLDB 2023, PyTorch "
            "FSDP §3.3-3.4: backward prefetch and overlap)",
        ),
    },
    "megatron-lm": {
        "flash_attention": (
            True,
            "Megatron-LM defaults to --transformer-impl transformer_engine and --attention-backend auto "
            "(megatron/training/arguments.py): Transformer Engine's flash / fused attention",
        ),
        "overlap_grad_reduce": (
            False,
            "Megatron-Core DistributedDataParallelConfig.overlap_grad_reduce = False "
            "(megatron/core/distributed/distributed_data_parallel_config.py; on with --overlap-grad-reduce)",
        ),
    },
    "deepspeed": {
        "flash_attention": (
            False,
            "DeepSpeed leaves attention to the model; Megatron-DeepSpeed's --use-flash-attn is opt-in",
        ),
        "overlap_grad_reduce": (
            False,
            "DeepSpeed zero_optimization.overlap_comm defaults to stage == 3 (deepspeed/runtime/zero/config.py "
            "overlap_comm_valid): off for ZeRO 0-2; ZeRO-3 prefetches in this model whatever the flag",
        ),
    },
}
"""What each framework does when a document leaves a flag unset (null or absent), with where it says so:
a plan with nothing set is costed as that framework runs today."""
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
    flash_attention: bool | None = None
    """Fused attention that never materialises the s x s scores (FlashAttention). null (absent): the
    framework's default (:data:`FRAMEWORK_DEFAULTS`: on for all but ``deepspeed``); false follows the
    layout measured in Korthikanti et al. 2022 (scores, softmax and dropout mask stored)."""

    overlap_grad_reduce: bool | None = None
    """Overlap the data-parallel gradient reduction with the backward of the last micro-batch (PyTorch
    DDP/FSDP buckets, Megatron ``--overlap-grad-reduce``). null (absent): the framework's default
    (:data:`FRAMEWORK_DEFAULTS`: on for ``cann-train`` and ``fsdp``, off for ``megatron-lm`` and
    ``deepspeed``); false reduces after the last backward, then all-gathers the parameters after the step."""

    framework: str = "cann-train"
    """Which framework runs the step (:data:`FRAMEWORKS`): it decides how the ZeRO collectives move (see
    ``hardware.FrameworkCollectives``) and the defaults of the two flags above."""

    def setting(self, name: str) -> bool:
        """The value of ``flash_attention`` or ``overlap_grad_reduce`` the step is costed with: the one
        given, else the framework's default (:data:`FRAMEWORK_DEFAULTS`)."""
        given = getattr(self, name)
        if given is not None:
            return bool(given)
        return FRAMEWORK_DEFAULTS.get(self.framework, FRAMEWORK_DEFAULTS["cann-train"])[name][0]

    def assumed_defaults(self) -> dict[str, Any]:
        """The flags this document leaves to its framework, each with the value assumed and why (empty when
        both are given): what a plan's ``predicted.assumed_defaults`` shows."""
        defaults = FRAMEWORK_DEFAULTS.get(self.framework, FRAMEWORK_DEFAULTS["cann-train"])
        out: dict[str, Any] = {
            name: {"value": defaults[name][0], "source": defaults[name][1]}
            for name in DEFAULTED_FLAGS
            if getattr(self, name) is None
        }
        return {"framework": self.framework, **out} if out else {}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainingConfig:
        c = DocumentChecker(d, "training")
        flags = {}
        for name in DEFAULTED_FLAGS:
            value = c.get(name, None)
            if value is not None and not isinstance(value, bool):
                c.fail(name, f"must be true, false or null (the framework's default), got {value!r}")
                value = None
            flags[name] = value
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
        for name in DEFAULTED_FLAGS:
            if d[name] is None:  # left to the framework: stays left to it
                d.pop(name)
        if d["framework"] == "cann-train":
            d.pop("framework")
        return d
