"""Hierarchical all-reduce: reduce-scatter inside a node -> all-reduce of the shards across nodes ->
all-gather inside a node (the two-level scheme of Goyal et al. 2017 / NCCL's tree-of-rings; Jia et al.
2018 "Highly scalable deep learning training system ... in four minutes", hierarchical all-reduce).

Each rank ships only 1/L of the bucket (L = ranks per node) over the slow inter-node link, and the L ranks
of a node use the link in parallel, one shard each. The inter-node stage can optionally be compressed
with top-k + error feedback (dense where bandwidth is cheap, top-k where it is not).

The three stages are pipelined across buckets: one worker thread and one process group per stage
(intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather on a second intra-node group),
so bucket k+1's reduce-scatter and bucket k-1's all-gather run while bucket k crosses the slow link.
Each worker takes buckets in order, so every rank issues the collectives of each group in the same
order (gloo matches collectives by issue order; completion callbacks on backend threads could
interleave two buckets differently on different ranks). The workers run concurrently with backward.
gloo on CPU has reduce_scatter_single / all_gather_single (torch 2.13), so no emulation is needed.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid

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


def group_of_this_rank(rank_lists: list[list[int]]) -> dist.ProcessGroup:
    """Create one group per rank list (collective: every rank calls it with the same lists, in the same
    order) and return the one holding this rank."""
    me, mine = dist.get_rank(), None
    for members in rank_lists:
        group = dist.new_group(members)
        if me in members:
            mine = group
    assert mine is not None, "this rank is not in the process group"
    return mine


def node_rank_lists(ranks_per_node: int, ranks: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """(ranks of each node, ranks of each inter-node group) for node-major numbering: node i holds
    ``ranks[i*L:(i+1)*L]``; inter-node group j holds the j-th rank of every node."""
    if ranks_per_node < 1 or len(ranks) % ranks_per_node:
        raise ValueError(f"{len(ranks)} ranks do not split into nodes of {ranks_per_node}")
    nodes = [ranks[i : i + ranks_per_node] for i in range(0, len(ranks), ranks_per_node)]
    return nodes, [ranks[j::ranks_per_node] for j in range(ranks_per_node)]


def spans_world(process_group: dist.ProcessGroup | None) -> bool:
    """Whether ``process_group`` (``None``: the default group) holds every rank of the world."""
    return process_group is None or dist.get_world_size(process_group) == dist.get_world_size()


def every_group_rank_lists(process_group: dist.ProcessGroup) -> list[list[int]]:
    """The global ranks of every rank's ``process_group``, each group once, in one order on every rank
    (sorted by its lowest rank). Collective over the world: the data-parallel groups of a tp/pp/cp mesh
    are its sub-groups, and ``new_group`` must see every rank create every group in the same order."""
    lists: list = [None] * dist.get_world_size()
    dist.all_gather_object(lists, dist.get_process_group_ranks(process_group))
    return sorted({tuple(members) for members in lists}, key=lambda members: min(members))


def split_by_node(members: list[int], ranks_per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """(members on each node, members of each inter-node group) of one group given by its global ranks
    (group-rank order). The ranks of one node are consecutive global ranks, ``ranks_per_node`` of them
    (torchrun's ``LOCAL_WORLD_SIZE``): node of rank g = g // ranks_per_node. Inter-node group j holds the
    j-th member of every node. Every node must hold the same number of members."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
    by_node: dict[int, list[int]] = {}
    for g in members:
        by_node.setdefault(g // ranks_per_node, []).append(g)
    nodes = [by_node[n] for n in sorted(by_node)]
    if len({len(n) for n in nodes}) != 1:
        raise ValueError(
            f"group {members} holds {[len(n) for n in nodes]} ranks on its nodes (of {ranks_per_node} "
            "ranks each): a hierarchical reduction needs the same number on every node"
        )
    return nodes, [[node[j] for node in nodes] for j in range(len(nodes[0]))]


def subgroup_node_lists(
    process_group: dist.ProcessGroup, ranks_per_node: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Intra-node and inter-node rank lists of *every* group like ``process_group`` in the world (each
    rank contributes its own), in one order on all ranks, for :func:`group_of_this_rank`. Collective."""
    intra_all, inter_all = [], []
    for members in every_group_rank_lists(process_group):
        nodes, inter = split_by_node(list(members), ranks_per_node)
        intra_all += nodes
        inter_all += inter
    return intra_all, inter_all


def node_groups(
    ranks_per_node: int, process_group: dist.ProcessGroup | None = None
) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(intra-node group, inter-node group) of this rank, for node-major rank numbering: node i holds
    ranks ``[i*L, (i+1)*L)`` of ``process_group``. Collective: every rank of the world must call it."""
    ranks = (
        dist.get_process_group_ranks(process_group)
        if process_group is not None
        else list(range(dist.get_world_size()))
    )
    nodes, inter = node_rank_lists(ranks_per_node, ranks)
    return group_of_this_rank(nodes), group_of_this_rank(inter)


def mesh_groups(
    mesh, intra_dim: str | int = -1, inter_dim: str | int = 0
) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(intra, inter) groups from a 2-D ``DeviceMesh`` shaped (nodes, ranks_per_node)."""
    if isinstance(intra_dim, int) and mesh.mesh_dim_names and intra_dim < 0:
        intra_dim = mesh.mesh_dim_names[intra_dim]
    if isinstance(inter_dim, int) and mesh.mesh_dim_names:
        inter_dim = mesh.mesh_dim_names[inter_dim]
    return mesh.get_group(intra_dim), mesh.get_group(inter_dim)


def mesh_intra_rank_lists(mesh, intra_dim: str | int = -1) -> list[list[int]]:
    """The rank lists of all intra-node groups of a 2-D mesh (to create a second set of them)."""
    if isinstance(intra_dim, str):
        intra_dim = mesh.mesh_dim_names.index(intra_dim)
    ranks = mesh.mesh.movedim(intra_dim, -1)
    return ranks.reshape(-1, ranks.shape[-1]).tolist()


class SharedMemoryIntraNode:
    """The intra-node stages through shared memory (``/dev/shm``), as NCCL/MPI do inside a node.

    Per bucket, each local rank owns one segment of the (padded) bucket size, mapped by every rank of the
    node. Reduce-scatter: write my bucket into my segment, barrier, sum my shard's range over all
    segments. All-gather: write my reduced shard into my segment at my range, barrier, copy every rank's
    range out. The barriers are tiny gloo collectives; the data moves at memory speed instead of through
    loopback TCP (which costs CPU and, with torch's gloo, a full all-reduce for a reduce-scatter).

    Reuse is safe without more barriers: a rank writes a bucket's segment again only in the next step,
    and no rank starts the next step before every bucket of this one has finished its all-gather
    barrier, i.e. before every peer finished reading. Files are unlinked as soon as all peers mapped
    them, so nothing is left behind even if a rank dies."""

    def __init__(self, rs_group: dist.ProcessGroup, ag_group: dist.ProcessGroup, tag: str) -> None:
        self.rs_group, self.ag_group, self.tag = rs_group, ag_group, tag
        self.local = dist.get_world_size(rs_group)
        self.me = dist.get_rank(rs_group)
        self._segments: dict[tuple[int, int], list[torch.Tensor]] = {}

    def _path(self, bucket_index: int, numel: int, local_rank: int) -> str:
        return f"/dev/shm/{self.tag}-b{bucket_index}-n{numel}-r{local_rank}"

    def segments(self, bucket_index: int, numel: int) -> list[torch.Tensor]:
        """Every local rank's segment of this bucket (created and mapped on first use; RS stage only)."""
        key = (bucket_index, numel)
        segs = self._segments.get(key)
        if segs is None:
            own = self._path(bucket_index, numel, self.me)
            mine = torch.from_file(own, shared=True, size=numel, dtype=torch.float32)
            dist.barrier(group=self.rs_group)  # every segment of this bucket exists
            segs = [
                mine
                if j == self.me
                else torch.from_file(
                    self._path(bucket_index, numel, j), shared=True, size=numel, dtype=torch.float32
                )
                for j in range(self.local)
            ]
            dist.barrier(group=self.rs_group)  # every rank mapped every segment
            os.unlink(own)
            self._segments[key] = segs
        return segs

    def reduce_scatter(self, bucket_index: int, tensor: torch.Tensor, shard_len: int) -> torch.Tensor:
        n = tensor.numel()
        segs = self.segments(bucket_index, shard_len * self.local)
        mine = segs[self.me]
        mine[:n].copy_(tensor)
        mine[n:].zero_()
        dist.barrier(group=self.rs_group)
        lo = self.me * shard_len
        shard = segs[0][lo : lo + shard_len].clone()
        for seg in segs[1:]:
            shard.add_(seg[lo : lo + shard_len])
        return shard

    def all_gather(self, bucket_index: int, shard: torch.Tensor, tensor: torch.Tensor) -> None:
        n, shard_len = tensor.numel(), shard.numel()
        segs = self._segments[(bucket_index, shard_len * self.local)]
        lo = self.me * shard_len
        segs[self.me][lo : lo + shard_len].copy_(shard)
        dist.barrier(group=self.ag_group)
        for j, seg in enumerate(segs):
            start, stop = j * shard_len, min(n, (j + 1) * shard_len)
            if start < stop:
                tensor[start:stop].copy_(seg[start:stop])


def _shared_memory_tag(intra_group: dist.ProcessGroup) -> str | None:
    """A name prefix agreed by the ranks of one node, or ``None`` when they are not all on this host (or
    there is no ``/dev/shm``). Collective over ``intra_group``."""
    host = socket.gethostname() if os.path.isdir("/dev/shm") else None
    hosts: list = [None] * dist.get_world_size(intra_group)
    dist.all_gather_object(hosts, host, group=intra_group)
    tag = [f"ct-hier-{os.getpid()}-{uuid.uuid4().hex[:8]}"]
    dist.broadcast_object_list(tag, group_src=0, group=intra_group)
    return tag[0] if host is not None and len(set(hosts)) == 1 else None


class SparseInterNode:
    """Top-k + error feedback for the inter-node stage, with the residual of each bucket's shard."""

    def __init__(
        self, density: float, start_density: float, warmup_steps: int, value_dtype: torch.dtype
    ) -> None:
        self.density, self.start_density, self.warmup_steps = density, start_density, warmup_steps
        self.value_dtype = value_dtype
        self.residuals: dict[int, torch.Tensor] = {}

    def residual(self, bucket_index: int, numel: int, device: torch.device) -> torch.Tensor:
        """The float32 residual of a bucket's shard, on the bucket's device (a residual restored from a
        checkpoint onto another device moves there)."""
        r = self.residuals.get(bucket_index)
        if r is None or r.numel() != numel:
            if r is not None:
                log.info(
                    "hierarchical: bucket %d changed size, its inter-node residual restarts", bucket_index
                )
            r = self.residuals[bucket_index] = torch.zeros(numel, dtype=torch.float32, device=device)
        elif r.device != torch.device(device):
            r = self.residuals[bucket_index] = r.to(device)
        return r

    def k(self, step: int, numel: int) -> int:
        d = linear_density(
            step, target=self.density, start=self.start_density, warmup_steps=self.warmup_steps
        )
        return native_ops.k_for_density(numel, d)

    def entry_bytes(self) -> int:
        return 4 + torch.finfo(self.value_dtype).bits // 8


def sparse_beats_dense(k: int, entry_bytes: int, nodes: int, shard_len: int) -> bool:
    """Whether all-gathering ``k`` (index, value) entries of ``entry_bytes`` across ``nodes`` puts fewer bytes
    on the wire than the ring all-reduce of the fp32 shard (~8 bytes per element)."""
    return k * entry_bytes * nodes < 8 * shard_len


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
    (1.0), ``warmup_steps`` (0), ``value_dtype`` (``fp16``); ``intra_node`` (``shm``: shared memory when
    the node's ranks share a host and buckets are CPU fp32, the default; ``gloo``: collectives)."""

    def __init__(self, process_group, options: dict | None = None, mesh=None) -> None:
        opts = dict(options or {})
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        ranks_per_node = opts.pop("ranks_per_node", None)
        intra_dim, inter_dim = opts.pop("intra_dim", -1), opts.pop("inter_dim", 0)
        mode = str(opts.pop("inter_node", "dense"))
        intra_node = str(opts.pop("intra_node", "shm"))
        if intra_node not in ("shm", "gloo"):
            raise ValueError("hierarchical: intra_node must be 'shm' or 'gloo'")
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
            node_lists = mesh_intra_rank_lists(mesh, intra_dim)
        elif ranks_per_node is not None and not spans_world(process_group):
            # a data-parallel sub-group of a tp/pp/cp mesh: ranks_per_node counts the node's global ranks
            node_lists, inter_lists = subgroup_node_lists(process_group, int(ranks_per_node))
            self.intra_group, self.inter_group = (
                group_of_this_rank(node_lists),
                group_of_this_rank(inter_lists),
            )
        elif ranks_per_node is not None:
            ranks = (
                dist.get_process_group_ranks(process_group)
                if process_group is not None
                else list(range(self.world_size))
            )
            node_lists, inter_lists = node_rank_lists(int(ranks_per_node), ranks)
            self.intra_group, self.inter_group = (
                group_of_this_rank(node_lists),
                group_of_this_rank(inter_lists),
            )
        else:
            raise ValueError("hierarchical: give ranks_per_node or a 2-D device mesh")
        # The all-gather stage gets its own intra-node group so that it can run at the same time as the
        # next bucket's reduce-scatter (one stream of collectives per group, in bucket order).
        self.gather_group = group_of_this_rank(node_lists)
        self.shm = None
        if intra_node == "shm" and dist.get_world_size(self.intra_group) > 1:
            tag = _shared_memory_tag(self.intra_group)
            if tag is None:
                log.warning(
                    "hierarchical: ranks of a node are on different hosts; intra-node stages use gloo"
                )
            else:
                self.shm = SharedMemoryIntraNode(self.intra_group, self.gather_group, tag)
        self.sparse = SparseInterNode(**sparse_opts) if mode == "topk" else None
        self.ranks_per_node_in_group = dist.get_world_size(self.intra_group)
        self.nodes_in_group = dist.get_world_size(self.inter_group)
        self.degenerate = self.ranks_per_node_in_group == 1
        if self.degenerate and dist.get_rank() == 0:
            log.warning(
                "hierarchical: the data-parallel group has one rank per node (%d nodes): no intra-node "
                "stage, this is a plain inter-node all-reduce of the whole bucket",
                self.nodes_in_group,
            )
        self.step = 0
        self.stats = CommStats()
        self._stages = [SerialCommWorker(f"hierarchical-{name}") for name in ("rs", "inter", "ag")]

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
        """Stop the stage threads (after the last backward; DDP never calls this)."""
        for worker in self._stages:
            worker.close()

    def submit_pipelined(
        self, tensor: torch.Tensor, inter_stage=None, bucket_index: int = 0
    ) -> torch.futures.Future:
        """In-place hierarchical sum of a 1-D ``tensor`` through the three stage workers; returns a future
        of ``tensor``. Buckets submitted in order flow through the stages in order."""
        n = tensor.numel()
        local = dist.get_world_size(self.intra_group)
        shard_len = math.ceil(n / local)
        rs, inter, ag = self._stages
        done: torch.futures.Future = torch.futures.Future()

        def fail(exc: BaseException):
            if not done.done():
                done.set_exception(exc)

        def chain(fut: torch.futures.Future, then):
            def step(f):
                try:
                    then(f.value())
                except Exception as exc:
                    fail(exc)

            fut.add_done_callback(step)

        shm = self.shm if tensor.device.type == "cpu" and tensor.dtype == torch.float32 else None

        def reduce_scatter():
            if shm is not None:
                return shm.reduce_scatter(bucket_index, tensor, shard_len)
            padded = (
                tensor
                if shard_len * local == n
                else torch.cat([tensor, tensor.new_zeros(shard_len * local - n)])
            )
            shard = tensor.new_empty(shard_len)
            reduce_scatter_flat(shard, padded, self.intra_group)
            return shard

        def across_nodes(shard):
            if inter_stage is None:
                dist.all_reduce(shard, group=self.inter_group)
            else:
                inter_stage(shard)
            return shard

        def all_gather(shard):
            if shm is not None:
                shm.all_gather(bucket_index, shard, tensor)
            else:
                gathered = tensor.new_empty(shard_len * local)
                all_gather_flat(gathered, shard, self.gather_group)
                tensor.copy_(gathered[:n])
            done.set_result(tensor)

        chain(
            rs.submit(reduce_scatter),
            lambda shard: chain(
                inter.submit(lambda: across_nodes(shard)),
                lambda shard: chain(ag.submit(lambda: all_gather(shard)), lambda _: None),
            ),
        )
        return done


def hierarchical_hook(state: HierarchicalState, bucket):
    buf = bucket.buffer()
    n = buf.numel()
    local = dist.get_world_size(state.intra_group)
    nodes = dist.get_world_size(state.inter_group)
    shard_len = math.ceil(n / local)
    dense_shard_bytes = 4 * shard_len
    inter_stage = None
    inter_bytes = dense_shard_bytes if nodes > 1 else 0  # a group on one node: nothing crosses nodes
    inter_wire = ring_all_reduce_wire_bytes(dense_shard_bytes, nodes)
    sparse = state.sparse
    if sparse is not None:
        k = sparse.k(state.step, shard_len)
        if sparse_beats_dense(k, sparse.entry_bytes(), nodes, shard_len):  # else dense moves fewer bytes
            residual = sparse.residual(bucket.index(), shard_len, buf.device)
            inter_bytes = k * sparse.entry_bytes()
            inter_wire = all_gather_wire_bytes(inter_bytes, nodes)

            def inter_stage(shard, residual=residual, k=k):
                sparse_all_reduce(shard, residual, k, sparse.value_dtype, state.inter_group)

    if local == 1 or (
        state.shm is not None and buf.device.type == "cpu" and buf.dtype == torch.float32
    ):  # as submit_pipelined
        # one rank of the group on this node (nothing to reduce inside it), or shared memory: nothing goes
        # through an intra-node collective
        intra_bytes = intra_wire = 0
    else:
        intra_bytes = 4 * shard_len * local
        intra_wire = 2 * (local - 1) * 4 * shard_len  # reduce-scatter + all-gather, ring, per rank

    def launch():
        buf.div_(state.world_size)  # as plain DDP: average = sum of gradients / W
        return state.submit_pipelined(buf, inter_stage, bucket.index())

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
