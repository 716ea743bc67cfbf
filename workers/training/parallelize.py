"""Turn a strategy into a ``DeviceMesh`` and apply torch's own parallelisms to a plain model.

Order per model part, as in torchtitan's ``parallelize.py``: pipeline split -> tensor/sequence parallel
(DTensor ``parallelize_module``) -> context parallel (all-gathered K/V) -> expert parallel (all-to-all
dispatch) -> activation checkpointing (``checkpoint_wrapper``) -> data parallel (DDP for ``zero_stage`` 0,
FSDP2 ``fully_shard`` for 1-3). Each step lives in its own module of :mod:`workers.training.parallel`
(the rank layout and mesh in :mod:`~workers.training.parallel.dims`); this module composes them and
re-exports their public names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from workers.training.config import JobConfig
from workers.training.model import Transformer
from workers.training.parallel.activation_checkpoint import apply_ac
from workers.training.parallel.context import ContextParallelAttention, apply_cp, cp_positions
from workers.training.parallel.data_parallel import (
    apply_ddp,
    apply_fsdp,
    apply_local_reducer,
    apply_priority_sync,
    apply_replicate,
    attach_fsdp_comm_hook,
    register_ddp_comm_hook,
    resolve_bucket_cap_mb,
)
from workers.training.parallel.dims import ParallelDims
from workers.training.parallel.expert import ExpertParallel, is_expert_param, reduce_expert_grads
from workers.training.parallel.pipeline import (
    build_pipeline_schedule,
    pipeline_bubble_fraction,
    pipeline_split,
    stage_layer_ranges,
)
from workers.training.parallel.tensor import apply_tp, reduce_partial_grads, tp_shard_count

__all__ = [
    "ContextParallelAttention",
    "ExpertParallel",
    "ParallelDims",
    "ParallelModel",
    "apply_ac",
    "apply_cp",
    "apply_ddp",
    "apply_fsdp",
    "apply_replicate",
    "apply_tp",
    "build_pipeline_schedule",
    "cp_positions",
    "cross_entropy",
    "is_expert_param",
    "parallelize",
    "pipeline_bubble_fraction",
    "pipeline_split",
    "reduce_expert_grads",
    "reduce_partial_grads",
    "register_ddp_comm_hook",
    "resolve_bucket_cap_mb",
    "stage_layer_ranges",
    "tp_shard_count",
]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


@dataclass
class ParallelModel:
    """The parallelized model parts on this rank and how to run them."""

    dims: ParallelDims
    coords: dict[str, int]
    mesh: DeviceMesh
    parts: list[nn.Module]
    """The model parts this rank trains (one, or ``vpp`` pipeline stages), after wrapping."""
    stage_indices: list[int]
    schedule: object | None = None
    expert_params: list[nn.Parameter] = field(default_factory=list)
    edp_group: dist.ProcessGroup | None = None
    ep_group: dist.ProcessGroup | None = None
    """The ranks that split the experts among them (``ep > 1``; an export gathers them over it)."""
    raw_parts: list[Transformer] = field(default_factory=list)
    """The same parts without DDP/checkpoint wrappers (for MoE buffers and state dicts)."""
    comm_states: list = field(default_factory=list)
    """One DDP comm-hook state per DDP-wrapped part (empty without ``comm_hook``): per-step
    ``comm_stats()`` and the error-feedback ``state_dict()`` a checkpoint must keep."""
    bucket_cap_mb: float | None = None
    """DDP bucket size in use (``None``: DDP's default, 25 MB)."""
    grad_reducers: list = field(default_factory=list)
    """Tensor-parallel ZeRO-0 parts under a comm hook: their data-parallel reduction, run by
    :meth:`finish_grads` (``workers.training.comm.fsdp_comm.LocalGradReducer``)."""
    cp_positions: torch.Tensor | None = None
    """With context parallelism: the sequence positions this rank trains on (on its device)."""

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_indices

    @property
    def has_last_stage(self) -> bool:
        return (self.dims.pp * self.vpp - 1) in self.stage_indices

    @property
    def vpp(self) -> int:
        return max(1, len(self.stage_indices))

    def parameters(self):
        for part in self.parts:
            yield from part.parameters()

    def moe_layers(self):
        for part in self.raw_parts:
            yield from part.moe_layers().items()

    def shard_sequence(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of each sequence ``[b, s] -> [b, s / cp]`` (all of them without CP)."""
        if self.cp_positions is None:
            return tokens
        return tokens[:, self.cp_positions]

    def finish_grads(self) -> None:
        """Complete gradients that no data-parallel wrapper reduces: partial sequence-parallel ones and the
        expert-parallel weights."""
        self.sync_tensor_parallel_grads()
        for reducer in self.grad_reducers:
            reducer.reduce()
        self.sync_expert_grads()

    def sync_tensor_parallel_grads(self) -> None:
        """Sequence-parallel gradients DTensor left ``Partial`` (see :func:`.tensor.reduce_partial_grads`)."""
        reduce_partial_grads(self.parameters())

    def grad_sq_local(self, device: torch.device) -> torch.Tensor:
        """This rank's share of the squared global gradient norm: each gradient piece divided by the number
        of ranks holding an identical copy, so that one SUM all-reduce over the world gives the total."""
        dp, tp = self.dims.replicas, self.dims.tp  # dp * cp ranks hold the same parameters
        total = torch.zeros((), dtype=torch.float64, device=device)
        for p in self.parameters():
            if p.grad is None:
                continue
            g = p.grad
            # ranks holding this exact piece: experts are whole on the dp*cp/ep ranks of an EP slot (x tp),
            # everything else on all dp*cp (x tp); FSDP/TP shards divide that by their piece count
            copies = ((dp // self.dims.ep) if is_expert_param(p) else dp) * tp
            if isinstance(g, DTensor):
                copies //= tp_shard_count(g)
                g = g.to_local()
            # the norm in float64 without materialising a float64 copy of the gradient
            total += torch.linalg.vector_norm(g.detach(), dtype=torch.float64).square() / copies
        return total

    def collect_expert_load(
        self, moe_layer_ids: list[int], num_experts: int, device: torch.device
    ) -> torch.Tensor:
        """Tokens routed to each expert of each MoE layer since the last call (the counters reset)."""
        loads = torch.zeros(len(moe_layer_ids), max(num_experts, 1), device=device)
        for layer_id, moe in self.moe_layers():
            if self.coords["tp"] == 0:  # TP ranks route the same tokens: count once
                loads[moe_layer_ids.index(layer_id)] = moe.tokens_per_expert
            moe.tokens_per_expert.zero_()
        return loads

    def update_expert_bias(self, global_loads: torch.Tensor, moe_layer_ids: list[int], rate: float) -> None:
        """DeepSeek-V3 auxiliary-loss-free balancing: b_i += gamma * sign(mean load - load_i). Not for a
        softmax router (Mixtral, Qwen-MoE): it has no bias, and its checkpoint's users route without one."""
        with torch.no_grad():
            for layer_id, moe in self.moe_layers():
                if moe.softmax_router:
                    continue
                load = global_loads[moe_layer_ids.index(layer_id)]
                moe.expert_bias.add_(rate * torch.sign(load.mean() - load))

    def sync_expert_grads(self) -> None:
        """Expert gradients no data-parallel wrapper reduces: summed over ``edp``, divided by ``dp * cp``
        (see :func:`.expert.reduce_expert_grads`)."""
        reduce_expert_grads(self.expert_params, self.edp_group, self.dims.replicas)


def parallelize(
    model: Transformer,
    cfg: JobConfig,
    device: torch.device,
    world_size: int,
    rank: int,
    *,
    timed_allreduce: bool = False,
    load_weights=None,
) -> ParallelModel:
    """Apply ``cfg.strategy`` to ``model`` on this ``rank``: the mesh, then per pipeline stage of this rank
    TP -> CP -> EP -> activation checkpointing -> data parallel, then the pipeline schedule.
    ``timed_allreduce``: a DDP part without ``cfg.comm_hook`` gets torch's plain all-reduce hook with our
    timing (its exposed communication time is the rank's collective wait: ``workers.training.supervision.step_times``).
    ``load_weights(part)``: fills each of this rank's stages, whole, before anything shards it (a Hugging
    Face checkpoint: a pipeline stage reads only its own layers)."""
    s = cfg.strategy
    dims = ParallelDims.from_strategy(s, world_size)
    coords = dims.coordinates(rank)
    mesh, moe_mesh = dims.build_mesh(device.type)
    dims.check_mesh(rank, mesh, moe_mesh)  # groups, stages, shards and data follow strategy.order
    ep_group = moe_mesh["ep"].get_group() if moe_mesh is not None else None
    edp_group = moe_mesh["edp"].get_group() if moe_mesh is not None and dims.replicas // dims.ep > 1 else None
    replica_mesh = dims.replica_mesh(mesh)

    if dims.pp > 1:
        stages = pipeline_split(model, coords["pp"], dims.pp, s.vpp, s.layers_per_stage)
    else:
        stages = [(0, model)]
    if load_weights is not None:
        for _stage_index, part in stages:
            load_weights(part)
    model_parts, raw_parts, expert_params, comm_states, grad_reducers = [], [], [], [], []
    positions = None  # this rank's token positions with context parallelism (the same for every stage)
    bucket_cap_mb = resolve_bucket_cap_mb(cfg)
    for _stage_index, part in stages:
        part.to(device)
        if dims.tp > 1:
            apply_tp(part, mesh["tp"], s.sequence_parallel)
        if dims.cp > 1:
            positions = apply_cp(part, mesh["cp"].get_group(), cfg.model.seq_length, dims.cp, coords["cp"])
        if dims.ep > 1:
            ep = ExpertParallel(ep_group)
            for moe in part.moe_layers().values():
                ep.apply(moe.experts)
        raw_parts.append(part)
        part_expert_params = [p for p in part.parameters() if is_expert_param(p)]
        expert_params += part_expert_params
        if s.recompute != "none":
            apply_ac(part, s.recompute)
        wrapped: nn.Module = part
        if dims.replicas > 1 or s.zero_stage > 0:
            if s.zero_stage == 0 and dims.tp == 1 and cfg.comm_order != "reverse":
                comm_states.append(apply_priority_sync(part, replica_mesh.get_group(), cfg))
            elif s.zero_stage == 0 and dims.tp == 1:
                ignored = [n for n, p in part.named_parameters() if is_expert_param(p)]
                hook = cfg.comm_hook or ("allreduce" if timed_allreduce else None)
                wrapped, comm_state = apply_ddp(
                    part, replica_mesh.get_group(), device, ignored, hook, bucket_cap_mb
                )
                if comm_state is not None:
                    comm_states.append(comm_state)
            elif s.zero_stage == 0 and cfg.comm_hook:
                reducer, comm_state = apply_local_reducer(
                    part, replica_mesh.get_group(), set(part_expert_params), cfg.comm_hook, bucket_cap_mb
                )
                grad_reducers.append(reducer)
                comm_states.append(comm_state)
            elif s.zero_stage == 0:
                apply_replicate(part, replica_mesh, set(part_expert_params))
            else:
                shard_experts = edp_group is not None  # experts held by more than one rank
                apply_fsdp(
                    part,
                    replica_mesh,
                    s.zero_stage,
                    set(part_expert_params),
                    expert_mesh=moe_mesh["edp"] if shard_experts else None,
                    replicas=dims.replicas,
                )
                if cfg.comm_hook:
                    comm_states.append(attach_fsdp_comm_hook(part, replica_mesh.get_group(), cfg.comm_hook))
                if shard_experts:  # FSDP reduces these now, not sync_expert_grads
                    handed_over = set(part_expert_params)
                    expert_params = [p for p in expert_params if p not in handed_over]
        model_parts.append(wrapped)

    pm = ParallelModel(
        dims=dims,
        coords=coords,
        mesh=mesh,
        parts=model_parts,
        stage_indices=[i for i, _ in stages],
        expert_params=expert_params,
        edp_group=edp_group,
        ep_group=ep_group,
        raw_parts=raw_parts,
        comm_states=comm_states,
        bucket_cap_mb=bucket_cap_mb,
        grad_reducers=grad_reducers,
        cp_positions=positions,
    )
    if dims.pp > 1:
        pm.schedule = build_pipeline_schedule(
            list(zip(pm.stage_indices, model_parts, strict=True)),
            dims.pp * s.vpp,
            device,
            mesh["pp"].get_group(),
            cfg.num_microbatches,
            loss_fn=cross_entropy,
        )
    return pm
