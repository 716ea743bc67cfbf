"""Turn a strategy into a ``DeviceMesh`` and apply torch's own parallelisms to a plain model.

Order per model part, as in torchtitan's ``parallelize.py``: pipeline split -> tensor/sequence parallel
(DTensor ``parallelize_module``) -> expert parallel (all-to-all dispatch) -> activation checkpointing
(``checkpoint_wrapper``) -> data parallel (DDP for ``zero_stage`` 0, FSDP2 ``fully_shard`` for 1-3).

Rank layout: ``rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank`` (tensor parallel
innermost: the fastest links; then context parallel; pipeline outermost). Parameters are replicated over
the ``dp * cp`` ranks of a stage, so DDP/FSDP reduce gradients over that flattened ``dp_cp`` group.
Expert-parallel groups are ``ep`` consecutive ranks of it; the ``dp * cp / ep`` ranks that hold the same
experts form the expert-data-parallel (``edp``) group.
"""

from __future__ import annotations

import copy
import importlib
import os
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from workers.training.config import JobConfig, ParallelConfig
from workers.training.model import GroupedExperts, Transformer, num_params


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of one run and this rank's coordinates in them (torchtitan's ``ParallelDims``)."""

    dp: int
    tp: int
    pp: int
    ep: int
    world_size: int
    cp: int = 1

    def __post_init__(self):
        if self.dp * self.cp * self.tp * self.pp != self.world_size:
            raise ValueError(
                f"tp*pp*dp*cp = {self.tp}*{self.pp}*{self.dp}*{self.cp} = "
                f"{self.dp * self.cp * self.tp * self.pp} but the world size is {self.world_size}"
            )
        if self.replicas % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp*cp ({self.replicas})")

    @property
    def replicas(self) -> int:
        """Ranks of one stage holding the same (non-expert) parameters: ``dp * cp``."""
        return self.dp * self.cp

    @classmethod
    def from_strategy(cls, s: ParallelConfig, world_size: int) -> ParallelDims:
        return cls(dp=s.dp, tp=s.tp, pp=s.pp, ep=s.ep, world_size=world_size, cp=s.cp)

    def coordinates(self, rank: int) -> dict[str, int]:
        dc = (rank // self.tp) % self.replicas  # index in the flattened dp x cp group
        return {
            "pp": rank // (self.tp * self.replicas),
            "dp": dc // self.cp,
            "cp": dc % self.cp,
            "tp": rank % self.tp,
            "ep": dc % self.ep,
            "edp": dc // self.ep,
        }

    def build_mesh(self, device_type: str) -> tuple[DeviceMesh, DeviceMesh | None]:
        """One mesh ``(pp, dp, tp)``, or ``(pp, dp, cp, tp)`` with its ``dp_cp`` flattening when ``cp > 1``;
        with ``ep > 1`` a second view ``(pp, edp, ep, tp)`` of the same ranks (DeviceMesh cannot split one
        dim in two after the fact without private APIs)."""
        ranks = torch.arange(self.world_size)
        if self.cp == 1:
            mesh = DeviceMesh(
                device_type, ranks.view(self.pp, self.dp, self.tp), mesh_dim_names=("pp", "dp", "tp")
            )
        else:
            mesh = DeviceMesh(
                device_type,
                ranks.view(self.pp, self.dp, self.cp, self.tp),
                mesh_dim_names=("pp", "dp", "cp", "tp"),
            )
            # DeviceMesh._flatten is private, but it is how torchtitan builds its dp_shard_cp mesh, and FSDP2
            # with TP needs the data-parallel and TP meshes to share one root (a second DeviceMesh would not)
            mesh["dp", "cp"]._flatten("dp_cp")
        moe_mesh = None
        if self.ep > 1:
            moe_mesh = DeviceMesh(
                device_type,
                ranks.view(self.pp, self.replicas // self.ep, self.ep, self.tp),
                mesh_dim_names=("pp", "edp", "ep", "tp"),
            )
        return mesh, moe_mesh

    def replica_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The 1-D mesh over which gradients are reduced: ``dp``, or ``dp_cp`` with context parallelism."""
        return mesh["dp"] if self.cp == 1 else mesh["dp_cp"]


# ---------------------------------------------------------------------------------------------- pipeline


