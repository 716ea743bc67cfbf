"""Gradient communication where DDP's comm hooks cannot go: FSDP2 (ZeRO-1/2/3) and tensor-parallel ZeRO-0.

What torch 2.13 lets one change in FSDP2's gradient reduction (``torch/distributed/fsdp/_fully_shard``):

- ``FSDPModule.set_custom_reduce_scatter(comm)`` (``_fsdp_api.ReduceScatter``: ``allocate`` and
  ``__call__(output, input, group, op)``): the whole reduce-scatter of one FSDP parameter group (one
  ``fully_shard`` module: a block, or the root) is ours. ``input`` is the group's gradients flattened
  shard-major (chunk r = every parameter's dim-0 rows that rank r keeps, padded), ``output`` is this
  rank's chunk. Any method that produces each rank's exact chunk of the (approximate) sum fits: dense
  fp32 (the lossless baseline), fp16/bf16 on the wire, top-k + error feedback and scaled sign + error
  feedback per destination chunk (one ``all_to_all_single``: each rank receives only the messages for
  its own chunk), and a hierarchical reduce-scatter (intra-node reduce-scatter -> inter-node
  reduce-scatter). Only one parameter group per module (no per-parameter meshes), which is ours.
- ``set_all_reduce_hook(hook)`` runs *after* the reduction (after the reduce-scatter, or after native
  HSDP/``replicate``'s all-reduce) on its output: it cannot replace a collective.
- ``set_gradient_divide_factor`` / ``set_force_sum_reduction_for_comms`` only rescale;
  ``MixedPrecisionPolicy(reduce_dtype=...)`` casts the reduce-scatter input (the same bytes as our fp16).
- ``register_comm_hook`` exists for DDP only; FSDP2's ``replicate`` (``_composable.replicate_with_fsdp``,
  ZeRO-0 under tensor parallelism here) calls ``dist.all_reduce`` itself with no hook and no custom comm.

PowerSGD cannot be a reduce-scatter: it all-reduces a low-rank factor pair *per gradient matrix*, and the
custom comm sees one flat buffer of dim-0 shards without the parameters' shapes. It is refused under
FSDP (:data:`FSDP_REFUSED`).

Tensor-parallel ZeRO-0 with a comm hook: :class:`LocalGradReducer` takes the place of ``replicate``. It
buckets each parameter's *local* gradient (the DTensor's shard) and runs the very same DDP hook function
(``workers.training.comm.HOOKS``) on a :class:`LocalGradBucket` over the data-parallel group, after
backward (``ParallelModel.finish_grads``): no overlap with backward, so all of its time is exposed.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

import native_ops
from workers.training.comm.compression import VALUE_DTYPES, DensitySchedule, density_of, local_tensor
from workers.training.comm.hierarchical import (
    group_of_this_rank,
    spans_world,
    split_by_node,
    subgroup_node_lists,
)
from workers.training.comm.stats import CommStats, timed
from workers.training.comm_methods import FSDP_HOOK_NAMES, FSDP_REFUSED

log = logging.getLogger(__name__)

FSDP_METHODS = FSDP_HOOK_NAMES  # the hooks that have an FSDP2 reduce-scatter form here


def check_fsdp_method(name: str) -> None:
    """Raise ``ValueError`` with why, when hook ``name`` has no FSDP2 reduce-scatter form."""
    if name in FSDP_REFUSED:
        raise ValueError(f"comm_hook {name} under zero_stage 1-3: {FSDP_REFUSED[name]}")
    if name not in FSDP_METHODS:
        raise ValueError(f"comm_hook {name!r} has no FSDP2 form; choose from {', '.join(FSDP_METHODS)}")


class _Call:
    """What :func:`~workers.training.comm.stats.timed` needs of a bucket: ``is_last()``."""

    def __init__(self, last: bool) -> None:
        self._last = last

    def is_last(self) -> bool:
        return self._last


def _done_future(tensor: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def _scale_for(op, group_size: int) -> float:
    """The factor FSDP's ``op`` asks for: AVG divides by the group size, SUM does not (FSDP then divides
    itself). PREMUL_SUM (a custom ``gradient_divide_factor``) is not used on these groups."""
    if op == dist.ReduceOp.AVG:
        return 1.0 / group_size
    if op == dist.ReduceOp.SUM:
        return 1.0
    raise ValueError(f"custom reduce-scatter: reduce op {op} is not supported (AVG or SUM)")


class FsdpCommState(DensitySchedule):
    """One model part's reduce-scatter method: the per-step figures (``comm_stats()`` as a DDP hook
    state's), the error-feedback residuals (``state_dict()``), and one :class:`CompressedReduceScatter`
    per ``fully_shard`` module (its residual is that module's). Top-k (``topk_ef``, ``hierarchical`` with
    ``inter_node=topk``) follows the DDP hook's density schedule (:class:`DensitySchedule`: DGC's
    exponential warm-up over the first half of the job unless ``warmup_steps`` is given)."""

    def __init__(self, name: str, process_group: dist.ProcessGroup, options: dict | None = None) -> None:
        check_fsdp_method(name)
        opts = dict(options or {})
        self.name = name
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.stats = CommStats()
        self.step = 0
        self.comms: list[CompressedReduceScatter] = []
        self._calls = 0
        self._parse_schedule(opts, name)
        self.value_dtype = VALUE_DTYPES[str(opts.pop("value_dtype", "fp16"))]
        self.chunk = int(opts.pop("chunk", 4096))
        if "clip_norm" in opts:
            raise ValueError(
                f"{name} under FSDP2: clip_norm (DGC's local clipping, per parameter) has no parameters to clip "
                "in a reduce-scatter of flat shards; drop it"
            )
        self.hierarchy = None
        if name == "hierarchical":
            ranks_per_node = int(opts.pop("ranks_per_node", self.world_size))
            inter = str(opts.pop("inter_node", "dense"))
            if inter not in ("dense", "topk"):
                raise ValueError("hierarchical: inter_node must be 'dense' or 'topk'")
            opts.pop("intra_node", None)  # shared memory is the DDP hook's; here gloo inside a node
            self.hierarchy = NodeHierarchy(process_group, ranks_per_node)
            self.inter_topk = inter == "topk"
        if opts:
            raise ValueError(f"{name} (FSDP reduce-scatter): unknown options {sorted(opts)}")
        if self.chunk <= 0 or self.chunk % 8:
            raise ValueError("sign_ef: chunk must be a positive multiple of 8")

    def attach(self, module) -> None:
        """Give ``module`` (a ``fully_shard``-ed module) its reduce-scatter."""
        comm = CompressedReduceScatter(self, len(self.comms))
        self.comms.append(comm)
        module.set_custom_reduce_scatter(comm)

    def next_call(self) -> bool:
        """Count one module's reduce-scatter; True for the step's last (every module reduces once)."""
        self._calls += 1
        if self._calls == len(self.comms):
            self._calls = 0
            return True
        return False

    @property
    def sparse(self) -> bool:
        """Whether the method selects top-k (``topk_ef``, ``hierarchical`` with top-k across nodes)."""
        return self.name == "topk_ef" or (self.hierarchy is not None and self.inter_topk)

    def comm_stats(self) -> dict[str, float]:
        out = self.stats.comm_stats()
        if self.sparse:
            out["density"] = density_of(out)
        return out

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "residuals": {str(c.index): c.residual.clone() for c in self.comms if c.residual is not None},
            "schedule": self.schedule(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self._load_schedule(state.get("schedule"))
        for c in self.comms:
            saved = state["residuals"].get(str(c.index))
            c.residual = None if saved is None else saved.clone()

    def close(self) -> None:
        return None

    def plan_for_job(self, total_steps: int) -> None:
        """The default warm-up, for the methods that sparsify (the others have no schedule to plan)."""
        if self.sparse:
            super().plan_for_job(total_steps)

    def k(self, numel: int) -> int:
        return native_ops.k_for_density(numel, self.current_density())


class NodeHierarchy:
    """Intra-node and inter-node groups inside a data-parallel group given by its global ranks (the node
    of global rank g is g // ranks_per_node), created collectively for every DP group of the world, and
    the permutation of the reduce-scatter chunks that makes the two stages compose."""

    def __init__(self, process_group: dist.ProcessGroup, ranks_per_node: int) -> None:
        members = dist.get_process_group_ranks(process_group)
        if spans_world(process_group):
            intra_lists, inter_lists = split_by_node(members, ranks_per_node)
        else:
            intra_lists, inter_lists = subgroup_node_lists(process_group, ranks_per_node)
        self.intra_group, self.inter_group = group_of_this_rank(intra_lists), group_of_this_rank(inter_lists)
        nodes, inter = split_by_node(members, ranks_per_node)
        self.local, self.nodes = len(inter), len(nodes)
        position = {g: i for i, g in enumerate(members)}  # global rank -> rank in the DP group
        # chunk order for the intra-node stage: local index l major, node n minor
        self.order = [position[inter[lo][n]] for lo in range(self.local) for n in range(self.nodes)]


class CompressedReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter of one ``fully_shard`` module under the method of its :class:`FsdpCommState`."""

    def __init__(self, state: FsdpCommState, index: int) -> None:
        self.state, self.index = state, index
        self.residual: torch.Tensor | None = None

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def _residual(self, numel: int, device: torch.device) -> torch.Tensor:
        if self.residual is None or self.residual.numel() != numel:
            self.residual = torch.zeros(numel, dtype=torch.float32, device=device)
        elif self.residual.device != device:
            self.residual = self.residual.to(device)
        return self.residual

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        st = self.state
        w = dist.get_world_size(group)
        scale = _scale_for(op, w)
        n = input_tensor.numel()
        chunk = n // w
        last = st.next_call()
        payload, wire, extra = self._plan(n, chunk, w)

        def launch():
            self._reduce(output_tensor, input_tensor, group, op, scale, chunk)
            return _done_future(output_tensor)

        timed(st.stats, _Call(last), launch, bytes_sent=payload, wire_bytes=wire, dense_bytes=4 * n)
        for key, value in extra.items():
            st.stats.add(key, value)
        if st.sparse:  # the share of the gradient selected (the job page's density, the warm-up)
            st.stats.add("density_elements", st.current_density() * n)
        if last:
            st.step += 1
        return None

    # -- bytes this rank puts into collectives, and on the wire (ring estimates, as the DDP hooks count)
    def _plan(self, n: int, chunk: int, w: int) -> tuple[int, int, dict]:
        st = self.state
        if st.name in ("fp16", "bf16"):
            return 2 * n, 2 * (w - 1) * chunk, {}
        if st.name == "topk_ef":
            msg = st.k(chunk) * (4 + st.value_dtype.itemsize)
            return w * msg, (w - 1) * msg, {}
        if st.name == "sign_ef":
            msg = (chunk + 7) // 8 + 4 * math.ceil(chunk / st.chunk)
            return w * msg, (w - 1) * msg, {}
        if st.name == "hierarchical":
            h = st.hierarchy
            inter_in = 4 * n // h.local  # what enters the inter-node stage
            if h.nodes == 1:  # the DP group sits on one node: nothing crosses nodes
                inter_payload = inter_wire = 0
            elif st.inter_topk:
                inter_payload = h.nodes * st.k(chunk) * (4 + st.value_dtype.itemsize)
                inter_wire = (h.nodes - 1) * inter_payload // h.nodes
            else:
                inter_payload, inter_wire = inter_in, (h.nodes - 1) * inter_in // h.nodes
            intra_wire = (h.local - 1) * 4 * n // h.local
            extra = {"inter_node_bytes": inter_payload, "inter_node_wire_bytes": inter_wire}
            return (4 * n if h.local > 1 else 0) + inter_payload, intra_wire + inter_wire, extra
        return 4 * n, 4 * (w - 1) * chunk, {}

    def _reduce(self, out: torch.Tensor, x: torch.Tensor, group, op, scale: float, chunk: int) -> None:
        st = self.state
        if st.name == "allreduce":  # exactly FSDP's own DefaultReduceScatter, timed
            dist.reduce_scatter_single(out, x, group=group, op=op)
        elif st.name in ("fp16", "bf16"):
            wire_dtype = torch.float16 if st.name == "fp16" else torch.bfloat16
            low = (x * scale if scale != 1.0 else x).to(wire_dtype)  # scale first: fp16 range (torch's hook)
            low_out = torch.empty(chunk, dtype=wire_dtype, device=x.device)
            dist.reduce_scatter_single(low_out, low, group=group)
            out.copy_(low_out)
        elif st.name == "topk_ef":
            sparse_reduce_scatter(out, x, self._residual(x.numel(), x.device), st.k(chunk), st, group, scale)
        elif st.name == "sign_ef":
            sign_reduce_scatter(out, x, self._residual(x.numel(), x.device), st.chunk, group, scale)
        else:
            self._hierarchical(out, x, scale, chunk)

    def _hierarchical(self, out: torch.Tensor, x: torch.Tensor, scale: float, chunk: int) -> None:
        """Intra-node reduce-scatter of the chunks reordered (local index major), so that local rank l
        holds the node's sum of every chunk whose owner is the l-th DP rank of its node; then the inter-node
        reduce-scatter among the l-th ranks of every node gives each its own chunk."""
        st, h = self.state, self.state.hierarchy
        rows = x.view(-1, chunk)
        if scale != 1.0:
            rows = rows * scale
        if h.local > 1:
            ordered = rows[h.order].reshape(-1)
            node_sum = torch.empty(h.nodes * chunk, dtype=x.dtype, device=x.device)
            dist.reduce_scatter_single(node_sum, ordered, group=h.intra_group)
        else:  # one DP rank per node: chunks are already in node order, nothing to do inside a node
            node_sum = rows.reshape(-1)
        if st.inter_topk:
            residual = self._residual(node_sum.numel(), x.device)
            sparse_reduce_scatter(out, node_sum, residual, st.k(chunk), st, h.inter_group, 1.0)
        else:
            dist.reduce_scatter_single(out, node_sum, group=h.inter_group)


def _all_to_all_rows(packed: torch.Tensor, group) -> torch.Tensor:
    """Send row j of a [W, m] uint8 tensor to group rank j; returns the [W, m] rows received (row i from
    rank i)."""
    received = torch.empty_like(packed)
    dist.all_to_all_single(received.view(-1), packed.contiguous().view(-1), group=group)
    return received


def sparse_reduce_scatter(out, x, residual, k: int, st: FsdpCommState, group, scale: float) -> None:
    """``out`` <- sum over ``group`` of top-k(scale*x[chunk r] + residual[chunk r]), chunk r = this rank's;
    each rank keeps what it did not send of every chunk as its residual (error feedback, Stich et al.
    2018). One ``all_to_all_single``: chunk j's (indices, values) go to rank j only."""
    w = dist.get_world_size(group)
    chunk = x.numel() // w
    rows, res_rows = x.view(w, chunk), residual.view(w, chunk)
    messages = []
    for j in range(w):
        idx, vals = native_ops.topk_ef_compress(
            rows[j], res_rows[j], k=k, value_dtype=st.value_dtype, scale=scale
        )
        messages.append(torch.cat([idx.view(torch.uint8), vals.view(torch.uint8)]))
    received = _all_to_all_rows(torch.stack(messages), group)
    out.zero_()
    native_ops.topk_decompress_add(
        out,
        received[:, : 4 * k].contiguous().view(torch.int32),
        received[:, 4 * k :].contiguous().view(st.value_dtype),
    )


def sign_reduce_scatter(out, x, residual, chunk_elems: int, group, scale: float) -> None:
    """``out`` <- sum over ``group`` of scaled-sign(scale*x[chunk r] + residual[chunk r]) (Karimireddy et al.
    2019, EF-SignSGD), one ``all_to_all_single`` of (sign bits, per-``chunk_elems`` scales)."""
    w = dist.get_world_size(group)
    chunk = x.numel() // w
    rows, res_rows = x.view(w, chunk), residual.view(w, chunk)
    nbytes = (chunk + 7) // 8
    messages = []
    for j in range(w):
        bits, scales = native_ops.sign_ef_compress(rows[j], res_rows[j], chunk=chunk_elems, scale=scale)
        messages.append(torch.cat([bits, scales.view(torch.uint8)]))
    received = _all_to_all_rows(torch.stack(messages), group)
    out.zero_()
    native_ops.sign_decompress_add(
        out,
        received[:, :nbytes].contiguous(),
        received[:, nbytes:].contiguous().view(torch.float32),
        chunk=chunk_elems,
    )


def attach_fsdp_comm(
    modules: list, name: str, options: dict | None, process_group: dist.ProcessGroup
) -> FsdpCommState:
    """One :class:`FsdpCommState` for a model part's ``fully_shard`` modules (its blocks and root)."""
    state = FsdpCommState(name, process_group, options)
    for module in modules:
        state.attach(module)
    return state


# --------------------------------------------------------------------------- tensor-parallel ZeRO-0


class LocalGradBucket:
    """What a DDP comm hook reads of ``dist.GradBucket``, over local gradients: ``buffer()`` (flat),
    ``index()``, ``is_last()``, ``parameters()``, ``gradients()`` (views of the buffer, each parameter's
    local shape, as DDP's are) and ``set_buffer()``."""

    def __init__(self, index: int, buffer: torch.Tensor, params: list, shapes: list, last: bool) -> None:
        self._index, self._buffer, self._params, self._shapes, self._last = (
            index,
            buffer,
            params,
            shapes,
            last,
        )

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def parameters(self) -> list:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        out, offset = [], 0
        for shape in self._shapes:
            size = math.prod(shape)
            out.append(self._buffer[offset : offset + size].view(shape))
            offset += size
        return out

    def set_buffer(self, tensor: torch.Tensor) -> None:
        if tensor is not self._buffer:
            self._buffer.copy_(tensor)


class LocalGradReducer:
    """Data-parallel gradient reduction of a tensor-parallel part under a DDP comm hook (ZeRO-0, where
    torch's ``replicate`` has no hook): the parameters in reverse order (the order backward produces
    them, as DDP buckets) cut into buckets of ``bucket_cap_mb``, each bucket's local gradients flattened
    and handed to ``hook(state, bucket)``; every bucket is launched before any is waited for."""

    def __init__(
        self, module: nn.Module, params: list[nn.Parameter], state, hook, bucket_cap_mb: float | None
    ):
        self.state, self.hook = state, hook
        cap = int((bucket_cap_mb or 25.0) * 1e6)  # DDP's default bucket_cap_mb = 25
        self.buckets: list[list[nn.Parameter]] = []
        current, size = [], 0
        for p in reversed(params):
            nbytes = local_tensor(p.data).numel() * 4
            if current and size + nbytes > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            self.buckets.append(current)

    def reduce(self) -> None:
        """Average every bucket's local gradients over the data-parallel group through the hook."""
        pending = []
        for i, params in enumerate(self.buckets):
            grads = [
                local_tensor(p.grad) if p.grad is not None else torch.zeros_like(local_tensor(p.data))
                for p in params
            ]
            shapes = [g.shape for g in grads]
            flat = torch.cat([g.reshape(-1).float() for g in grads])
            bucket = LocalGradBucket(i, flat, params, shapes, i == len(self.buckets) - 1)
            pending.append((params, bucket, self.hook(self.state, bucket)))
        for params, bucket, fut in pending:
            reduced = fut.wait()
            bucket.set_buffer(reduced[0] if isinstance(reduced, list) else reduced)
            for p, g in zip(params, bucket.gradients(), strict=True):
                if p.grad is not None:
                    local_tensor(p.grad).copy_(g)
