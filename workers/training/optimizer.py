"""The runtime's optimizer and its gradient clipping: one construction for the trainer and for ``cann-train
calibrate``'s probe (``workers.training.calibrate``), which measures the step's host-side cost on the same
optimizer the trainer runs."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

from workers.training.parallel.expert import is_expert_param


def build_optimizer(
    params: list[torch.nn.Parameter], optimizer: str, lr: float, weight_decay: float, device: torch.device
) -> torch.optim.Optimizer:
    """``optimizer`` (``sgd``, ``adam``, ``adamw``) over ``params``: expert weights in a group of their own
    (sharded on another mesh (edp) than the rest, or plain tensors beside DTensors; a foreach step cannot mix
    either, so each group is homogeneous)."""
    groups = [
        {"params": group, "foreach": not _mixes_dtensors(group)}
        for group in (
            [p for p in params if not is_expert_param(p)],
            [p for p in params if is_expert_param(p)],
        )
        if group
    ]
    if optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    # adam / adamw: torch's AdamW (decoupled weight decay; identical to Adam when it is 0). torch's fused
    # kernel (CPU and CUDA) where every parameter is a plain tensor: one pass over the parameters instead of
    # ~10 foreach ops, which matters where ranks share few CPU cores
    fused = device.type in ("cpu", "cuda") and not any(isinstance(p, DTensor) for p in params)
    if fused:
        groups = [{"params": g["params"]} for g in groups]
    return torch.optim.AdamW(
        groups, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay, **({"fused": True} if fused else {})
    )


def scale_gradients(params: Iterable[torch.nn.Parameter], coef: float) -> None:
    """Multiply every gradient by ``coef`` in place: the clipping of a global norm above ``grad_clip``."""
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)


def _mixes_dtensors(params: list[torch.Tensor]) -> bool:
    kinds = {isinstance(p, DTensor) for p in params}
    return len(kinds) > 1
