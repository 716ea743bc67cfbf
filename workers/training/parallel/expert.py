"""Expert parallelism: a ``GroupedExperts`` sharded over the EP group, tokens dispatched to their experts by
all-to-all, and the reduction of expert gradients that no data-parallel wrapper performs."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workers.training.model import GroupedExperts


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


def reduce_expert_grads(
    expert_params: list[nn.Parameter], edp_group: dist.ProcessGroup | None, replicas: int
) -> None:
    """Expert weights no data-parallel wrapper reduces (DDP, ZeRO-0, or FSDP with a single rank per
    expert set): each rank's expert gradient already sums the
    contributions of its whole EP group (the all-to-all backward brings them), so sum over the ranks
    holding the same experts (``edp_group``) and divide by ``replicas`` = ``dp * cp`` (every rank's loss
    is the mean over its own tokens) to get the mean over the whole batch."""
    grads = [p.grad for p in expert_params if p.grad is not None]
    if not grads:
        return
    if edp_group is not None and dist.get_world_size(edp_group) > 1:
        _all_reduce_flat(grads, edp_group)
    for g in grads:
        g.div_(replicas)


def _all_reduce_flat(tensors: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """SUM-all-reduce several tensors as one flat buffer (one collective instead of many)."""
    flat = torch.cat([t.flatten() for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
