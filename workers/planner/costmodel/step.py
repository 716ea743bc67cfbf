"""The cost of one training step of each layout (:class:`CostModel`): the compute, memory and
communication terms (:class:`~.compute.ComputeCosts`, :class:`~.memory.MemoryCosts`,
:class:`~.communication.CommunicationCosts`) composed into step time and throughput."""

from __future__ import annotations

import numpy as np

from ..hardware import Efficiency, Framework, collectives_for, framework_for
from ..moe import MeasuredExpertLoad, expected_imbalance
from ..specs import ClusterSpec, ModelSpec, TrainingConfig
from .communication import CommunicationCosts
from .compute import ComputeCosts
from .layouts import GiB, Layouts
from .memory import MemoryCosts


class CostModel(ComputeCosts, MemoryCosts, CommunicationCosts):
    """Cost of layouts of one (model, cluster, training) triple; see the package docstring
    (``workers.planner.costmodel``). The terms come from its parts: :class:`~.compute.ComputeCosts`,
    :class:`~.memory.MemoryCosts` and :class:`~.communication.CommunicationCosts` (one method per
    parallel dimension); :meth:`timing` composes them."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        training: TrainingConfig,
        eff: Efficiency,
        order: str = "tp-cp-ep-dp-pp",
        framework: Framework | None = None,
        expert_load: MeasuredExpertLoad | None = None,
    ):
        self.model, self.cluster, self.training, self.eff, self.order = model, cluster, training, eff, order
        # the runtime's host-side costs (hardware.Framework): measured by `cann-train calibrate` for this
        # machine's cpu, none for the shipped accelerator profiles
        self.fw = framework if framework is not None else framework_for(cluster.device.name)
        # how the training framework moves ZeRO-3 parameters (hardware.FrameworkCollectives)
        self.collectives = collectives_for(training.framework)
        dev = cluster.device
        dtype = training.dtype
        peak = dev.peak_tflops.get(dtype) or dev.peak_tflops.get("bf16") or max(dev.peak_tflops.values())
        self.peak_flops = float(peak) * 1e12
        self.mem_bw = dev.memory_bandwidth_GBps * 1e9 * eff.memory_bandwidth_efficiency
        self.memory_bytes = dev.memory_GiB * GiB
        # 16-bit activations for bf16/fp16/fp8 (fp8 GEMMs keep bf16 activations), fp32 otherwise
        self.act_bytes = 4.0 if dtype == "fp32" else 2.0
        self.weight_bytes = 4.0 if dtype == "fp32" else 2.0
        self.grad_bytes = self.weight_bytes
        # optimizer state bytes per parameter: mixed precision keeps an fp32 master copy
        # (Rajbhandari et al. 2020, ZeRO §3: K = 12 for mixed-precision Adam)
        master = 0.0 if dtype == "fp32" else 4.0
        moments = 8.0 if training.optimizer in ("adam", "adamw") else 4.0
        self.optimizer_bytes = master + moments
        m = model
        self.mats = 3 if m.gated else 2
        self.params = m.parameter_count()
        self.n_moe = m.num_moe_layers
        self.n_dense = m.num_layers - self.n_moe
        # measured per-expert load of past runs (moe.MeasuredExpertLoad): replaces uniform routing in
        # moe_load; ignored when the model document gives load_imbalance, or when its expert count differs
        moe = m.moe
        fits = moe is not None and expert_load is not None and len(expert_load.load) == moe.num_experts
        self.expert_load = expert_load if fits else None

    def moe_load(self, L: Layouts) -> np.ndarray:
        """Busiest expert-parallel rank's routed tokens / the mean, per layout (1.0 for a dense model): the
        model document's ``load_imbalance`` when it gives one, else
        :func:`~workers.planner.moe.expected_imbalance` of the layout's ``ep`` and tokens per micro-batch
        (measured routing when ``expert_load`` was given), capped by the capacity factor either way."""
        moe = self.model.moe
        if moe is None:
            return np.ones(np.broadcast_shapes(L.ep.shape, L.mbs.shape, L.cp.shape))
        if moe.load_imbalance is not None:
            imb = moe.load_imbalance
            # tokens above capacity are dropped, so the busiest rank never gets more than cf x its share
            given = min(imb, moe.capacity_factor) if moe.capacity_factor else imb
            return np.full(np.broadcast_shapes(L.ep.shape, L.mbs.shape, L.cp.shape), float(given))
        return expected_imbalance(
            L.ep,
            moe.num_experts,
            moe.top_k,
            self.tokens_per_micro_batch(L),
            measured_load=self.expert_load.load if self.expert_load is not None else None,
            capacity_factor=moe.capacity_factor,
        )

    def moe_imbalance_origin(self) -> dict[str, str] | None:
        """How :meth:`moe_load` was found (``method``, ``source``) for a plan's ``moe_imbalance``; None for
        a dense model."""
        moe = self.model.moe
        if moe is None:
            return None
        cap = ""
        if moe.capacity_factor:
            cap = f"; at most capacity_factor {moe.capacity_factor:g} (tokens above it are dropped)"
        if moe.load_imbalance is not None:
            ignored = ""
            if self.expert_load is not None:
                ignored = f"; it overrides the expert load measured in {self.expert_load.runs} runs"
            return {
                "method": "given in the model document",
                "source": f"model.moe.load_imbalance = {moe.load_imbalance:g} (an explicit figure overrides "
                f"the derived one{ignored}){cap}",
            }
        if self.expert_load is not None:
            runs = self.expert_load.runs
            return {
                "method": f"measured in {runs} run{'s' if runs != 1 else ''}",
                "source": f"{self.expert_load.source or 'measured expert_load'}: mean share per expert, "
                f"contiguous experts per EP rank, plus sampling noise of the micro-batch's tokens{cap}",
            }
        return {
            "method": "uniform routing",
            "source": "expected busiest EP rank when every expert is equally likely: Gaussian approximation "
            f"of the multinomial token counts over the EP group (workers/planner/moe.py){cap}",
        }

    # ---------------------------------------------------------------- time
    def timing(self, L: Layouts, memory: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Step time and its parts for each layout (seconds), plus communicated bytes per device.

        Composes the per-dimension terms of its parts: a micro-batch through one stage costs its ``compute_times``
        plus the communication on its critical path (``tp_comm``, the exposed part of ``cp_comm``,
        ``ep_comm``); a step is ``micro`` of those, the pipeline bubble and sends (``pp_comm``), the exposed
        gradient reduction (``dp_comm``) and the ``optimizer_time``."""
        p = L.pp.astype(np.float64)
        micro = self.micro_batches(L)
        g = self._layer_gemm_times(L)
        links = self.links(L)
        compute = self.compute_times(L, g)
        tp = self.tp_comm(L, links["tp"])
        fw = self.framework_times(L, links)
        for part in ("dense_layer", "moe_layer", "logits", "embedding"):
            compute[part] = compute[part] * fw["compute_scale"]
        compute["dense_layer"] = compute["dense_layer"] + fw["layer"]
        compute["moe_layer"] = compute["moe_layer"] + fw["moe_layer"]
        compute["logits"] = compute["logits"] + fw["edge"]
        # the measured tp (ep) passes hold their collectives' start-up: charge only their bandwidth share again
        tp["time"] = np.maximum(tp["time"] - fw["tp_latency"], 0.0)
        cp = self.cp_comm(L, links["cp"], g["core"])
        ep = self.ep_comm(L, links["ep"])
        ep["time"] = np.maximum(ep["time"] - fw["ep_latency"], 0.0)  # as tp: the measured ep pass holds it

        # one micro-batch through one layer: its compute plus the communication on its critical path
        dense_layer = compute["dense_layer"] + tp["time"] + cp["exposed"]
        moe_layer = compute["moe_layer"] + tp["time"] + cp["exposed"] + ep["time"]
        # ... through a stage: its share of the layers, the embedding on the first, the LM head and loss on
        # the last (both on a single stage); the pipeline runs at the pace of the slowest stage, in the
        # steady state and in the bubble (Narayanan et al. SC'21 §2.2 with the maximum stage time)
        n = self.model.num_layers
        all_layers = self.n_dense * dense_layer + self.n_moe * moe_layer
        stages = self.stage_layers(L)
        single = p == 1
        edge_first = np.where(single, compute["embedding"] + compute["logits"], compute["embedding"])
        edge_last = np.where(single, compute["embedding"] + compute["logits"], compute["logits"])
        first = all_layers * (stages["first"] / n) + edge_first
        last = all_layers * (stages["last"] / n) + edge_last
        middle = all_layers * (stages["middle"] / n)
        stage_micro = np.maximum(np.maximum(first, last), middle)
        # layers of the slowest stage: the communication below is theirs
        layers_here = np.where(
            stage_micro == first,
            stages["first"],
            np.where(stage_micro == last, stages["last"], stages["middle"]),
        )
        moe_here = layers_here * (self.n_moe / n)
        compute_micro = stage_micro - layers_here * (tp["time"] + cp["exposed"]) - moe_here * ep["time"]
        ideal = micro * stage_micro
        pp = self.pp_comm(L, links["pp"], micro, ideal)
        params = self.stage_parameters(L)
        dp = self.dp_comm(
            L, links["dp"], links["edp"], micro, compute_micro, params, layers_here, fw["dp_in_host"]
        )
        fw_step = layers_here * fw["step_layer"] + fw["step_fixed"]
        opt_traffic = self.optimizer_time(L, params)
        opt_time = opt_traffic + fw_step

        step = ideal + pp["bubble"] + pp["time"] + dp["exposed"] + opt_time
        tp_total = micro * layers_here * tp["time"]
        cp_total = micro * layers_here * cp["time"]
        cp_exposed = micro * layers_here * cp["exposed"]
        ep_total = micro * moe_here * ep["time"]
        exposed = tp_total + cp_exposed + ep_total + pp["time"] + dp["exposed"]
        volume = (
            micro * layers_here * (tp["volume"] + cp["volume"])
            + micro * moe_here * ep["volume"]
            + pp["volume"]
            + dp["volume"]
        )
        return {
            "step": step,
            "inline_comm": ideal - micro * compute_micro,
            "dp_exposed": dp["exposed"],
            "ideal": ideal,
            "bubble": pp["bubble"],
            "compute": micro * compute_micro,
            "optimizer": opt_time,
            "optimizer_traffic": opt_traffic,  # optimizer less the runtime's host-side step work
            "framework": micro
            * (layers_here * (fw["layer"] + (fw["moe_layer"] - fw["layer"]) * self.n_moe / n) + fw["edge"])
            + fw_step,
            "micro": micro,
            "tp": tp_total,
            "pp": pp["time"],
            "dp": dp["time"],
            "ep": ep_total,
            "cp": cp_total,
            "exposed": exposed,
            "volume": volume,
            # the bytes per device of each group kind (their sum is volume): cross_switch_bytes splits them
            "volume_tp": micro * layers_here * tp["volume"],
            "volume_cp": micro * layers_here * cp["volume"],
            "volume_ep": micro * moe_here * ep["volume"],
            "volume_pp": pp["volume"],
            "volume_dp": dp["volume"] - dp["volume_expert"],
            "volume_edp": dp["volume_expert"],
        }

    def micro_batches(self, L: Layouts) -> np.ndarray:
        """Micro-batches per step on each pipeline: global batch / (dp x micro-batch size), as floats."""
        return np.floor_divide(self.training.global_batch_size, L.dp * L.mbs).astype(np.float64)

    def tokens_per_micro_batch(self, L: Layouts) -> np.ndarray:
        """``T``: tokens of one micro-batch on one context-parallel rank (``mbs * seq_length / cp``)."""
        return L.mbs.astype(np.float64) * (self.model.seq_length / L.cp.astype(np.float64))

    def throughput(self, L: Layouts, timing: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """tokens/s, model and hardware TFLOP/s per device and MFU from a ``timing`` result."""
        n_dev = float(self.cluster.num_devices)
        gbs, s = self.training.global_batch_size, self.model.seq_length
        f = self.forward_flops_per_sequence()
        # model FLOPs: forward + backward (3x forward), no recompute (Chowdhery et al. 2022, App. B MFU)
        model_flops = 3.0 * gbs * (f["layers"] + f["logits"])
        # hardware FLOPs add a forward of the layers (full) or of the attention core (selective)
        extra = np.where(L.rc == 2, f["layers"], np.where(L.rc == 1, f["core"], 0.0)) * gbs
        step = timing["step"]
        return {
            "tokens_per_s": gbs * s / step,
            "model_tflops": model_flops / n_dev / step / 1e12,
            "hardware_tflops": (model_flops + extra) / n_dev / step / 1e12,
            "mfu": model_flops / n_dev / step / self.peak_flops,
        }
