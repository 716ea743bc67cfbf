"""The names of the gradient-communication methods, in one torch-free module.

The web process validates job configs and comparison requests without importing torch, so the names live
here; ``workers.training.comm.HOOKS`` and ``workers.training.comm.compare.method_hook`` implement exactly
these (a test keeps them equal).
"""

from __future__ import annotations

# DDP communication hooks a job may name in ``comm_hook`` (the keys of ``workers.training.comm.HOOKS``)
HOOK_NAMES = ("allreduce", "fp16", "bf16", "powerSGD", "topk_ef", "sign_ef", "hierarchical", "adaptive")
# the hooks with an FSDP2 (zero_stage 1-3) reduce-scatter form (``workers.training.comm.fsdp_comm``); powerSGD
# has none: it all-reduces low-rank factors of whole gradient matrices, a reduce-scatter sees flat shards
FSDP_HOOK_NAMES = ("allreduce", "fp16", "bf16", "topk_ef", "sign_ef", "hierarchical")
# the hooks refused under zero_stage 1-3, and why (a job config's error, a comparison's note)
FSDP_REFUSED = {
    "powerSGD": (
        "powerSGD all-reduces a low-rank factor pair per gradient matrix; FSDP2's custom reduce-scatter "
        "(set_custom_reduce_scatter) gets one flat buffer of every parameter's dim-0 shards, without the "
        "matrices' shapes, and must return this rank's exact shard: use zero_stage 0 (DDP) for powerSGD"
    ),
    "adaptive": (
        "adaptive chooses a level per DDP bucket from its own timings of DDP's bucketed all-reduce; it has no "
        "reduce-scatter form yet: under zero_stage 1-3 name a fixed method (allreduce, fp16, bf16, topk_ef, "
        "sign_ef, hierarchical), or use zero_stage 0 for adaptive"
    ),
}

# methods ``cann-train comm-opt`` and a job page's comparison train side by side
COMPARE_METHODS = (
    "dense",
    "fp16",
    "bf16",
    "powersgd",
    "topk_ef",
    "sign_ef",
    "hierarchical",
    "hierarchical_topk",
    "adaptive",
)
# the CLI's default: every method except bf16 (on CPUs it measures the same as fp16)
COMPARE_DEFAULT_METHODS = tuple(m for m in COMPARE_METHODS if m != "bf16")
# a job page's default: one method of each family, so a comparison in the browser ends in minutes
WEB_DEFAULT_METHODS = ("dense", "fp16", "topk_ef", "sign_ef", "hierarchical")
