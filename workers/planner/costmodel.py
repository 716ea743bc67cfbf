"""The analytical cost model: FLOPs, memory and communication of a parallel layout, vectorised.

Every function takes a :class:`Layouts` (one numpy array per strategy field, one element per candidate)
so that ``evaluate`` (one layout) and ``search`` (a million) run the same code. Only numpy is imported.

Units: bytes, seconds, FLOPs. ``T`` is tokens per micro-batch on one context-parallel rank
(``micro_batch_size * seq_length / cp``).

Pipeline stages may be uneven (``strategy.layers_per_stage``). Each layout's split is summarised by the
layers on its first stage, on its heaviest middle stage and on its last stage
(:meth:`CostModel.stage_layers`); each of the three is charged its own layers, the first the embedding
and the last the LM head, logits and loss; step time follows the slowest of them and memory the largest.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .hardware import Efficiency, Framework, collectives_for, framework_for
from .moe import MeasuredExpertLoad, expected_imbalance
from .specs import ClusterSpec, ModelSpec, Strategy, TrainingConfig, stage_split_summary

GiB = float(1 << 30)
RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}


@dataclass
class Layouts:
    """Candidate strategies as parallel numpy arrays (recompute coded 0 none, 1 selective, 2 full)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    cp: np.ndarray
    vpp: np.ndarray
    mbs: np.ndarray
    rc: np.ndarray
    zero: np.ndarray
    sp: np.ndarray
    first_layers: np.ndarray | None = None
    """Layers on the first pipeline stage. None, with the two below: the balanced split of each ``pp``
    (:func:`~workers.planner.specs.balanced_stage_split`), which the cost model works out itself."""
    mid_layers: np.ndarray | None = None
    """Most layers on a stage between the first and the last (0 when pp <= 2)."""
    last_layers: np.ndarray | None = None
    """Layers on the last pipeline stage (the first stage itself when pp == 1)."""

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        """``(field name, array)`` of the fields this instance holds (a stage split left out is skipped)."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    @property
    def shape(self) -> tuple[int, ...]:
        """Broadcast shape of the fields: (n,) for a flat list, (rows, extras) for a factored grid."""
        return np.broadcast_shapes(*(a.shape for _name, a in self.arrays()))

    def __len__(self) -> int:
        return int(np.prod(self.shape))

    @classmethod
    def from_strategies(cls, strategies: list[Strategy], num_layers: int | None = None) -> Layouts:
        """The strategies as arrays. Their stage splits are carried when any lists ``layers_per_stage``
        (the others then take :meth:`Strategy.stage_layers` of ``num_layers``, which is required);
        otherwise left to the cost model (the balanced split of each ``pp``)."""

        def col(name, conv=int):
            return np.array([conv(getattr(s, name)) for s in strategies], dtype=np.int64)

        stages: dict[str, np.ndarray] = {}
        if any(s.layers_per_stage is not None for s in strategies):
            if num_layers is None and any(s.layers_per_stage is None for s in strategies):
                raise ValueError("num_layers is needed to split the strategies without layers_per_stage")
            rows = [stage_split_summary(s.layers_per_stage or s.stage_layers(num_layers)) for s in strategies]
            for j, name in enumerate(("first_layers", "mid_layers", "last_layers")):
                stages[name] = np.array([r[j] for r in rows], dtype=np.int64)
        return cls(
            tp=col("tp"),
            pp=col("pp"),
            dp=col("dp"),
            ep=col("ep"),
            cp=col("cp"),
            vpp=col("vpp"),
            mbs=col("micro_batch_size"),
            rc=np.array([RECOMPUTE_CODES[s.recompute] for s in strategies]),
            zero=col("zero_stage"),
            sp=col("sequence_parallel", lambda v: 1 if v else 0),
            **stages,
        )

    @classmethod
    def grid(cls, base: np.ndarray, rcs, zeros, sps) -> Layouts:
        """A factored grid: ``base`` rows (tp, cp, pp, dp, ep, vpp, mbs[, first, mid, last stage layers])
        times the recompute, ZeRO and sequence-parallel options, as arrays of shape (rows,1,1,1),
        (1,R,1,1), (1,1,Z,1), (1,1,1,S) that numpy broadcasts: a term is computed once per distinct value of
        the fields it depends on."""
        b = [base[:, i].reshape(-1, 1, 1, 1) for i in range(base.shape[1])]
        stages = {}
        if len(b) >= 10:
            stages = dict(first_layers=b[7], mid_layers=b[8], last_layers=b[9])
        return cls(
            tp=b[0],
            cp=b[1],
            pp=b[2],
            dp=b[3],
            ep=b[4],
            vpp=b[5],
            mbs=b[6],
            rc=np.asarray(rcs, dtype=np.int64).reshape(1, -1, 1, 1),
            zero=np.asarray(zeros, dtype=np.int64).reshape(1, 1, -1, 1),
            sp=np.asarray(sps, dtype=np.int64).reshape(1, 1, 1, -1),
            **stages,
        )

    def take(self, idx) -> Layouts:
        """Rows of a flat list."""
        return Layouts(**{name: a[idx] for name, a in self.arrays()})

    def flat(self, index: tuple[np.ndarray, ...] | None = None) -> Layouts:
        """A flat list of the layouts at ``index`` (a tuple from ``np.nonzero`` on the grid shape)."""
        shape = self.shape
        out = {}
        for name, a in self.arrays():
            arr = np.broadcast_to(a, shape)
            out[name] = arr[index] if index is not None else arr.reshape(-1)
        return Layouts(**out)

    def strategy(self, i: int, order: str = "tp-cp-ep-dp-pp") -> Strategy:
        """The i-th layout of a flat list as a :class:`Strategy` (without ``layers_per_stage``: the arrays
        hold only a summary of the split; ``search`` writes the split out)."""
        return Strategy(
            tp=int(self.tp[i]),
            pp=int(self.pp[i]),
            dp=int(self.dp[i]),
            ep=int(self.ep[i]),
            cp=int(self.cp[i]),
            vpp=int(self.vpp[i]),
            micro_batch_size=int(self.mbs[i]),
            recompute=RECOMPUTE_NAMES[int(self.rc[i])],
            zero_stage=int(self.zero[i]),
            sequence_parallel=bool(self.sp[i]),
            order=order,
        )


# --------------------------------------------------------------------------------------------------
# Placement: which links a parallel group crosses
# --------------------------------------------------------------------------------------------------


@dataclass
class GroupLinks:
    """Per candidate: size of a group, members per node, and the bandwidth/latency it sees."""

    size: np.ndarray
    per_node: np.ndarray  # members of the group inside one node
    inter: np.ndarray  # bool: crosses nodes
    bw_intra: np.ndarray  # achieved bytes/s per device inside the node
    bw_inter: np.ndarray  # achieved bytes/s per device across nodes, after oversubscription
    lat_intra: float
    lat_inter: float


def _block(layouts: Layouts, stride: dict[str, np.ndarray], order: str):
    """The cp x dp block of a stage in ``order``: ``(inner size, inner stride, outer stride)``, the inner
    being the one of cp / dp placed first. The block's member j sits at ``(j % I) * s_in + (j // I) *
    s_out``; an outer dimension of size 1 is taken as contiguous (its stride never matters)."""
    dense = [p for p in order.split("-") if p != "ep"]
    inner, outer = ("cp", "dp") if dense.index("cp") < dense.index("dp") else ("dp", "cp")
    sizes = {"cp": layouts.cp, "dp": layouts.dp}
    size_in = sizes[inner].astype(np.float64)
    s_in = stride[inner].astype(np.float64)
    s_out = np.where(sizes[outer] == 1, size_in * s_in, stride[outer]).astype(np.float64)
    return size_in, s_in, s_out


def group_strides(layouts: Layouts, order: str) -> dict[str, np.ndarray]:
    """Rank stride of each group kind for a placement ``order`` (innermost first), e.g. tp-cp-ep-dp-pp.

    Dense groups ignore ``ep``; the EP group takes ``ep`` consecutive members of the combined cp*dp
    dimension starting at its innermost part (Megatron-Core RankGenerator, expert decomposition), and
    the expert-data-parallel group the remaining ``cp*dp/ep`` members (every ``ep``-th). A group that
    straddles both parts of a block that is not contiguous (another dimension placed between cp and dp)
    gets the stride of the same span: ``span / size`` (``ep`` members past the inner part span
    ``ep / I`` outer steps, so stride ``s_out / I``; the EDP group ``s_out * ep / I``), which is what
    ``group_links`` needs to tell whether the group leaves a node and how many members share one. The
    runtime places ranks exactly so (``workers/training/parallel/dims.py``, ``tests/unit/test_rank_order.py``).
    """
    dense = [p for p in order.split("-") if p != "ep"]
    sizes = {"tp": layouts.tp, "cp": layouts.cp, "dp": layouts.dp, "pp": layouts.pp}
    stride = {}
    acc = np.ones_like(layouts.tp)
    for name in dense:
        stride[name] = acc
        acc = acc * sizes[name]
    size_in, s_in, s_out = _block(layouts, stride, order)
    ep = layouts.ep.astype(np.float64)
    stride["ep"] = np.where(ep <= size_in, s_in, np.maximum(s_in, s_out / size_in))
    stride["edp"] = np.maximum(ep * s_in, s_out * ep / size_in)
    return stride


def gradient_group_stride(layouts: Layouts, strides: dict[str, np.ndarray], order: str) -> np.ndarray:
    """Stride of the gradient (dp x cp) group: the whole cp x dp block, ``s_out / I`` (the inner one's
    stride when cp and dp are adjacent in the order; the span-preserving stride when another dimension
    sits between them); with cp = 1 it is the dp group itself (and vice versa)."""
    size_in, s_in, s_out = _block(layouts, strides, order)
    return np.maximum(s_in, s_out / size_in)


DEFAULT_ORDER = "tp-cp-ep-dp-pp"
"""The topology-blind placement (Megatron-Core's default ``order``): the runtime places ranks so."""

# Placements the search tries for its best layouts (innermost first): which of tp / cp / dp is innermost,
# whether pipeline stages sit inside the data-parallel replicas, and where the EP group sits. Under
# ``group_strides`` the EP group is carved from the cp x dp block (Megatron-Core RankGenerator), so orders
# that differ only in the position of ``ep`` cost the same and the search times one of each.
CANDIDATE_ORDERS = (
    DEFAULT_ORDER,
    "tp-ep-cp-dp-pp",
    "tp-cp-dp-ep-pp",
    "tp-dp-cp-ep-pp",
    "cp-tp-ep-dp-pp",
    "tp-cp-ep-pp-dp",
)


def dense_order(order: str) -> str:
    """The placement of the dense dimensions (``order`` without ``ep``): two orders with the same one
    place every group alike (see :func:`group_strides`)."""
    return "-".join(p for p in order.split("-") if p != "ep")


def cross_tier_fraction(
    cluster: ClusterSpec, size: np.ndarray, stride: np.ndarray, tier_nodes: int, pattern: str
) -> np.ndarray:
    """Share of the bytes a group of ``size`` ranks spaced ``stride`` apart communicates per device that
    leaves a switch holding ``tier_nodes`` nodes, its members ordered by rank (groups aligned to switches).

    ``ring`` (ring all-reduce / reduce-scatter / all-gather, the cp ring): a ring over ``k`` switches
    crosses switch boundaries on ``k`` of its ``size`` edges; ``all_to_all`` (EP dispatch): each rank
    sends equal shares to the others, ``(size - m) / (size - 1)`` of them to the other switches (``m``
    members under one switch); ``p2p`` (pipeline sends): ``k - 1`` of the ``size - 1`` stage boundaries."""
    domain = cluster.devices_per_node * tier_nodes  # ranks under one switch
    size = np.asarray(size, dtype=np.int64)
    stride = np.maximum(np.asarray(stride, dtype=np.int64), 1)
    members = np.where(size * stride <= domain, size, np.maximum(1, domain // stride))
    members = np.minimum(members, size)
    switches = np.ceil(size / members)
    g = size.astype(np.float64)
    if pattern == "ring":
        return np.where(switches > 1, switches / g, 0.0)
    if pattern == "all_to_all":
        return np.where(g > 1, (g - members) / np.maximum(g - 1, 1), 0.0)
    return np.where(g > 1, (switches - 1) / np.maximum(g - 1, 1), 0.0)


def block_per_node(n: int, c_in, s_in, c_out, s_out) -> np.ndarray:
    """Members per node of a two-level group: ``c_in`` members ``s_in`` apart, repeated ``c_out`` times
    ``s_out`` apart (a group carved from a cp x dp block with another dimension between them); ranks fill
    nodes of ``n`` in order, groups aligned."""
    c_in, s_in = np.asarray(c_in, dtype=np.int64), np.maximum(np.asarray(s_in, dtype=np.int64), 1)
    c_out, s_out = np.asarray(c_out, dtype=np.int64), np.maximum(np.asarray(s_out, dtype=np.int64), 1)
    fits = c_in * s_in <= n
    inner = np.where(fits, c_in, np.maximum(1, n // s_in))
    outer = np.where(fits, np.minimum(c_out, np.maximum(1, n // s_out)), 1)
    return np.minimum(inner * outer, c_in * c_out)


def group_links(
    cluster: ClusterSpec, eff: Efficiency, size: np.ndarray, stride: np.ndarray, per_node=None
) -> GroupLinks:
    """Links crossed by groups of ``size`` ranks spaced ``stride`` apart, ranks filling nodes in order;
    ``per_node`` (from :func:`block_per_node`) where the members cluster unevenly."""
    n = cluster.devices_per_node
    size = np.asarray(size, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    span = size * stride  # ranks from the first member to one past the last
    inter = span > n
    spread = np.maximum(1, n // np.maximum(stride, 1)) if per_node is None else per_node
    per_node = np.minimum(np.where(inter, spread, size), size)
    span_nodes = np.ceil(span / n)
    # switch tiers: traffic that leaves a tier-i domain is limited by the product of the
    # oversubscriptions below it (fat-tree taper, Leiserson 1985): a leaf with s:1 oversubscription has
    # 1/s of its nodes' NIC bandwidth as uplinks, so when every node sends at once (the parallel rings of
    # one collective do) each node gets 1/s of its NIC upward, and 1/(s1*s2) past the next tier
    factor = np.ones(span.shape, dtype=np.float64)
    taper = 1.0
    for tier in cluster.tiers:
        factor = np.where(span_nodes > tier.nodes, taper * tier.oversubscription, factor)
        taper *= tier.oversubscription
    bw_inter = cluster.inter_node.bandwidth_GBps * 1e9 * eff.collective_efficiency_inter / factor
    bw_intra = np.full(span.shape, cluster.intra_node.bandwidth_GBps * 1e9 * eff.collective_efficiency_intra)
    return GroupLinks(
        size,
        per_node,
        inter,
        bw_intra,
        bw_inter,
        cluster.intra_node.latency_us * 1e-6,
        cluster.inter_node.latency_us * 1e-6,
    )


# --------------------------------------------------------------------------------------------------
# Collectives (alpha-beta model)
# --------------------------------------------------------------------------------------------------


def all_reduce_time(g: GroupLinks, nbytes) -> np.ndarray:
    """All-reduce of ``nbytes`` per rank: best of flat ring, hierarchical and double-binary tree."""
    p = g.size.astype(np.float64)
    k = g.per_node.astype(np.float64)
    nodes = np.maximum(1.0, p / k)
    lat = np.where(g.inter, g.lat_inter, g.lat_intra)
    # ring: 2(p-1) alpha + 2(p-1)/p n/B (Thakur, Rabenseifner & Gropp 2005, eq. for ring allreduce);
    # across nodes the k rings of a node use k NICs, so the inter-node edges carry n/k each
    ring_bw = np.where(g.inter, np.minimum(g.bw_intra, k * g.bw_inter), g.bw_intra)
    ring = 2 * (p - 1) * lat + 2 * (p - 1) / p * nbytes / ring_bw
    # hierarchical: intra reduce-scatter, inter all-reduce on n/k, intra all-gather (Jia et al. 2018, 2D ring)
    hier = (
        2 * (k - 1) * g.lat_intra
        + 2 * (k - 1) / k * nbytes / g.bw_intra
        + 2 * (nodes - 1) * g.lat_inter
        + 2 * (nodes - 1) / nodes * (nbytes / k) / g.bw_inter
    )
    # double binary tree: 2 log2(p) alpha + 2 n / B at full pipelining (Sanders et al. 2009)
    tree = 2 * np.log2(np.maximum(p, 2)) * lat + 2 * nbytes / ring_bw
    best = np.minimum(ring, np.where(g.inter, np.minimum(hier, tree), tree))
    return np.where(p > 1, best, 0.0)


def reduce_scatter_time(g: GroupLinks, nbytes) -> np.ndarray:
    """Reduce-scatter (or all-gather) of an ``nbytes`` buffer: half an all-reduce (Thakur et al. 2005)."""
    return 0.5 * all_reduce_time(g, nbytes)


def shard_collective_time(g: GroupLinks, nbytes, calls=1.0, per_device_link: bool = False) -> np.ndarray:
    """All-gather (or reduce-scatter) of a buffer that is ``nbytes`` per rank once gathered, issued as
    ``calls`` collectives (one per FSDP block or DeepSpeed bucket). NCCL runs these as rings only (no tree:
    NCCL documentation, collective operations): ``p - 1`` latency steps per call and ``(p-1)/p`` of the
    buffer through the ring, whose node-boundary edges share the node's ``k`` NICs (Thakur et al. 2005,
    ring all-gather). ``per_device_link`` (:class:`~.hardware.FrameworkCollectives`): instead each rank's
    off-node share crosses its own NIC while its on-node share moves over the node's links."""
    p = g.size.astype(np.float64)
    k = g.per_node.astype(np.float64)
    lat = np.where(g.inter, g.lat_inter, g.lat_intra)
    ring_bw = np.where(g.inter, np.minimum(g.bw_intra, k * g.bw_inter), g.bw_intra)
    transfer = (p - 1) / np.maximum(p, 1.0) * nbytes / ring_bw
    if per_device_link:
        own = np.maximum((k - 1) / p * nbytes / g.bw_intra, (p - k) / p * nbytes / g.bw_inter)
        transfer = np.where(g.inter, own, transfer)
    return np.where(p > 1, calls * (p - 1) * lat + transfer, 0.0)


def all_to_all_time(g: GroupLinks, nbytes) -> np.ndarray:
    """All-to-all where each rank holds ``nbytes`` destined evenly to all ranks: (p-1) alpha, with the
    intra-node and inter-node shares moving concurrently (pairwise exchange, Thakur et al. 2005)."""
    p = g.size.astype(np.float64)
    k = g.per_node.astype(np.float64)
    intra = (k - 1) / p * nbytes / g.bw_intra
    inter = (p - k) / p * nbytes / g.bw_inter
    lat = np.where(g.inter, g.lat_inter, g.lat_intra)
    return np.where(p > 1, (p - 1) * lat + np.maximum(intra, inter), 0.0)


def p2p_time(g: GroupLinks, nbytes) -> np.ndarray:
    """Point-to-point send of ``nbytes`` between neighbours of the group: alpha + n / B."""
    lat = np.where(g.inter, g.lat_inter, g.lat_intra)
    bw = np.where(g.inter, g.bw_inter, g.bw_intra)
    return np.where(g.size > 1, lat + nbytes / bw, 0.0)


# --------------------------------------------------------------------------------------------------
# Compute
# --------------------------------------------------------------------------------------------------


def gemm_efficiency(eff: Efficiency, m, n, k) -> np.ndarray:
    """Achieved / peak for an (m x k) @ (k x n) GEMM: a saturating curve in arithmetic intensity
    I = mnk / (mk + kn + mn) (roofline, Williams et al. 2009; smooth blend calibrated per device)."""
    intensity = 1.0 / (1.0 / m + 1.0 / n + 1.0 / k)
    return eff.gemm_max * intensity / (intensity + eff.gemm_half_intensity)


def gemm_time(eff: Efficiency, peak_flops: float, count, m, n, k) -> np.ndarray:
    """Seconds for ``count`` GEMMs of shape (m, n, k) at 2mnk FLOPs each."""
    m = np.maximum(m, 1.0)
    return count * 2.0 * m * n * k / (peak_flops * gemm_efficiency(eff, m, n, k))


def _share(part, whole) -> np.ndarray:
    """``part / whole``, 0 where ``whole`` is 0."""
    whole = np.asarray(whole, dtype=np.float64)
    return np.divide(part, whole, out=np.zeros(np.broadcast(part, whole).shape), where=whole > 0)


def _recompute_flags(L: Layouts) -> tuple[np.ndarray, np.ndarray]:
    """``(full, selective)`` recompute of each layout as 0.0 / 1.0 floats."""
    return (L.rc == 2).astype(np.float64), (L.rc == 1).astype(np.float64)


def _layer_passes(L: Layouts) -> np.ndarray:
    """Forward-pass equivalents a layer runs per micro-batch."""
    full, _sel = _recompute_flags(L)
    return 3.0 + full  # forward, backward (2x forward, Narayanan et al. SC'21 §3.1) and recompute


class CostModel:
    """Cost of layouts of one (model, cluster, training) triple; see the module docstring."""

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
        attn_split = 2 * T * h + 4 * T * kvd + 2 * T * h
        f = m.ffn_hidden_size
        # MLP: activation input and output, 16sbh for gelu with f = 4h (eq. 1); gated: two inputs + output
        mlp_split = (6.0 if self.mats == 3 else 4.0) * T * f
        # attention core 5as^2b: softmax 2, dropout mask 1, dropout output 2 (eq. 1); CP keeps s/cp queries
        core = 0.0 if self.training.flash_attention else 5.0 * a * s_loc * s * L.mbs
        out = {
            "replicated": replicated * scale,
            "dense_split": (attn_split + mlp_split) * scale,
            "core": core * scale,
        }
        if m.moe is not None:
            fe = m.moe.expert_ffn_hidden_size
            routed = T * m.moe.top_k * self.moe_load(L)
            expert_act = routed * (2 * h + (6.0 if self.mats == 3 else 4.0) * fe)
            shared_act = (6.0 if self.mats == 3 else 4.0) * T * fe * m.moe.num_shared_experts
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

    # ---------------------------------------------------------------- FLOPs
    def forward_flops_per_sequence(self) -> dict[str, float]:
        """Forward FLOPs of one sequence through the whole model (2 FLOPs per multiply-add), by part:
        ``layers`` (GEMMs incl. the s^2 attention term), ``core`` (the attention-score part of it) and
        ``logits``. Narayanan et al. SC'21 eq. (3) for dense GPT: 24 s h^2 + 4 s^2 h per layer, 2 s h V."""
        m = self.model
        s, h, hd = m.seq_length, m.hidden_size, m.head_dim
        kvd = m.num_kv_heads * hd
        qkv = 2 * s * h * (h + 2 * kvd)
        core = 2 * 2 * s * s * h  # QK^T and attention-over-V
        proj = 2 * s * h * h
        dense_mlp = 2 * s * h * m.ffn_hidden_size * self.mats
        layers = m.num_layers * (qkv + core + proj) + self.n_dense * dense_mlp
        if m.moe:
            fe = m.moe.expert_ffn_hidden_size
            # top-k routed experts plus shared experts and the router (Fedus et al. 2022; activated params)
            per_token = (
                2 * h * fe * self.mats * (m.moe.top_k + m.moe.num_shared_experts) + 2 * h * m.moe.num_experts
            )
            layers += self.n_moe * s * per_token
        logits = 2 * s * h * m.vocab_size
        return {"layers": float(layers), "core": float(m.num_layers * core), "logits": float(logits)}

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
        qkv = gemm_time(eff, P, 1.0, T, (h + 2 * kvd) / t, h)
        scores = gemm_time(eff, P, b * a / t, s_loc, s, hd)
        context = gemm_time(eff, P, b * a / t, s_loc, hd, s)
        proj = gemm_time(eff, P, 1.0, T, h, h / t)
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
            ns = m.moe.num_shared_experts
            shared = 0.0
            if ns:
                shared = gemm_time(eff, P, 1.0, T, (self.mats - 1) * fe * ns / t, h) + gemm_time(
                    eff, P, 1.0, T, h, fe * ns / t
                )
            router = gemm_time(eff, P, 1.0, T, E, h)
            out["moe_mlp"] = experts + shared + router
        else:
            out["moe_mlp"] = out["dense_mlp"]
        out["logits"] = gemm_time(eff, P, 1.0, T, m.vocab_size / t, h)
        return out

    def timing(self, L: Layouts, memory: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Step time and its parts for each layout (seconds), plus communicated bytes per device.

        Composes the per-dimension terms below: a micro-batch through one stage costs its ``compute_times``
        plus the communication on its critical path (``tp_comm``, the exposed part of ``cp_comm``,
        ``ep_comm``); a step is ``micro`` of those, the pipeline bubble and sends (``pp_comm``), the exposed
        gradient reduction (``dp_comm``) and the ``optimizer_time``."""
        p = L.pp.astype(np.float64)
        micro = self.micro_batches(L)
        g = self._layer_gemm_times(L)
        links = self.links(L)
        compute = self.compute_times(L, g)
        tp = self.tp_comm(L, links["tp"])
        fw = self.framework_times(L, links["tp"])
        for part in ("dense_layer", "moe_layer", "logits", "embedding"):
            compute[part] = compute[part] * fw["compute_scale"]
        compute["dense_layer"] = compute["dense_layer"] + fw["layer"]
        compute["moe_layer"] = compute["moe_layer"] + fw["layer"]
        compute["logits"] = compute["logits"] + fw["edge"]
        # the measured tp passes hold their collectives' start-up: charge only their bandwidth share again
        tp["time"] = np.maximum(tp["time"] - fw["tp_latency"], 0.0)
        cp = self.cp_comm(L, links["cp"], g["core"])
        ep = self.ep_comm(L, links["ep"])

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
        dp = self.dp_comm(L, links["dp"], links["edp"], micro, compute_micro, params, layers_here)
        fw_step = layers_here * fw["step_layer"] + fw["step_fixed"]
        opt_time = self.optimizer_time(L, params) + fw_step

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
            "framework": micro * (layers_here * fw["layer"] + fw["edge"]) + fw_step,
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

    def links(self, L: Layouts) -> dict[str, GroupLinks]:
        """The links every parallel group of each layout crosses under this model's placement ``order``:
        ``tp``, ``cp``, ``dp`` (the dp x cp gradient group), ``ep``, ``edp`` (expert data parallel), ``pp``."""
        eff, n = self.eff, self.cluster.devices_per_node
        strides = group_strides(L, self.order)
        # the groups carved from the cp x dp block: members per node of their two levels
        size_in, s_in, s_out = _block(L, strides, self.order)
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
            "ep": group_links(self.cluster, eff, ep, strides["ep"], ep_node),
            "edp": group_links(self.cluster, eff, block // ep, strides["edp"], edp_node),
            "pp": group_links(self.cluster, eff, L.pp, strides["pp"]),
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
        _full, sel = _recompute_flags(L)
        sp = L.sp.astype(bool)
        passes = _layer_passes(L)

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

    def framework_times(self, L: Layouts, tp_links: GroupLinks) -> dict[str, np.ndarray]:
        """The runtime's host-side seconds (:class:`~.hardware.Framework`, zeros when not measured): ``layer``
        per layer and micro-batch (scaled by the layer's passes: a recompute, full or selective, runs a fourth), ``edge``
        per micro-batch on the last stage (embedding, head, loss), ``step_layer`` per layer of the stage
        and ``step_fixed`` per step (gradient norm, optimizer loop, the step's small all-reduce), and
        ``tp_latency``: the start-up of the tp collectives of one layer and micro-batch, which the measured
        tp passes already hold; ``compute_scale``: the factor on the modelled compute. The tp figures were
        measured at tp = 2 and serve every tp > 1."""
        fw = self.fw
        zero = np.zeros_like(L.tp, dtype=np.float64)  # the layouts' (broadcasting) shape
        if not fw.measured:
            return {k: zero for k in ("layer", "edge", "step_layer", "step_fixed", "tp_latency")} | {
                "compute_scale": zero + 1.0
            }
        tp_on = L.tp > 1
        full, sel = _recompute_flags(L)
        # host-side, selective recompute costs what full does: the runtime's op-level policy
        # (training/parallel/activation_checkpoint.py) re-runs every operator of the block but the matmuls,
        # whose saved outputs it still dispatches for
        host_passes = (3.0 + full + sel) / 3.0
        world = (L.tp * L.pp * L.dp * L.cp).astype(np.float64)
        # the start-up of one tp collective: an all-reduce of nothing; (4 + 2 full) of them per layer
        tp_latency = np.where(tp_on, (4.0 + 2.0 * full) * all_reduce_time(tp_links, 0.0), 0.0)
        ddp_on = (L.dp * L.cp > 1) & (L.zero == 0) & ~tp_on  # the runtime's DDP wrapper
        plain = np.where(ddp_on & (fw.dp_layer_pass_s > 0), fw.dp_layer_pass_s, fw.layer_pass_s)
        return {
            "layer": np.where(tp_on, fw.tp_layer_pass_s, plain) * host_passes,
            "edge": np.where(tp_on, fw.tp_edge_pass_s, fw.edge_pass_s) + zero,
            "step_layer": np.where(tp_on, fw.tp_step_layer_s, fw.step_layer_s) + zero,
            "step_fixed": fw.step_fixed_s + np.where(world > 1, fw.step_collective_s, 0.0),
            "tp_latency": tp_latency,
            "compute_scale": fw.compute_scale + zero,
        }

    def tp_comm(self, L: Layouts, links: GroupLinks) -> dict[str, np.ndarray]:
        """Tensor-parallel collectives of one layer and one micro-batch: ``time`` (on the critical path) and
        ``volume`` (bytes per device)."""
        t = L.tp.astype(np.float64)
        full, _sel = _recompute_flags(L)
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
        full, sel = _recompute_flags(L)
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
        passes = _layer_passes(L)
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
    ) -> dict[str, np.ndarray]:
        """Data-parallel gradient reduction (and ZeRO parameter gathers) of one step for the stage
        ``params`` of :meth:`stage_parameters` (``layers_here`` layers): ``time`` (all of it), ``exposed``
        (what the backward and forward of ``compute_micro`` seconds do not hide, plus the slowdown of what
        they do) and ``volume`` (bytes per device). ZeRO-3's per-micro-batch gathers follow the framework's
        :class:`~.hardware.FrameworkCollectives` (rings over the node's NICs or each rank's own link, one
        collective per block or per prefetch bucket)."""
        full, _sel = _recompute_flags(L)
        passes = _layer_passes(L)
        # DP: gradient all-reduce (ZeRO 0), or reduce-scatter + parameter all-gather (ZeRO >= 1);
        # dense grads over dp*cp ranks, expert grads over the expert-data-parallel ranks
        gb = self.grad_bytes
        dense_b, expert_b = params["dense"] * gb, params["expert"] * gb
        ar = all_reduce_time(dp_links, dense_b) + all_reduce_time(edp_links, expert_b)
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
        # none without overlap_grad_reduce (Megatron-LM default: reduce after the last backward)
        if not self.training.overlap_grad_reduce:
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