def stage_layer_ranges(num_layers: int, num_stages: int) -> list[range]:
    """Layers per stage, as even as possible (earlier stages take the remainder)."""
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def pipeline_split(model: Transformer, pp_rank: int, pp: int, vpp: int) -> list[tuple[int, Transformer]]:
    """This rank's stages ``(stage_index, module)``: stage ``i`` lives on pp rank ``i % pp`` (the "loop"
    placement torch's ``ScheduleInterleaved1F1B`` expects). Each stage is a copy of the model with the
    layers it does not own deleted, the embedding kept only on stage 0, norm and output only on the last
    (torchtitan's ``pipeline_module_split``)."""
    num_stages = pp * vpp
    ranges = stage_layer_ranges(model.config.num_layers, num_stages)
    parts = []
    for stage_index in range(pp_rank, num_stages, pp):
        part = copy.deepcopy(model)
        for layer_id in list(part.layers.keys()):
            if int(layer_id) not in ranges[stage_index]:
                del part.layers[layer_id]
        if stage_index != 0:
            part.tok_embeddings = None
        if stage_index != num_stages - 1:
            part.norm, part.output = None, None
        parts.append((stage_index, part))
    return parts


def pipeline_bubble_fraction(pp: int, vpp: int, num_microbatches: int) -> float:
    """Idle share of an ideal 1F1B schedule: (p-1)/(v*m + p-1) (Narayanan et al. 2021, sec. 2.2)."""
    if pp == 1:
        return 0.0
    return (pp - 1) / (vpp * num_microbatches + pp - 1)


# ----------------------------------------------------------------------------------------- tensor parallel


