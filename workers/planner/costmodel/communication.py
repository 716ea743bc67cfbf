"""Communication: the links each parallel group crosses, and one method per parallel dimension for the
time and bytes of its collectives (``tp_comm``, ``cp_comm``, ``ep_comm``, ``pp_comm``, ``dp_comm``;
:class:`CommunicationCosts`, a part of :class:`~.step.CostModel`)."""

from __future__ import annotations

import numpy as np

from .collectives import (
    all_reduce_time,
    all_to_all_time,
    p2p_time,
    reduce_scatter_time,
    shard_collective_time,
)
from .layouts import Layouts, layer_passes, recompute_flags
from .placement import (
    GroupLinks,
    block_per_node,
    cp_dp_block,
    cross_tier_fraction,
    gradient_group_stride,
    group_links,
    group_strides,
)


def _share(part, whole) -> np.ndarray:
    """``part / whole``, 0 where ``whole`` is 0."""
    whole = np.asarray(whole, dtype=np.float64)
    return np.divide(part, whole, out=np.zeros(np.broadcast(part, whole).shape), where=whole > 0)


class CommunicationCosts:
    """The communication terms of :class:`~.step.CostModel` (a mixin: it reads what ``CostModel.__init__``
    sets, the model, cluster, training, efficiency, placement ``order``, byte sizes and the framework's
    collectives, and the step's ``tokens_per_micro_batch`` and ``moe_load``)."""

    def links(self, L: Layouts) -> dict[str, GroupLinks]:
        """The links every parallel group of each layout crosses under this model's placement ``order``:
        ``tp``, ``cp``, ``dp`` (the dp x cp gradient group), ``ep``, ``edp`` (expert data parallel), ``pp``."""
        eff, n = self.eff, self.cluster.devices_per_node
        strides = group_strides(L, self.order)
        # the groups carved from the cp x dp block: members per node of their two levels
        size_in, s_in, s_out = cp_dp_block(L, strides, self.order)
        size_in = size_in.astype(np.int64)
        block = L.dp * L.cp
        ep = L.ep
        ep_in = np.minimum(ep, size_in)
        ep_node = block_per_node(n, ep_in, s_in, np.maximum(ep // np.maximum(ep_in, 1), 1), s_out)
        edp_node = np.where(
            ep < size_in,
            block_per_node(n, size_in // np.maximum(ep, 1), ep * s_in, block // size_in, s_out),
            block_per_node(n, 1, 1, block // ep, strides["edp"]),
        )
        dp_node = block_per_node(n, size_in, s_in, block // size_in, s_out)
        return {
            "tp": group_links(self.cluster, eff, L.tp, strides["tp"]),
            "cp": group_links(self.cluster, eff, L.cp, strides["cp"]),
            "dp": group_links(
                self.cluster, eff, block, gradient_group_stride(L, strides, self.order), dp_node
            ),
            "ep": group_links(self.cluster, eff, ep, strides["ep"], ep_node, pattern="all_to_all"),
            "edp": group_links(self.cluster, eff, block // ep, strides["edp"], edp_node),
            "pp": group_links(self.cluster, eff, L.pp, strides["pp"], pattern="p2p"),
        }

    def cross_switch_bytes(self, L: Layouts, tm: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Bytes per device per step that leave a switch of each tier (by tier name, innermost first) under
        this model's ``order``, from the per-kind volumes of :meth:`timing` ``tm`` and
        :func:`cross_tier_fraction` of each group; empty when the cluster lists no tiers."""
        strides = group_strides(L, self.order)
        groups = {
            "tp": (L.tp, strides["tp"], "ring"),
            "cp": (L.cp, strides["cp"], "ring"),
            "dp": (L.dp * L.cp, gradient_group_stride(L, strides, self.order), "ring"),
            "ep": (L.ep, strides["ep"], "all_to_all"),
            "edp": ((L.dp * L.cp) // L.ep, strides["edp"], "ring"),
            "pp": (L.pp, strides["pp"], "p2p"),
        }
        out = {}
        for tier in self.cluster.tiers:
            out[tier.name] = sum(
                tm[f"volume_{kind}"] * cross_tier_fraction(self.cluster, size, stride, tier.nodes, pattern)
                for kind, (size, stride, pattern) in groups.items()
            )
        return out

    def tp_comm(self, L: Layouts, links: GroupLinks) -> dict[str, np.ndarray]:
        """Tensor-parallel collectives of one layer and one micro-batch: ``time`` (on the critical path) and
        ``volume`` (bytes per device)."""
        t = L.tp.astype(np.float64)
        full, _sel = recompute_flags(L)
        # TP: two all-reduces per layer forward, two backward, two more when the layer is recomputed;
        # with sequence parallelism each becomes reduce-scatter + all-gather of the same volume
        # (Korthikanti et al. 2022 §4.2.2)
        tp_bytes = self.tokens_per_micro_batch(L) * self.model.hidden_size * self.act_bytes
        tp_one = all_reduce_time(links, tp_bytes)
        return {
            "time": (4.0 + 2.0 * full) * tp_one,
            "volume": (4.0 + 2.0 * full) * 2 * (t - 1) / t * tp_bytes,
        }

    def cp_comm(self, L: Layouts, links: GroupLinks, core: np.ndarray) -> dict[str, np.ndarray]:
        """Context-parallel K/V exchange of one layer and one micro-batch, beside the attention core GEMMs
        ``core``: ``time`` (all of it), ``exposed`` (what the core does not hide, plus the slowdown of what it
        does) and ``volume`` (bytes per device)."""
        m = self.model
        t = L.tp.astype(np.float64)
        cp = L.cp.astype(np.float64)
        full, sel = recompute_flags(L)
        # CP: ring attention passes K and V (cp-1) times forward, K, V and their grads backward,
        # overlapped with the attention-core compute (Liu et al. 2023, Ring Attention)
        kvd = m.num_kv_heads * m.head_dim
        cp_bytes = 2 * self.tokens_per_micro_batch(L) * kvd / t * self.act_bytes
        cp_fwd = (cp - 1) * p2p_time(links, cp_bytes)
        cp_passes = 1.0 + 2.0 + full + sel
        exposed = np.maximum(0.0, cp_fwd - core) * cp_passes
        # overlapped communication is not free: it slows the kernels it runs beside
        exposed = exposed + self.eff.overlap_slowdown * (cp_fwd * cp_passes - exposed)
        return {"time": cp_fwd * cp_passes, "exposed": exposed, "volume": cp_passes * (cp - 1) * cp_bytes}

    def ep_comm(self, L: Layouts, links: GroupLinks) -> dict[str, np.ndarray]:
        """Expert-parallel all-to-alls of one MoE layer and one micro-batch: ``time`` and ``volume`` (bytes
        per device); zero for a dense model."""
        m = self.model
        if not m.moe:
            zero = np.zeros_like(L.tp.astype(np.float64))
            return {"time": zero, "volume": zero}
        passes = layer_passes(L)
        # EP: dispatch and combine all-to-all per MoE layer per pass, the busiest rank carrying
        # moe_load x its share (Lepikhin et al. 2021, GShard §2)
        ep_bytes = (
            self.tokens_per_micro_batch(L) * m.moe.top_k * self.moe_load(L) * m.hidden_size * self.act_bytes
        )
        return {
            "time": 2.0 * passes * all_to_all_time(links, ep_bytes),
            "volume": 2.0 * passes * (L.ep - 1) / L.ep * ep_bytes,
        }

    def pp_comm(
        self, L: Layouts, links: GroupLinks, micro: np.ndarray, ideal: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Pipeline costs of one step, given its ``ideal`` (bubble-free) time over ``micro`` micro-batches:
        the schedule's ``bubble``, and the ``time`` and ``volume`` (bytes per device) of the stage-to-stage
        sends."""
        t = L.tp.astype(np.float64)
        p = L.pp.astype(np.float64)
        v = L.vpp.astype(np.float64)
        # pipeline bubble: (p-1)/(v m) of the ideal time (Narayanan et al. SC'21 §2.2)
        bubble = ideal * (p - 1) / (v * micro)
        # PP: each micro-batch sends activations forward and gradients back at every one of the v chunk
        # boundaries, split across TP ranks (Megatron scatter/gather optimisation, SC'21 §4.1)
        pp_bytes = self.tokens_per_micro_batch(L) * self.model.hidden_size * self.act_bytes / t
        return {
            "bubble": bubble,
            "time": np.where(p > 1, micro * 2.0 * v * p2p_time(links, pp_bytes), 0.0),
            "volume": np.where(p > 1, micro * 2.0 * v * pp_bytes, 0.0),
        }

    def dp_comm(
        self,
        L: Layouts,
        dp_links: GroupLinks,
        edp_links: GroupLinks,
        micro: np.ndarray,
        compute_micro: np.ndarray,
        params: dict[str, np.ndarray],
        layers_here: np.ndarray | float = 1.0,
        dp_in_host: np.ndarray | bool = False,
    ) -> dict[str, np.ndarray]:
        """Data-parallel gradient reduction (and ZeRO parameter gathers) of one step for the stage
        ``params`` of :meth:`stage_parameters` (``layers_here`` layers): ``time`` (all of it), ``exposed``
        (what the backward and forward of ``compute_micro`` seconds do not hide, plus the slowdown of what
        they do) and ``volume`` (bytes per device). ZeRO-3's per-micro-batch gathers follow the framework's
        :class:`~.hardware.FrameworkCollectives` (rings over the node's NICs or each rank's own link, one
        collective per block or per prefetch bucket). Where ``dp_in_host``, the start-up of the ZeRO-0
        all-reduce and of ZeRO-3's per-block collectives is left out: the runtime's measured DDP reduction
        and FSDP2 passes hold it (``ComputeCosts.framework_times``)."""
        full, _sel = recompute_flags(L)
        passes = layer_passes(L)
        # DP: gradient all-reduce (ZeRO 0), or reduce-scatter + parameter all-gather (ZeRO >= 1);
        # dense grads over dp*cp ranks, expert grads over the expert-data-parallel ranks
        gb = self.grad_bytes
        dense_b, expert_b = params["dense"] * gb, params["expert"] * gb
        ar = all_reduce_time(dp_links, dense_b) + all_reduce_time(edp_links, expert_b)
        ar = ar - np.where(dp_in_host, all_reduce_time(dp_links, 0.0), 0.0)  # measured with DDP's reduction
        rs = reduce_scatter_time(dp_links, dense_b) + reduce_scatter_time(edp_links, expert_b)
        wb = self.weight_bytes / gb
        ag = wb * rs  # all-gather of the updated parameters: same pattern as the reduce-scatter
        dpcp = (L.dp * L.cp).astype(np.float64)
        edp = dpcp / L.ep
        dp_vol_unit = 2 * (dpcp - 1) / dpcp * dense_b + 2 * (edp - 1) / edp * expert_b
        bwd_micro = compute_micro * (2.0 / passes)
        fwd_micro = compute_micro * (1.0 / passes)
        bwd3, fwd3 = bwd_micro, fwd_micro  # FSDP/ZeRO-3 always prefetches parameters
        z = L.zero
        # overlap window: the backward of the last micro-batch for gradient reduction, the forward of the
        # first micro-batch for the parameter all-gather (Megatron-Core overlap_grad_reduce/param_gather);
        # none without overlap_grad_reduce (the framework's default when unset: specs.FRAMEWORK_DEFAULTS;
        # Megatron-Core's is to reduce after the last backward)
        if not self.training.setting("overlap_grad_reduce"):
            bwd_micro = fwd_micro = 0.0 * bwd_micro
        dp_total = np.where(z == 0, ar, np.where(z == 1, rs + ag, micro * rs + ag))
        exposed0 = np.maximum(0.0, ar - bwd_micro)
        exposed1 = np.maximum(0.0, rs - bwd_micro) + np.maximum(0.0, ag - fwd_micro)
        exposed2 = micro * np.maximum(0.0, rs - bwd_micro) + np.maximum(0.0, ag - fwd_micro)
        # ZeRO-3 gathers parameters before each forward and backward (and recompute) of every micro-batch
        # and reduce-scatters the gradients after each backward, in the framework's collectives
        c = self.collectives
        own_link = c.zero3_inter_node == "per_device_link"
        blocks = np.asarray(layers_here, dtype=np.float64) + 1.0  # the blocks, and the embedding/head
        if c.zero3_unit == "bucket" and c.prefetch_parameters > 0:
            # DeepSpeed gathers whole parameters, small ones coalesced up to a prefetch bucket: one call
            # per weight matrix (4 per block, 5 gated) when matrices exceed the bucket, fewer otherwise
            matrices = blocks * (self.mats + 2.0)
            buckets = np.ceil((params["dense"] + params["expert"]) / c.prefetch_parameters)
            calls = np.maximum(1.0, np.minimum(matrices, buckets))
        else:
            calls = blocks
        calls = np.where(dp_in_host, 0.0, calls)  # calls only count the start-up (the latency)
        expert_calls = np.where(params["expert"] > 0, calls, 0.0)
        # one micro-batch's reduce-scatter of the gradients and one all-gather of the parameters
        rs3 = shard_collective_time(dp_links, dense_b, calls, own_link) + shard_collective_time(
            edp_links, expert_b, expert_calls, own_link
        )
        ag3 = wb * rs3
        exposed3 = micro * (
            np.maximum(0.0, (1.0 + full) * ag3 - fwd3 * (1.0 + full)) + np.maximum(0.0, ag3 + rs3 - bwd3)
        )
        dp_total = np.where(z == 3, micro * (2.0 + full) * ag3 + micro * rs3, dp_total)
        dp_exposed = np.select([z == 0, z == 1, z == 2], [exposed0, exposed1, exposed2], exposed3)
        # overlapped communication is not free: it slows the kernels it runs beside
        dp_exposed = dp_exposed + self.eff.overlap_slowdown * np.maximum(0.0, dp_total - dp_exposed)
        dp_vol = np.select(
            [z <= 1, z == 2],
            [dp_vol_unit, dp_vol_unit * (micro + 1) / 2],
            dp_vol_unit * micro * (3.0 + full) / 2,
        )
        return {
            "time": np.where(dpcp > 1, dp_total, 0.0),
            "exposed": np.where(dpcp > 1, dp_exposed, 0.0),
            "volume": dp_vol,
            # the expert gradients' share (over the expert-data-parallel group)
            "volume_expert": dp_vol * _share(2 * (edp - 1) / edp * expert_b, dp_vol_unit),
        }
