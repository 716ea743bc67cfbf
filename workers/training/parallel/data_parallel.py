"""Data parallelism over the ``dp * cp`` ranks of a stage: classic DDP (``zero_stage`` 0, with an optional
communication hook and a chosen bucket size), FSDP2 ``fully_shard`` (ZeRO 1-3) and, for ZeRO-0 with
tensor parallelism, FSDP2's ``replicate``."""

from __future__ import annotations

import importlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from workers.training.config import JobConfig
from workers.training.model import Transformer, num_params


def apply_fsdp(
    part: Transformer,
    dp_mesh: DeviceMesh,
    zero_stage: int,
    ignored: set[nn.Parameter],
    expert_mesh: DeviceMesh | None = None,
    replicas: int = 1,
) -> None:
    """FSDP2 per block then the root (torchtitan ``apply_fsdp``). ZeRO-1/2 keep parameters gathered
    between forward and backward (``reshard_after_forward=False``); ZeRO-3 reshards after forward.

    With ``expert_mesh`` (the ``edp`` ranks holding the same experts) each layer's experts are sharded over
    it first, as torchtitan does on its ``dp_mod_ep`` mesh; their gradients are summed over it and divided
    by ``replicas`` (= dp*cp: every rank's loss is the mean over its own tokens, and the all-to-all backward
    already summed its EP group). Without it, expert weights stay whole (``ignored``)."""
    reshard = zero_stage >= 3
    if expert_mesh is not None:
        for moe in part.moe_layers().values():
            fully_shard(moe.experts, mesh=expert_mesh, reshard_after_forward=reshard)
            moe.experts.set_gradient_divide_factor(float(replicas))
            moe.experts.set_force_sum_reduction_for_comms(True)  # a custom factor is PREMUL_SUM: not on gloo
            for param in moe.experts.parameters():  # FSDP made new Parameters: mark them again
                param.is_expert_parallel = True
        ignored = set()  # a nested fully_shard module's parameters are its own
    kwargs = {"mesh": dp_mesh, "reshard_after_forward": reshard}
    for block in part.layers.values():
        block_ignored = {p for p in block.parameters() if p in ignored}
        fully_shard(block, ignored_params=block_ignored or None, **kwargs)
    fully_shard(part, ignored_params=ignored or None, **kwargs)


def resolve_bucket_cap_mb(cfg: JobConfig) -> float | None:
    """DDP's ``bucket_cap_mb``: the job's own value when set; else chosen from the job's inter-node link
    (``choose_bucket_cap_mb``: latency floor, raised towards 25 MB while >= 4 buckets remain) when the
    job gives one; else ``None`` (DDP's default)."""
    if cfg.bucket_cap_mb is not None:
        return cfg.bucket_cap_mb
    if cfg.inter_node_GBps is None:
        return None
    from workers.training.comm.bucketing import choose_bucket_cap_mb

    s = cfg.strategy
    grad_MB = 4 * num_params(cfg.model, active=False) / (s.tp * s.pp) / 1e6  # fp32 grads of one part
    return choose_bucket_cap_mb(
        cfg.inter_node_GBps, cfg.inter_node_latency_us, world_size=s.dp * s.cp, grad_MB=grad_MB
    )


def register_ddp_comm_hook(ddp: DistributedDataParallel, spec: str):
    """Register the DDP communication hook ``spec`` (``"topk_ef:density=0.01"``, see
    ``workers.training.comm``) on ``ddp``, over ``ddp.process_group`` -- the data-parallel group, not the
    world -- and return its state (per-step ``comm_stats()``, checkpointable ``state_dict()``).

    ``hierarchical`` needs the node layout: ``ranks_per_node`` in the spec, else torchrun's
    ``LOCAL_WORLD_SIZE`` (the ranks of one node are consecutive in the data-parallel group when tp = pp
    = 1, which is the only layout it accepts here)."""
    try:
        comm = importlib.import_module("workers.training.comm")
    except ModuleNotFoundError as exc:
        raise ValueError(f"comm_hook {spec!r} requested but workers.training.comm is not available") from exc
    name, options = comm.parse_hook_spec(spec)
    if name == "hierarchical":
        group_size = dist.get_world_size(ddp.process_group)
        if group_size != dist.get_world_size():
            raise ValueError(
                "comm_hook hierarchical: the data-parallel group must span the world (tp = pp = 1), "
                f"got dp={group_size} of {dist.get_world_size()} ranks"
            )
        if "ranks_per_node" not in options:
            options["ranks_per_node"] = int(os.environ.get("LOCAL_WORLD_SIZE", group_size))
    return comm.register_comm_hook(ddp, name, options)


def apply_ddp(
    part: nn.Module,
    dp_group: dist.ProcessGroup,
    device: torch.device,
    ignored_names: list[str],
    comm_hook: str | None,
    bucket_cap_mb: float | None = None,
) -> tuple[DistributedDataParallel, object | None]:
    """Classic DDP (bucketed all-reduce overlapped with backward) with an optional comm hook; returns the
    DDP module and the hook's state (``None`` without a hook)."""
    if ignored_names:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(part, ignored_names)
    ddp = DistributedDataParallel(
        part,
        process_group=dp_group,
        device_ids=[device.index] if device.type != "cpu" and device.index is not None else None,
        broadcast_buffers=False,  # buffers (rope tables, expert bias, load counters) are rank-consistent by design
        init_sync=False,  # every rank initialises the same weights from the seed
        bucket_cap_mb=bucket_cap_mb,  # None: DDP's default (25 MB)
    )
    state = register_ddp_comm_hook(ddp, comm_hook) if comm_hook else None
    return ddp, state


def apply_replicate(part: Transformer, dp_mesh: DeviceMesh, ignored: set[nn.Parameter]) -> None:
    """ZeRO-0 when tensor parallel is on: classic DDP cannot hold DTensor parameters (torch's
    ``_pre_dp_module_transform`` bridge re-creates the Parameter objects every forward, so an optimizer
    never sees their gradients), and torchtitan refuses DDP with >1-D parallelism for the same reason.
    torch's FSDP2-based ``replicate`` gives DDP semantics (full replicas, gradient all-reduce) on DTensors."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for block in part.layers.values():
        block_ignored = {p for p in block.parameters() if p in ignored}
        replicate(block, mesh=dp_mesh, ignored_params=block_ignored or None)
    replicate(part, mesh=dp_mesh, ignored_params=ignored or None)
