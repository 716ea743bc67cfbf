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


def _hook_spec(spec: str, process_group: dist.ProcessGroup) -> tuple[str, dict]:
    """``(name, options)`` of a comm-hook spec, with ``hierarchical``'s and ``adaptive``'s node layout
    filled in: torchrun's ``LOCAL_WORLD_SIZE`` ranks per node (the ranks of one node are consecutive global
    ranks), else one node holding the whole world."""
    from workers.training.comm import parse_hook_spec

    name, options = parse_hook_spec(spec)
    if name in ("hierarchical", "adaptive") and "ranks_per_node" not in options:
        options["ranks_per_node"] = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    return name, options


def register_ddp_comm_hook(ddp: DistributedDataParallel, spec: str):
    """Register the DDP communication hook ``spec`` (``"topk_ef:density=0.01"``, see
    ``workers.training.comm``) on ``ddp``, over ``ddp.process_group`` -- the data-parallel group, not the
    world -- and return its state (per-step ``comm_stats()``, checkpointable ``state_dict()``).

    The data-parallel group may be a sub-group of the mesh (pp, cp, ep > 1): every hook reduces over it;
    ``hierarchical`` derives its intra-/inter-node groups from the group's global ranks and the ranks per
    node (``ranks_per_node`` in the spec, else ``LOCAL_WORLD_SIZE``); with one DP rank per node it is a
    plain inter-node all-reduce (it logs so)."""
    try:
        comm = importlib.import_module("workers.training.comm")
    except ModuleNotFoundError as exc:
        raise ValueError(f"comm_hook {spec!r} requested but workers.training.comm is not available") from exc
    name, options = _hook_spec(spec, ddp.process_group)
    return comm.register_comm_hook(ddp, name, options)


def apply_local_reducer(
    part: nn.Module,
    dp_group: dist.ProcessGroup,
    ignored: set[nn.Parameter],
    comm_hook: str,
    bucket_cap_mb: float | None = None,
):
    """ZeRO-0 under tensor parallelism with a comm hook: torch's ``replicate`` all-reduces with no hook, so
    a :class:`~workers.training.comm.fsdp_comm.LocalGradReducer` runs the DDP hook ``comm_hook`` on the
    parameters' local gradients over ``dp_group`` after backward (``ParallelModel.finish_grads``). Returns
    (reducer, hook state)."""
    from workers.training.comm import build_hook, compression
    from workers.training.comm.fsdp_comm import LocalGradReducer

    name, options = _hook_spec(comm_hook, dp_group)
    state, hook = build_hook(name, dp_group, options)
    for store in (getattr(state, "residuals", None), getattr(state, "momentum_buffers", None)):
        if isinstance(store, compression.ResidualStore):
            store.bind_parameter_names(part)
    params = [p for p in part.parameters() if p.requires_grad and p not in ignored]
    return LocalGradReducer(part, params, state, hook, bucket_cap_mb), state


def attach_fsdp_comm_hook(part: Transformer, dp_group: dist.ProcessGroup, comm_hook: str):
    """ZeRO-1/2/3: FSDP2's gradient reduce-scatter of every ``fully_shard`` module of ``part`` (its blocks
    and the root; not a nested expert module) through the method ``comm_hook`` over ``dp_group``
    (``FSDPModule.set_custom_reduce_scatter``; :mod:`workers.training.comm.fsdp_comm` says what torch allows
    and what is refused). Returns the state (``comm_stats()``, ``state_dict()``)."""
    from workers.training.comm.fsdp_comm import attach_fsdp_comm

    name, options = _hook_spec(comm_hook, dp_group)
    return attach_fsdp_comm([*part.layers.values(), part], name, options, dp_group)


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


def apply_priority_sync(part: nn.Module, dp_group: dist.ProcessGroup, cfg: JobConfig):
    """``comm_order`` priority|magnitude in place of DDP: partitions of the job's bucket size, sent in that
    order, each stage updated in its next forward (``workers.training.comm.priority``); returns the state
    (``comm_stats()``; the trainer binds its optimizer to it)."""
    from workers.training.comm.priority import PriorityGradSync, partition_mb_for

    return PriorityGradSync(
        part,
        dp_group,
        order=cfg.comm_order,
        partition_mb=partition_mb_for(resolve_bucket_cap_mb(cfg)),
        accumulation=cfg.num_microbatches,
    )


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