def apply_tp(part: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style TP with DTensor (torchtitan ``apply_tp``): q/k/v and w1/w3 column-parallel, wo and
    w2 row-parallel; with sequence parallel the norms and the residual stream are sharded on the sequence
    dim and the all-reduces become all-gather + reduce-scatter (Korthikanti et al. 2022, sec. 4.2.2).
    MoE layers keep experts whole on every TP rank (no expert tensor parallel): their input is gathered to
    the full sequence and their output re-sharded."""
    seq = Shard(1) if sequence_parallel else Replicate()
    top_plan = {}
    if part.tok_embeddings is not None:
        top_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if part.norm is not None:
        if sequence_parallel:
            top_plan["norm"] = SequenceParallel()
        top_plan["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top_plan:
        parallelize_module(part, tp_mesh, top_plan)
    for block in part.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
        }
        if sequence_parallel:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
            plan["attention"] = PrepareModuleInput(
                input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
            )
        if block.moe is None:
            plan["feed_forward.w1"] = ColwiseParallel()
            plan["feed_forward.w2"] = RowwiseParallel(output_layouts=seq)
            if block.feed_forward.w3 is not None:
                plan["feed_forward.w3"] = ColwiseParallel()
            if sequence_parallel:
                plan["feed_forward"] = PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
        elif sequence_parallel:
            plan["moe"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_input=True,
                output_layouts=(Replicate(),),
                desired_output_layouts=(Shard(1),),
                use_local_output=True,
            )
        parallelize_module(block, tp_mesh, plan)


# ----------------------------------------------------------------------------------------- expert parallel


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` whose backward is the reverse all-to-all. (torch's functional
    ``all_to_all_single_autograd`` goes through the functional-collective registry; this plain c10d call
    works identically on gloo, nccl and hccl.)"""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits, ctx.group = (output_splits, input_splits), group
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        grad_in = grad.new_empty((sum(input_splits), *grad.shape[1:]))
        dist.all_to_all_single(grad_in, grad.contiguous(), input_splits, output_splits, group=ctx.group)
        return grad_in, None, None, None


class ExpertParallel:
    """Shard a ``GroupedExperts`` over the EP group and dispatch tokens to their experts by all-to-all.

    Each rank keeps experts ``[ep_rank * E/ep, (ep_rank+1) * E/ep)``. A forward pre-hook exchanges the
    per-expert token counts, sends every token to the rank owning its expert and regroups the received
    tokens by local expert; a forward hook undoes the regrouping and sends results back (torchtitan's
    ``ExpertParallel`` input_fn/output_fn, written as plain module hooks so the expert weights stay plain
    local tensors)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.ep = dist.get_world_size(group)
        self.ep_rank = dist.get_rank(group)

    def apply(self, experts: GroupedExperts) -> None:
        num_experts = experts.num_local_experts
        if num_experts % self.ep:
            raise ValueError(f"{num_experts} experts cannot be split over ep={self.ep}")
        local = num_experts // self.ep
        lo = self.ep_rank * local
        for name, param in list(experts.named_parameters(recurse=False)):
            setattr(experts, name, nn.Parameter(param.detach()[lo : lo + local].clone()))
            getattr(experts, name).is_expert_parallel = True
        experts.register_forward_pre_hook(self._dispatch)
        experts.register_forward_hook(self._combine)

    def _dispatch(self, module: GroupedExperts, args):
        x, tokens_per_expert = args  # tokens sorted by global expert id, counts [E]
        local = module.num_local_experts
        counts = tokens_per_expert.to(torch.int64)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)  # [ep sources, local experts]
        received = received.view(self.ep, local)
        input_splits = counts.view(self.ep, local).sum(1).tolist()
        output_splits = received.sum(1).tolist()
        routed = _AllToAll.apply(x, output_splits, input_splits, self.group)
        # Received rows are grouped (source rank, local expert); the experts want (local expert, source).
        expert_of_row = torch.repeat_interleave(
            torch.arange(local, device=x.device).repeat(self.ep), received.flatten().to(x.device)
        )
        regroup = torch.argsort(expert_of_row, stable=True)
        module._ep_state = (input_splits, output_splits, regroup)
        return routed[regroup], received.sum(0)

    def _combine(self, module: GroupedExperts, args, output):
        input_splits, output_splits, regroup = module._ep_state
        del module._ep_state
        ungrouped = torch.empty_like(output).index_copy_(0, regroup, output)
        return _AllToAll.apply(ungrouped, input_splits, output_splits, self.group)


def is_expert_param(param: nn.Parameter) -> bool:
    return getattr(param, "is_expert_parallel", False)


def tp_shard_count(param: DTensor) -> int:
    """Distinct pieces a DTensor is cut into (product of the mesh sizes of its ``Shard`` dims)."""
    n = 1
    for mesh_dim, placement in enumerate(param.placements):
        if not (placement.is_replicate() or placement.is_partial()):  # Shard and FSDP's _StridedShard
            n *= param.device_mesh.size(mesh_dim)
    return n


# -------------------------------------------------------------------------------------- context parallel


def cp_positions(seq_length: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The token positions of ``cp_rank``: chunks ``r`` and ``2*cp-1-r`` of ``2*cp`` equal chunks, so every
    rank gets the same share of causal-attention work (Megatron-LM / Llama 3 load balancing)."""
    chunk = seq_length // (2 * cp)
    first, second = cp_rank * chunk, (2 * cp - 1 - cp_rank) * chunk
    return torch.cat([torch.arange(first, first + chunk), torch.arange(second, second + chunk)])


class _GatherContext(torch.autograd.Function):
    """All-gather ``x`` from the ranks of ``group`` onto a new leading dim; the backward sends each rank the
    gradients of its piece and sums them -- a reduce-scatter, written as ``all_to_all_single`` because gloo
    has no reduce-scatter (nccl and hccl run it the same way)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
        dist.all_gather_single(out, x.contiguous(), group=group)
        return out.view(-1, *x.shape)

    @staticmethod
    def backward(ctx, grad):  # [cp, b, ...]
        flat = grad.contiguous().flatten(0, 1)  # block j goes to rank j
        received = torch.empty_like(flat)
        dist.all_to_all_single(received, flat, group=ctx.group)
        return received.view(grad.shape).sum(0), None


class ContextParallelAttention:
    """The attention core of one rank of a context-parallel group: its queries attend to the keys and values
    of the whole sequence, all-gathered from the group (Llama 3, Dubey et al. 2024, sec. 3.3.2: all-gather
    context parallelism, chosen there over ring attention for its flexibility with GQA and masks; the K/V
    exchange is small next to the attention math at long sequences, and is not overlapped here). The
    causal mask compares true token positions, since ranks hold load-balanced chunks.
    Installed on each ``Attention`` module in place of its ``core_attention``; the model does not change."""

    def __init__(
        self, group: dist.ProcessGroup, positions: list[torch.Tensor], cp_rank: int, device: torch.device
    ):
        self.group = group
        keys = torch.cat(positions)  # the gathered order: rank 0's tokens, then rank 1's, ...
        self.mask = (positions[cp_rank][:, None] >= keys[None, :]).to(device)  # [local queries, all keys]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        def gather(t):  # [b, h, s_local, d] -> [b, h, cp * s_local, d]
            g = _GatherContext.apply(t, self.group)
            return g.permute(1, 2, 0, 3, 4).flatten(2, 3)

        return F.scaled_dot_product_attention(q, gather(k), gather(v), attn_mask=self.mask)


def apply_cp(
    part: Transformer, group: dist.ProcessGroup, seq_length: int, cp: int, cp_rank: int
) -> torch.Tensor:
    """Give every attention layer of ``part`` the context-parallel core and its rotary tables the rows of
    this rank's positions; returns those positions (on the part's device)."""
    positions = [cp_positions(seq_length, cp, r) for r in range(cp)]
    device = part.rope_cos.device
    core = ContextParallelAttention(group, positions, cp_rank, device)
    mine = positions[cp_rank].to(device)
    part.rope_cos, part.rope_sin = part.rope_cos[mine], part.rope_sin[mine]
    for block in part.layers.values():
        block.attention.core_attention = core
    return mine


# -------------------------------------------------------------------------------- activation checkpointing


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


# -------------------------------------------------------------------------------------------- data parallel


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


# ------------------------------------------------------------------------------------------------ assembly


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
    raw_parts: list[Transformer] = field(default_factory=list)
    """The same parts without DDP/checkpoint wrappers (for MoE buffers and state dicts)."""
    comm_states: list = field(default_factory=list)
    """One DDP comm-hook state per DDP-wrapped part (empty without ``comm_hook``): per-step
    ``comm_stats()`` and the error-feedback ``state_dict()`` a checkpoint must keep."""
    bucket_cap_mb: float | None = None
    """DDP bucket size in use (``None``: DDP's default, 25 MB)."""
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
        self.sync_expert_grads()

    def sync_tensor_parallel_grads(self) -> None:
        # Without a data-parallel wrapper, DTensor leaves the gradient of a replicated sequence-parallel
        # norm weight as Partial (a partial sum per TP rank); FSDP2/replicate reduce it themselves.
        for p in self.parameters():
            g = p.grad
            if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
                p.grad = g.redistribute(g.device_mesh, p.placements)

    def sync_expert_grads(self) -> None:
        """Expert weights no data-parallel wrapper reduces (DDP, ZeRO-0, or FSDP with a single rank per
        expert set): each rank's expert gradient already sums the
        contributions of its whole EP group (the all-to-all backward brings them), so sum over the ranks
        holding the same experts (``edp``) and divide by ``dp * cp`` (every rank's loss is the mean over
        its own tokens) to get the mean over the whole batch."""
        grads = [p.grad for p in self.expert_params if p.grad is not None]
        if not grads:
            return
        if self.edp_group is not None and dist.get_world_size(self.edp_group) > 1:
            _all_reduce_flat(grads, self.edp_group)
        for g in grads:
            g.div_(self.dims.replicas)


def _all_reduce_flat(tensors: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """SUM-all-reduce several tensors as one flat buffer (one collective instead of many)."""
    flat = torch.cat([t.flatten() for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def parallelize(
    model: Transformer, cfg: JobConfig, device: torch.device, world_size: int, rank: int
) -> ParallelModel:
    s = cfg.strategy
    dims = ParallelDims.from_strategy(s, world_size)
    coords = dims.coordinates(rank)
    mesh, moe_mesh = dims.build_mesh(device.type)
    ep_group = moe_mesh["ep"].get_group() if moe_mesh is not None else None
    edp_group = moe_mesh["edp"].get_group() if moe_mesh is not None and dims.replicas // dims.ep > 1 else None
    replica_mesh = dims.replica_mesh(mesh)

    if dims.pp > 1:
        stages = pipeline_split(model, coords["pp"], dims.pp, s.vpp)
    else:
        stages = [(0, model)]
    model_parts, raw_parts, expert_params, comm_states = [], [], [], []
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
            if s.zero_stage == 0 and dims.tp == 1:
                ignored = [n for n, p in part.named_parameters() if is_expert_param(p)]
                wrapped, comm_state = apply_ddp(
                    part, replica_mesh.get_group(), device, ignored, cfg.comm_hook, bucket_cap_mb
                )
                if comm_state is not None:
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
        raw_parts=raw_parts,
        comm_states=comm_states,
        bucket_cap_mb=bucket_cap_mb,
        cp_positions=positions,
    )
    if dims.pp > 1:
        num_stages = dims.pp * s.vpp
        pp_group = mesh["pp"].get_group()
        pipeline_stages = [
            PipelineStage(part, stage_index, num_stages, device, group=pp_group)
            for (stage_index, _), part in zip(stages, model_parts, strict=True)
        ]
        if s.vpp > 1:
            pm.schedule = ScheduleInterleaved1F1B(
                pipeline_stages, cfg.num_microbatches, loss_fn=cross_entropy
            )
        else:
            pm.schedule = Schedule1F1B(pipeline_stages[0], cfg.num_microbatches, loss_fn=cross_entropy)
    return pm
