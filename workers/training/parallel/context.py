"""Context parallelism: each rank of a ``cp`` group trains load-balanced chunks of every sequence and
attends to the keys and values of the whole sequence, all-gathered from the group."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workers.training.model import Transformer


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
