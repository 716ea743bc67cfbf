"""Activation checkpointing per transformer block: ``full`` recompute or Korthikanti et al. 2022's
``selective`` recompute, with torch's ``checkpoint_wrapper``."""

from __future__ import annotations

from functools import partial

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from workers.training.model import Transformer


def _selective_policy(ctx, op, *args, **kwargs):
    # Keep the matmul outputs, recompute everything else -- the attention core (softmax, scores) and the
    # elementwise ops: Korthikanti et al. 2022's "selective activation recomputation" (sec. 5).
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(part: Transformer, mode: str) -> None:
    """``full``: recompute each transformer block; ``selective``: op-level policy above."""
    for layer_id, block in list(part.layers.items()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            wrapped = checkpoint_wrapper(
                block,
                preserve_rng_state=False,
                context_fn=partial(create_selective_checkpoint_contexts, _selective_policy),
            )
        part.layers[layer_id] = wrapped
