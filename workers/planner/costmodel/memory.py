"""Memory: the layers, parameters and activations each pipeline stage holds, and the bytes per device of
each layout's heaviest stage under ZeRO (:class:`MemoryCosts`, a part of :class:`~.step.CostModel`)."""

from __future__ import annotations

import numpy as np

from .layouts import GiB, Layouts


class MemoryCosts:
    """The memory terms of :class:`~.step.CostModel` (a mixin: it reads what ``CostModel.__init__`` sets,
    the model, training, efficiency, parameter counts, byte sizes and the framework's collectives, and the
    step's ``micro_batches`` and ``moe_load``)."""

    # ---------------------------------------------------------------- parameters and memory
    def stage_layers(self, L: Layouts) -> dict[str, np.ndarray]:
        """Layers of each layout on its ``first`` stage, its heaviest ``middle`` stage (0 when pp <= 2) and its
        ``last`` stage (the one stage itself when pp == 1), as float arrays: the split ``L`` carries, else
        :func:`~workers.planner.specs.balanced_stage_split` of each ``pp`` (the even split when pp divides
        the layers).

        The middle stage is costed as stage 1, the middle stage with the most micro-batches in flight under
        1F1B: exact for the balanced split (its remainder fills the middle stages from stage 1 on), an upper
        bound on the memory of a listed split whose heaviest middle stage sits later."""
        if L.first_layers is not None:
            return {
                "first": L.first_layers.astype(np.float64),
                "middle": L.mid_layers.astype(np.float64),
                "last": L.last_layers.astype(np.float64),
            }
        n = self.model.num_layers
        base, extra = np.divmod(n, L.pp)
        # balanced_stage_split, vectorised: the remainder goes to the middle stages, then to the first
        first = base + (extra > np.maximum(L.pp - 2, 0))
        middle = np.where(L.pp > 2, base + (extra > 0), 0)
        return {
            "first": first.astype(np.float64),
            "middle": middle.astype(np.float64),
            "last": base.astype(np.float64),
        }

    def _parameters_on(self, L: Layouts, layers: np.ndarray, vocab_matrices) -> dict[str, np.ndarray]:
        """Parameters one device of a stage of ``layers`` layers holds, before ZeRO sharding, with
        ``vocab_matrices`` vocabulary-sized matrices (embedding, LM head): ``dense`` (replicated across data
        parallel) and ``expert`` (sharded by EP). The stage's MoE layers are its share of the model's
        (``layers * num_moe_layers / num_layers``), wherever they sit."""
        m = self.model
        t = L.tp.astype(np.float64)
        per_layer_dense = self.params["attention"] / m.num_layers
        dense_mlp = self.params["dense_mlp"] / max(self.n_dense, 1)
        shared = self.params["shared"] / max(self.n_moe, 1)
        experts = self.params["experts"] / max(self.n_moe, 1)
        layers_dense = layers * (self.n_dense / m.num_layers)
        layers_moe = layers * (self.n_moe / m.num_layers)
        # Megatron-LM: every matrix is split by TP (vocab-parallel embedding too); norms are replicated
        body = (layers_dense * (per_layer_dense + dense_mlp) + layers_moe * (per_layer_dense + shared)) / t
        norms = 4 * m.hidden_size * layers
        edge = vocab_matrices * (m.vocab_size * m.hidden_size / t)
        expert = layers_moe * experts / (L.ep * t)
        return {"dense": body + norms + edge, "expert": expert}

    def largest_matrix(self, L: Layouts) -> np.ndarray:
        """Elements of the largest weight matrix one device holds (TP-split): what DeepSpeed must gather
        whole whatever its live-parameter cap."""
        m = self.model
        kvd = m.num_kv_heads * m.head_dim
        widest = max(m.hidden_size + 2 * kvd, m.ffn_hidden_size * (2 if m.gated else 1), m.vocab_size)
        return m.hidden_size * widest / L.tp.astype(np.float64)

    def parameters_by_stage(self, L: Layouts) -> dict[str, dict[str, np.ndarray]]:
        """:meth:`_parameters_on` the ``first``, ``middle`` and ``last`` stage of :meth:`stage_layers`.

        p == 1: the one stage holds input embedding and output layer (one matrix when tied); p > 1: the
        first has the embedding, the last the output layer (a copy of the embedding when tied), the middle
        stages neither."""
        p = L.pp
        stages = self.stage_layers(L)
        both = 1.0 if self.model.tied_embeddings else 2.0
        ends = np.where(p > 1, 1.0, both)
        return {
            "first": self._parameters_on(L, stages["first"], ends),
            "middle": self._parameters_on(L, stages["middle"], 0.0),
            "last": self._parameters_on(L, stages["last"], ends),
        }

    def stage_parameters(self, L: Layouts) -> dict[str, np.ndarray]:
        """Parameters held by one device of the heaviest stage (by parameter count), before ZeRO sharding:
        ``dense`` (replicated across data parallel) and ``expert`` (sharded by EP), as float arrays."""
        by_stage = self.parameters_by_stage(L)
        out = by_stage["first"]
        for kind in ("last", "middle"):
            other = by_stage[kind]
            more = other["dense"] + other["expert"] > out["dense"] + out["expert"]
            out = {k: np.where(more, other[k], out[k]) for k in out}
        return out

    def layer_activation_bytes(self, L: Layouts) -> dict[str, np.ndarray]:
        """Korthikanti et al. 2022 activation bytes of one layer and one micro-batch on one device, split
        into ``replicated`` (not split by TP unless sequence parallel), ``split`` (split by TP) and
        ``core`` (attention scores, softmax, dropout: the 5as^2b term), for dense and MoE layers."""
        m = self.model
        h, a, hd = m.hidden_size, m.num_attention_heads, m.head_dim
        kvd = m.num_kv_heads * hd
        s = m.seq_length
        s_loc = s / L.cp
        T = L.mbs * s_loc
        scale = self.act_bytes / 2.0
        # Korthikanti et al. 2022 §4.1: 10sbh not split by TP (2 LayerNorm inputs 4sbh, QKV input 2sbh,
        # MLP input 2sbh, two dropout masks sbh each)
        replicated = 10.0 * T * h
        # Q, K, V (GQA: K and V have kv_heads) and the projection input: 2sbh + 4sbh in eq. 1 when kv = a
        attn_split = 2 * T * m.q_width + 4 * T * kvd + 2 * T * m.q_width
        f = m.ffn_hidden_size
        # MLP: activation input and output, 16sbh for gelu with f = 4h (eq. 1); gated: two inputs + output
        mlp_split = (6.0 if self.mats == 3 else 4.0) * T * f
        # attention core 5as^2b: softmax 2, dropout mask 1, dropout output 2 (eq. 1); CP keeps s/cp queries
        core = 0.0 if self.training.setting("flash_attention") else 5.0 * a * s_loc * s * L.mbs
        out = {
            "replicated": replicated * scale,
            "dense_split": (attn_split + mlp_split) * scale,
            "core": core * scale,
        }
        if m.moe is not None:
            fe = m.moe.expert_ffn_hidden_size
            routed = T * m.moe.top_k * self.moe_load(L)
            expert_act = routed * (2 * h + (6.0 if self.mats == 3 else 4.0) * fe)
            shared_act = (6.0 if self.mats == 3 else 4.0) * T * m.moe.shared_ffn_hidden_size
            out["moe_split"] = (attn_split + expert_act + shared_act) * scale
        else:
            out["moe_split"] = out["dense_split"]
        return out

    def memory(self, L: Layouts, parts: bool = True) -> dict[str, np.ndarray]:
        """Bytes per device on the heaviest stage: params, grads, optimizer, activations, total (``parts``
        False: the total only, what the search's memory filter needs).

        The first, the heaviest middle and the last stage (:meth:`stage_layers`) are each charged their
        own layers, vocabulary matrices and micro-batches in flight; the figures are those of the one with
        the largest total."""
        m = self.model
        t = L.tp.astype(np.float64)
        p = L.pp.astype(np.float64)
        v = L.vpp.astype(np.float64)
        dpcp = (L.dp * L.cp).astype(np.float64)
        edp = dpcp / L.ep  # expert-data-parallel size
        z = L.zero

        act = self.layer_activation_bytes(L)
        sp = L.sp.astype(bool)
        rep = np.where(sp, act["replicated"] / t, act["replicated"])
        core_keep = np.where(L.rc == 0, act["core"] / t, 0.0)  # selective and full drop the 5as^2b term
        per_dense = rep + act["dense_split"] / t + core_keep
        per_moe = rep + act["moe_split"] / t + core_keep
        full_dense = rep + act["dense_split"] / t + act["core"] / t
        full_moe = rep + act["moe_split"] / t + act["core"] / t
        T = L.mbs * m.seq_length / L.cp
        # full recompute keeps only each layer's input, 2sbh (Korthikanti et al. 2022 §5, /t with SP)
        checkpoint = np.where(sp, 2.0 * T * m.hidden_size / t, 2.0 * T * m.hidden_size) * (self.act_bytes / 2)
        per_dense = np.where(L.rc == 2, checkpoint, per_dense)
        per_moe = np.where(L.rc == 2, checkpoint, per_moe)
        # one micro-batch through the average layer (a stage's MoE layers are its share of the model's)
        per_layer = (self.n_dense * per_dense + self.n_moe * per_moe) / m.num_layers
        micro = self.micro_batches(L)
        # Korthikanti et al. 2022 eq. 5: the first stage holds p micro-batches of its layers (stage i of
        # 1F1B: p - i); interleaving multiplies by (1 + (p-1)/(p v))
        interleave = np.where(v > 1, 1.0 + (p - 1) / (p * v), 1.0)
        in_flight = {
            "first": np.minimum(p, micro) * interleave,
            "middle": np.minimum(p - 1, micro) * interleave,
            # last stage: one micro-batch in flight
            "last": 1.0,
        }
        # recomputing a layer in backward materialises its full activations once (Korthikanti §5)
        working = np.where(L.rc == 2, np.maximum(full_dense, np.where(self.n_moe > 0, full_moe, 0.0)), 0.0)
        working = working + np.where(L.rc == 1, act["core"] / t, 0.0)
        # the last stage's fp32 logits and their gradient for the loss (Korthikanti et al. 2022 §4.3: 4sbv/t
        # for the output layer and cross entropy)
        logits = 4.0 * T * m.vocab_size / t * 2
        framework = self.eff.framework_overhead_GiB * GiB
        stages = self.stage_layers(L)
        by_stage = self.parameters_by_stage(L)

        def on_stage(kind: str) -> dict[str, np.ndarray]:
            dense, expert = by_stage[kind]["dense"], by_stage[kind]["expert"]
            # ZeRO (Rajbhandari et al. 2020 §5): stage 1 shards optimizer states, 2 also gradients, 3 also
            # params
            w = (
                np.where(z >= 3, dense / dpcp, dense) + np.where(z >= 3, expert / edp, expert)
            ) * self.weight_bytes
            g = (
                np.where(z >= 2, dense / dpcp, dense) + np.where(z >= 2, expert / edp, expert)
            ) * self.grad_bytes
            o = (
                np.where(z >= 1, dense / dpcp, dense) + np.where(z >= 1, expert / edp, expert)
            ) * self.optimizer_bytes
            activations = per_layer * stages[kind] * in_flight[kind] + working
            if kind == "last":
                activations = activations + logits
            # ZeRO-3 materialises gathered parameters, and the unsharded gradients waiting for their
            # reduce-scatter, per the framework (hardware.FrameworkCollectives): FSDP the block being
            # computed and the prefetched next one (limit_all_gathers / FSDP2 prefetch) and one block's
            # gradients; DeepSpeed at most max_live_parameters (never less than one whole matrix) and one
            # reduce bucket. The local shard is already counted, and never more than the whole stage.
            stage_params = dense + expert
            layer_params = stage_params / np.maximum(stages[kind], 1.0)
            c = self.collectives
            if c.zero3_unit == "bucket" and c.max_live_parameters > 0:
                live = np.maximum(np.minimum(c.max_live_parameters, stage_params), self.largest_matrix(L))
                grads_live = np.minimum(c.reduce_bucket_parameters or layer_params, stage_params)
            else:
                live, grads_live = 2.0 * layer_params, layer_params
            unsharded = 1.0 - 1.0 / dpcp
            gathered = np.minimum(live, stage_params) * unsharded * self.weight_bytes
            w = w + np.where(z >= 3, gathered, 0.0)
            g = g + np.where(z >= 3, np.minimum(grads_live, stage_params) * unsharded * self.grad_bytes, 0.0)
            # the model state is an array over the base rows and ZeRO stages, the activations over the base
            # rows, recompute modes and SP: one full-grid sum per stage
            total = (w + g + o + framework) + activations
            return {"params": w, "grads": g, "optimizer": o, "activations": activations, "total": total}

        kinds = ["first", "last"]
        # a middle stage with no more layers than the first holds no more of anything (no vocabulary matrix,
        # fewer micro-batches in flight): cost it only where some layout's middle stages are heavier
        if np.any(stages["middle"] > stages["first"]):
            kinds.append("middle")
        per_stage = [on_stage(kind) for kind in kinds]
        if not parts:
            total = per_stage[0]["total"]
            for other in per_stage[1:]:
                total = np.maximum(total, other["total"])
            return {"total": total}
        out = per_stage[0]
        for other in per_stage[1:]:
            more = other["total"] > out["total"]
            out = {k: np.where(more, other[k], out[k]) for k in out}
        return out
