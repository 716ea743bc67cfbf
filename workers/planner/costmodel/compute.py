"""Compute: GEMM efficiency and time, the forward FLOPs of a sequence, and the seconds one device spends
computing one micro-batch (communication left out), the runtime's host-side costs and the optimizer step
(:class:`ComputeCosts`, a part of :class:`~.step.CostModel`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..hardware import Efficiency
from .collectives import all_reduce_time, all_to_all_time
from .layouts import Layouts, layer_passes, recompute_flags
from .placement import GroupLinks

if TYPE_CHECKING:
    from ..specs import ModelSpec


def gemm_efficiency(eff: Efficiency, m, n, k) -> np.ndarray:
    """Achieved / peak for an (m x k) @ (k x n) GEMM: a saturating curve in arithmetic intensity
    I = mnk / (mk + kn + mn) (roofline, Williams et al. 2009; smooth blend calibrated per device)."""
    intensity = 1.0 / (1.0 / m + 1.0 / n + 1.0 / k)
    return eff.gemm_max * intensity / (intensity + eff.gemm_half_intensity)


def gemm_time(eff: Efficiency, peak_flops: float, count, m, n, k) -> np.ndarray:
    """Seconds for ``count`` GEMMs of shape (m, n, k) at 2mnk FLOPs each."""
    m = np.maximum(m, 1.0)
    return count * 2.0 * m * n * k / (peak_flops * gemm_efficiency(eff, m, n, k))


def forward_flops_per_sequence(m: ModelSpec) -> dict[str, float]:
    """Forward FLOPs of one sequence through the whole model (2 FLOPs per multiply-add), by part:
    ``layers`` (GEMMs incl. the s^2 attention term), ``core`` (the attention-score part of it) and
    ``logits``. Narayanan et al. SC'21 eq. (3) for dense GPT: 24 s h^2 + 4 s^2 h per layer, 2 s h V. The cost
    model's and the model page's one formula."""
    s, h, hd, q = m.seq_length, m.hidden_size, m.head_dim, m.q_width
    mats = 3 if m.gated else 2
    n_moe = m.num_moe_layers
    kvd = m.num_kv_heads * hd
    qkv = 2 * s * h * (q + 2 * kvd)
    core = 2 * 2 * s * s * q  # QK^T and attention-over-V
    proj = 2 * s * q * h
    dense_mlp = 2 * s * h * m.ffn_hidden_size * mats
    layers = m.num_layers * (qkv + core + proj) + (m.num_layers - n_moe) * dense_mlp
    if m.moe:
        fe = m.moe.expert_ffn_hidden_size
        # top-k routed experts plus shared experts and the router (Fedus et al. 2022; activated params)
        per_token = (
            2 * h * mats * (fe * m.moe.top_k + m.moe.shared_ffn_hidden_size) + 2 * h * m.moe.num_experts
        )
        layers += n_moe * s * per_token
    logits = 2 * s * h * m.vocab_size
    return {"layers": float(layers), "core": float(m.num_layers * core), "logits": float(logits)}


class ComputeCosts:
    """The compute terms of :class:`~.step.CostModel` (a mixin: it reads what ``CostModel.__init__`` sets,
    the model, training, efficiency, peak FLOP/s, memory bandwidth and byte sizes, and the step's
    ``tokens_per_micro_batch`` and ``moe_load``, and the memory part's ``layer_activation_bytes``)."""

    # ---------------------------------------------------------------- FLOPs
    def forward_flops_per_sequence(self) -> dict[str, float]:
        """Forward FLOPs of one sequence through the whole model: :func:`forward_flops_per_sequence`."""
        return forward_flops_per_sequence(self.model)

    # ---------------------------------------------------------------- time
    def _layer_gemm_times(self, L: Layouts) -> dict[str, np.ndarray]:
        """Forward GEMM seconds of one layer and one micro-batch on one device."""
        m, eff, P = self.model, self.eff, self.peak_flops
        h, a, hd, s = m.hidden_size, m.num_attention_heads, m.head_dim, m.seq_length
        kvd = m.num_kv_heads * hd
        t = L.tp.astype(np.float64)
        b = L.mbs.astype(np.float64)
        s_loc = s / L.cp.astype(np.float64)
        T = b * s_loc
        qkv = gemm_time(eff, P, 1.0, T, (m.q_width + 2 * kvd) / t, h)
        scores = gemm_time(eff, P, b * a / t, s_loc, s, hd)
        context = gemm_time(eff, P, b * a / t, s_loc, hd, s)
        proj = gemm_time(eff, P, 1.0, T, h, m.q_width / t)
        f = m.ffn_hidden_size
        mlp = gemm_time(eff, P, 1.0, T, (self.mats - 1) * f / t, h) + gemm_time(eff, P, 1.0, T, h, f / t)
        out = {"attn": qkv + proj, "core": scores + context, "dense_mlp": mlp}
        if m.moe:
            E, fe = m.moe.num_experts, m.moe.expert_ffn_hidden_size
            local = E / L.ep
            # tokens one local expert sees on the busiest rank; expert tensor parallelism = tp
            tok = T * m.moe.top_k * self.moe_load(L) * L.ep / E
            experts = gemm_time(eff, P, local, tok, (self.mats - 1) * fe / t, h) + gemm_time(
                eff, P, local, tok, h, fe / t
            )
            fs = m.moe.shared_ffn_hidden_size
            shared = 0.0
            if fs:
                shared = gemm_time(eff, P, 1.0, T, (self.mats - 1) * fs / t, h) + gemm_time(
                    eff, P, 1.0, T, h, fs / t
                )
            router = gemm_time(eff, P, 1.0, T, E, h)
            out["moe_mlp"] = experts + shared + router
        else:
            out["moe_mlp"] = out["dense_mlp"]
        out["logits"] = gemm_time(eff, P, 1.0, T, m.vocab_size / t, h)
        return out

    def compute_times(self, L: Layouts, g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Seconds of one micro-batch on one device, communication left out: ``dense_layer`` and
        ``moe_layer`` (GEMMs ``g`` from :meth:`_layer_gemm_times` and memory-bound kernels, over forward,
        backward and recompute), ``embedding`` (first stage), ``logits`` (logits and loss, last stage) and
        ``edge`` (the larger of the two when pp > 1, their sum when pp == 1)."""
        m, eff = self.model, self.eff
        h = m.hidden_size
        t = L.tp.astype(np.float64)
        p = L.pp.astype(np.float64)
        T = self.tokens_per_micro_batch(L)
        _full, sel = recompute_flags(L)
        sp = L.sp.astype(bool)
        passes = layer_passes(L)

        # memory-bound kernels: traffic proportional to the activations they produce (forward), 2x backward
        act = self.layer_activation_bytes(L)
        rep = np.where(sp, act["replicated"] / t, act["replicated"])
        ew = eff.elementwise_traffic / self.mem_bw
        ew_core = ew * act["core"] / t
        ew_dense = ew * (rep + act["dense_split"] / t) + ew_core
        ew_moe = ew * (rep + act["moe_split"] / t) + ew_core

        dense_layer = (
            passes * (g["attn"] + g["dense_mlp"] + g["core"])
            + sel * g["core"]
            + passes * ew_dense
            + sel * ew_core
        )
        moe_layer = (
            passes * (g["attn"] + g["moe_mlp"] + g["core"])
            + sel * g["core"]
            + passes * ew_moe
            + sel * ew_core
        )
        # logits GEMM forward + backward, and the fp32 softmax/cross-entropy over T x V/t (a few passes)
        logits = 3.0 * g["logits"] + 3 * 4.0 * T * m.vocab_size / t / self.mem_bw
        embedding = 2 * T * h * self.act_bytes / t / self.mem_bw
        edge = np.where(p > 1, np.maximum(logits, embedding), logits + embedding)
        return {
            "dense_layer": dense_layer,
            "moe_layer": moe_layer,
            "edge": edge,
            "embedding": embedding,
            "logits": logits,
        }

    def framework_times(self, L: Layouts, links: dict[str, GroupLinks]) -> dict[str, np.ndarray]:
        """The runtime's host-side seconds (:class:`~.hardware.Framework`, zeros when not measured), each from
        the figures of the runtime's wrapper the layout gets (tp > 1: tensor parallel; else zero_stage >= 1:
        FSDP2; else more than one replica: DDP; else plain) and its recompute mode: ``layer`` per dense layer
        and micro-batch, ``moe_layer`` per MoE layer and micro-batch (expert parallel: its own figure),
        ``edge`` per micro-batch on the last stage (embedding, head, loss), ``step_layer`` per layer of the
        stage and ``step_fixed`` per step (DDP's or FSDP2's gradient reduction in the last micro-batch,
        pending reductions, gradient norm, clipping, the optimizer, the step's small all-reduce); the start-up
        of the collectives the measured passes hold, which the communication terms then leave out:
        ``tp_latency`` per layer and ``ep_latency`` per MoE layer and micro-batch, and ``dp_in_host`` where the
        gradient reduction (DDP) or ZeRO-3's gathers (FSDP2) are measured; ``compute_scale``: the factor on
        the modelled compute. The tp, FSDP2 and ep figures were measured on 2 ranks and serve every degree
        > 1; a layout of one process divides them by ``two_process_contention`` (it has the cores alone)."""
        fw = self.fw
        zero = np.zeros_like(L.tp, dtype=np.float64)  # the layouts' (broadcasting) shape
        if not fw.measured:
            names = ("layer", "moe_layer", "edge", "step_layer", "step_fixed", "tp_latency", "ep_latency")
            return {k: zero for k in names} | {"compute_scale": zero + 1.0, "dp_in_host": zero > 0}
        tp_on = L.tp > 1
        fsdp_on = ~tp_on & (L.zero >= 1)  # the runtime's FSDP2 (training/parallelize.py)
        ddp_on = ~tp_on & ~fsdp_on & (L.dp * L.cp > 1)  # the runtime's DDP wrapper
        world = (L.tp * L.pp * L.dp * L.cp).astype(np.float64)
        # every figure was measured with both ranks sharing the machine; one process has it to itself
        alone = np.where(world > 1, 1.0, 1.0 / fw.two_process_contention)

        def by_kind(field: str) -> np.ndarray:
            """``field`` of the layout's wrapper (prefix ``tp_``, ``fsdp_``, ``dp_``, none), the plain one
            (0 when plain has none) where the wrapper's was not measured."""
            plain = getattr(fw, field, 0.0)
            pick = [(tp_on, "tp_"), (fsdp_on, "fsdp_"), (ddp_on, "dp_")]
            own = [getattr(fw, prefix + field, 0.0) or plain for _on, prefix in pick]
            return (np.select([on for on, _prefix in pick], own, plain) + zero) * alone

        full, sel = recompute_flags(L)
        base = by_kind("layer_pass_s")
        # a recompute mode's own figure; one not measured: the pass and a fourth (the forward again)
        selective, whole = by_kind("layer_pass_selective_s"), by_kind("layer_pass_full_s")
        with_sel = np.where(selective > 0, selective, base * 4 / 3)
        with_full = np.where(whole > 0, whole, base * 4 / 3)
        layer = np.where(sel > 0, with_sel, np.where(full > 0, with_full, base))
        # a MoE layer under ep: its measured pass, plus what the layout's recompute adds to a dense one
        ep_on = (L.ep > 1) & (fw.ep_moe_layer_pass_s > 0) & bool(self.model.moe)
        moe_layer = np.where(ep_on, fw.ep_moe_layer_pass_s * alone + (layer - base), layer)
        # the start-up of the collectives the measured passes hold: an all-reduce (all-to-all) of nothing,
        # as many as tp_comm (ep_comm) charges
        tp_latency = np.where(tp_on, (4.0 + 2.0 * full) * all_reduce_time(links["tp"], 0.0), 0.0)
        ep_latency = np.where(ep_on, 2.0 * layer_passes(L) * all_to_all_time(links["ep"], 0.0), 0.0)
        dp_in_host = (ddp_on & (fw.dp_reduce_fixed_s > 0)) | (
            fsdp_on & (L.zero == 3) & (fw.fsdp_layer_pass_s > 0)
        )
        return {
            "layer": layer,
            "moe_layer": moe_layer,
            "edge": by_kind("edge_pass_s"),
            "step_layer": by_kind("step_layer_s") + by_kind("reduce_layer_s"),
            "step_fixed": by_kind("step_fixed_s")
            + by_kind("reduce_fixed_s")
            + np.where(world > 1, fw.step_collective_s, 0.0),
            "tp_latency": tp_latency,
            "ep_latency": ep_latency,
            "dp_in_host": dp_in_host,
            "compute_scale": fw.compute_scale * alone,
        }

    def optimizer_time(self, L: Layouts, params: dict[str, np.ndarray]) -> np.ndarray:
        """Seconds of the optimizer step on one device for the stage ``params`` (ZeRO >= 1: its shard)."""
        dpcp = (L.dp * L.cp).astype(np.float64)
        edp = dpcp / L.ep
        # optimizer step: memory bound, ~28 bytes moved per mixed-precision Adam parameter
        # (read master, m, v, grad; write master, m, v, 16-bit copy)
        opt_params = np.where(
            L.zero >= 1, params["dense"] / dpcp + params["expert"] / edp, params["dense"] + params["expert"]
        )
        return opt_params * (2 * self.optimizer_bytes + 2 * self.weight_bytes) / self.mem_bw
