"""Hierarchical all-reduce: reduce-scatter inside a node -> all-reduce of the shards across nodes ->
all-gather inside a node (the two-level scheme of Goyal et al. 2017 / NCCL's tree-of-rings; Jia et al.
2018 "Highly scalable deep learning training system ... in four minutes", hierarchical all-reduce).

Each rank ships only 1/L of the bucket (L = ranks per node) over the slow inter-node link, and the L ranks
of a node use the link in parallel, one shard each. The inter-node stage can optionally be compressed
with top-k + error feedback (dense where bandwidth is cheap, top-k where it is not).

The three stages of a bucket run on one worker thread per hook state, bucket after bucket: every rank
then issues its collectives on each group in the same order (gloo matches collectives by issue order,
and completion callbacks on backend threads could interleave two buckets' stages differently on
different ranks). The worker runs concurrently with backward, so the communication still overlaps.
gloo on CPU has reduce_scatter_single / all_gather_single (torch 2.13), so no emulation is needed.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.distributed as dist

import native_ops
from workers.training.comm.collectives import (
    SerialCommWorker,
    all_gather_flat,
    all_gather_rows,
    reduce_scatter_flat,
    row_slice_as,
)
from workers.training.comm.compression import VALUE_DTYPES, linear_density
from workers.training.comm.stats import CommStats, all_gather_wire_bytes, ring_all_reduce_wire_bytes, timed

log = logging.getLogger(__name__)


def node_groups(
    ranks_per_node: int, process_group: dist.ProcessGroup | None = None
) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(intra-node group, inter-node group) of this rank, for node-major rank numbering: node i holds
    ranks ``[i*L, (i+1)*L)`` of ``process_group``. Collective: every rank of the group must call it."""
    ranks = (
        dist.get_process_group_ranks(process_group)
        if process_group is not None
        else list(range(dist.get_world_size()))
    )
    if ranks_per_node < 1 or len(ranks) % ranks_per_node:
        raise ValueError(f"{len(ranks)} ranks do not split into nodes of {ranks_per_node}")
    me = dist.get_rank()
    intra = inter = None
    for node in range(len(ranks) // ranks_per_node):
        members = ranks[node * ranks_per_node : (node + 1) * ranks_per_node]
        group = dist.new_group(members)
        if me in members:
            intra = group
    for local in range(ranks_per_node):
        members = ranks[local::ranks_per_node]
        group = dist.new_group(members)
        if me in members:
            inter = group
    assert intra is not None and inter is not None, "this rank is not in the process group"
    return intra, inter


def mesh_groups(
    mesh, intra_dim: str | int = -1, inter_dim: str | int = 0
) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(intra, inter) groups from a 2-D ``DeviceMesh`` shaped (nodes, ranks_per_node)."""
    if isinstance(intra_dim, int) and mesh.mesh_dim_names and intra_dim < 0:
        intra_dim = mesh.mesh_dim_names[intra_dim]
    if isinstance(inter_dim, int) and mesh.mesh_dim_names:
        inter_dim = mesh.mesh_dim_names[inter_dim]
    return mesh.get_group(intra_dim), mesh.get_group(inter_dim)


class SparseInterNode:
    """Top-k + error feedback for the inter-node stage, with the residual of each bucket's shard."""

    def __init__(
        self, density: float, start_density: float, warmup_steps: int, value_dtype: torch.dtype
    ) -> None:
        self.density, self.start_density, self.warmup_steps = density, start_density, warmup_steps
        self.value_dtype = value_dtype
        self.residuals: dict[int, torch.Tensor] = {}

    def residual(self, bucket_index: int, numel: int) -> torch.Tensor:
        r = self.residuals.get(bucket_index)
        if r is None or r.numel() != numel:
            if r is not None:
                log.info(
                    "hierarchical: bucket %d changed size, its inter-node residual restarts", bucket_index
                )
            r = self.residuals[bucket_index] = torch.zeros(numel)
        return r

    def k(self, step: int, numel: int) -> int:
        d = linear_density(
            step, target=self.density, start=self.start_density, warmup_steps=self.warmup_steps
        )
        return native_ops.k_for_density(numel, d)

    def entry_bytes(self) -> int:
        return 4 + torch.finfo(self.value_dtype).bits // 8


def sparse_all_reduce(
    shard: torch.Tensor, residual: torch.Tensor, k: int, value_dtype: torch.dtype, group: dist.ProcessGroup
) -> None:
    """In place: ``shard`` <- sum over ``group`` of top-k(shard + residual), error feedback kept locally."""
    idx, vals = native_ops.topk_ef_compress(shard, residual, k=k, value_dtype=value_dtype)
    packed = torch.cat([idx.view(torch.uint8), vals.view(torch.uint8)])
    _, gathered = all_gather_rows(packed, group)
    shard.zero_()
    native_ops.topk_decompress_add(
        shard,
        row_slice_as(gathered, 0, 4 * k, torch.int32),
        row_slice_as(gathered, 4 * k, packed.numel(), value_dtype),
    )


def hierarchical_all_reduce(
    tensor: torch.Tensor,
    intra_group: dist.ProcessGroup,
    inter_group: dist.ProcessGroup,
    inter_stage=None,
) -> torch.Tensor:
    """In place sum of a 1-D ``tensor`` over intra x inter ranks, in three stages (synchronous).

    ``inter_stage(shard)`` replaces the dense inter-node all-reduce of this rank's shard if given."""
    n = tensor.numel()
    local = dist.get_world_size(intra_group)
    shard_len = math.ceil(n / local)
    padded = (
        tensor if shard_len * local == n else torch.cat([tensor, tensor.new_zeros(shard_len * local - n)])
    )
    shard = tensor.new_empty(shard_len)
    reduce_scatter_flat(shard, padded, intra_group)
    if inter_stage is None:
        dist.all_reduce(shard, group=inter_group)
    else:
        inter_stage(shard)
    gathered = tensor.new_empty(shard_len * local)
    all_gather_flat(gathered, shard, intra_group)
    tensor.copy_(gathered[:n])
    return tensor


class HierarchicalState:
    """State of the ``hierarchical`` hook. Options: ``ranks_per_node`` (needed unless a 2-D mesh is
    given), ``inter_node`` (``dense``|``topk``), and for ``topk``: ``density`` (0.01), ``start_density``
    (1.0), ``warmup_steps`` (0), ``value_dtype`` (``fp16``)."""

    def __init__(self, process_group, options: dict | None = None, mesh=None) -> None:
        opts = dict(options or {})
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        ranks_per_node = opts.pop("ranks_per_node", None)
        intra_dim, inter_dim = opts.pop("intra_dim", -1), opts.pop("inter_dim", 0)
        mode = str(opts.pop("inter_node", "dense"))
        sparse_opts = {
            "density": float(opts.pop("density", 0.01)),
            "start_density": float(opts.pop("start_density", 1.0)),
            "warmup_steps": int(opts.pop("warmup_steps", 0)),
            "value_dtype": VALUE_DTYPES[str(opts.pop("value_dtype", "fp16"))],
        }
        if opts:
            raise ValueError(f"hierarchical: unknown options {sorted(opts)}")
        if mode not in ("dense", "topk"):
            raise ValueError("hierarchical: inter_node must be 'dense' or 'topk'")
        if mesh is not None:
            self.intra_group, self.inter_group = mesh_groups(mesh, intra_dim, inter_dim)
        elif ranks_per_node is not None:
            self.intra_group, self.inter_group = node_groups(int(ranks_per_node), process_group)
        else:
            raise ValueError("hierarchical: give ranks_per_node or a 2-D device mesh")
        self.sparse = SparseInterNode(**sparse_opts) if mode == "topk" else None
        self.step = 0
        self.stats = CommStats()
        self._worker = SerialCommWorker("hierarchical-allreduce")

    # -- checkpointable training state
    def comm_stats(self) -> dict[str, float]:
        return self.stats.comm_stats()

    def state_dict(self) -> dict:
        residuals = (
            {} if self.sparse is None else {str(i): r.clone() for i, r in self.sparse.residuals.items()}
        )
        return {"step": self.step, "inter_node_residuals": residuals}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        if self.sparse is not None:
            self.sparse.residuals = {int(i): r.clone() for i, r in state["inter_node_residuals"].items()}

    def close(self) -> None:
        """Stop the worker thread (after the last backward; DDP never calls this)."""
        self._worker.close()


def hierarchical_hook(state: HierarchicalState, bucket):
    buf = bucket.buffer()
    n = buf.numel()
    local = dist.get_world_size(state.intra_group)
    nodes = dist.get_world_size(state.inter_group)
    shard_len = math.ceil(n / local)
    dense_shard_bytes = 4 * shard_len
    inter_stage = None
    inter_bytes = dense_shard_bytes
    inter_wire = ring_all_reduce_wire_bytes(dense_shard_bytes, nodes)
    sparse = state.sparse
    if sparse is not None:
        k = sparse.k(state.step, shard_len)
        if k * sparse.entry_bytes() * nodes < 8 * shard_len:  # else dense moves fewer bytes
            residual = sparse.residual(bucket.index(), shard_len)
            inter_bytes = k * sparse.entry_bytes()
            inter_wire = all_gather_wire_bytes(inter_bytes, nodes)

            def inter_stage(shard, residual=residual, k=k):
                sparse_all_reduce(shard, residual, k, sparse.value_dtype, state.inter_group)

    intra_bytes = 4 * shard_len * local
    intra_wire = 2 * (local - 1) * 4 * shard_len  # reduce-scatter + all-gather, ring, per rank

    def launch():
        buf.div_(state.world_size)  # as plain DDP: average = sum of gradients / W
        return state._worker.submit(
            lambda: hierarchical_all_reduce(buf, state.intra_group, state.inter_group, inter_stage)
        )

    fut = timed(
        state.stats,
        bucket,
        launch,
        bytes_sent=intra_bytes + inter_bytes,
        wire_bytes=intra_wire + inter_wire,
        dense_bytes=4 * n,
    )
    state.stats.add("inter_node_bytes", inter_bytes)  # after timed(): the step record is this step's
    state.stats.add("inter_node_wire_bytes", inter_wire)
    if bucket.is_last():
        state.step += 1
    return fut
