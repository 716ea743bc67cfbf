"""``adaptive``: per bucket, dense / fp16 / top-k + error feedback at a density from a ladder, flat or
through the node hierarchy, chosen every step from what the previous step measured (issue 17).

Levels, densest first: ``dense`` (fp32 all-reduce, what plain DDP sends), ``hier`` (the hierarchical
all-reduce of :mod:`.hierarchical`: shared-memory reduce-scatter inside a node, fp32 all-reduce of the
shards across nodes, all-gather inside the node; lossless), ``fp16`` (fp16 all-reduce), then for each
density ``d`` of the ladder (default 10 % and 1 %; DGC goes to 0.1 %, Lin et al. 2018) ``topk@d`` (top-k +
error feedback over the whole group) -- or, where there is a hierarchy, ``hier_topk@d`` instead (top-k +
error feedback of the node-summed shards, across nodes only). The ``hier`` levels are offered when the
data-parallel group has more than one rank on each of more than one node (``ranks_per_node``: the runtime
passes torchrun's ``LOCAL_WORLD_SIZE``); with one DP rank per node (e.g. tp2 x dp2 on 2 x 2) they would be
the flat all-reduce again. Leaving a top-k
level for a denser one flushes the bucket's error-feedback residual into the next exchange (a
``hier_topk`` shard residual is added at the rank's shard offset of the flat residual: each node's ranks
hold disjoint shards, so the node's withheld sum is sent once), so nothing a bucket withheld is lost.

What it measures, per step and bucket (:class:`_StepRecord`): when each bucket's hook was entered and
left (its synchronous codec time on the autograd thread) and when its collective finished, the bytes it
put on the wire, and at top-k levels the gradient's and the residual's norms. From those:

- **achieved link throughput**: wire bytes / transfer seconds of the dense/fp16 all-reduces (large
  messages: bandwidth-bound), a bucket's transfer starting when it is launched *and* the previous
  bucket's is done (one link, in bucket order, as gloo issues them); and per collective family (per level
  for top-k levels) the fixed cost of a bucket's transfer beyond bytes / link (latency, waiting for the
  slowest rank) -- small top-k messages are dominated by it. The link is the node's uplink: with node-major ranks one edge of a ring
  leaves each node, so a flat collective's per-rank wire bytes are what the uplink carries; a ``hier``
  level's L ranks per node each send their shard's bytes over it at once (L x the per-rank inter-node
  bytes). The hierarchical families' extra cost (the shared-memory stages, the shard's top-k) grows with
  the bucket, so it is learnt per element rather than per bucket;
- **exposed communication**: per bucket the part of its collective after backward ended plus its codec
  time, and the step's total (``stats``' ``comm_s_exposed``) against the step's compute time (the period
  between two steps' first buckets, minus the exposed time);
- **error-feedback residual norm** relative to the gradient norm (sqrt of the sums over ranks).

How it decides (:meth:`AdaptiveState.decide`, at the first bucket of each step). A cost model replays the
last step's backward with other levels: each bucket's hook enters after the compute gap it had, costs
``elements x codec seconds per element`` of the level's family (measured; until measured, the constant
below), then its transfer queues on the link (the family's fixed cost + bytes at the measured rate).
The predicted step cost of an assignment is the hook time on the autograd thread plus the transfer time left after backward. Buckets
are visited largest first (twice); each takes the level of least predicted cost, preferring the densest
level within ``tolerance`` of that least cost. Rules, with hysteresis (a switch needs a margin, and moves
to sparser and to denser levels have different gates, so a bucket does not flap):

1. *back off*: a top-k bucket whose residual norm exceeds ``residual_bound`` x its gradient norm at
   ``persist`` consecutive decisions (the first one after the bucket switched does not count: a switch
   flushes one residual into another, and the bound is about a residual that keeps growing, not that
   step) goes one level denser, and may not return to the level it left for ``cooldown`` steps (doubled
   at each repeat);
2. *sparser* only while the step's exposed communication is over ``exposed_high`` of its compute time,
   the predicted saving is over ``margin`` of the step time, and (at a top-k level) the residual is
   under half the bound;
3. *denser* when the model predicts it costs no more than ``tolerance`` of the step time more (a fast
   link hides it);
4. no bucket switches again within ``dwell`` steps of its last switch (rule 1 excepted);
5. no bucket returns within ``revisit`` steps to a level it left (rule 1 excepted): the estimates move
   from step to step, and without this a bucket measured here flipped fp16 -> top-k -> fp16 in 4 steps.

No decision is taken from the first step a state measures (after a start or a resume): DDP's first
iteration re-buckets and grows its allocations, and its timings mislead (at 10 Gbit/s it sent the
controller to top-k for two steps; the runtime's step-time summary skips that step for the same reason).
For the same reason the estimates never learn from a bucket's first step at a new level (first-use costs:
the hierarchy's shared-memory segments, fresh buffers).

Every rank decides from the same numbers: the measurements are summed over the data-parallel group by one
all-reduce of ``8 x buckets + 2`` float64 values at the first bucket of each step (every collective of the
previous step has completed by then; the time it takes is counted as that bucket's hook time), and the
decision is a pure function of them (``test_comm_adaptive`` checks that every rank logs the same
switches). Each switch is recorded in :attr:`AdaptiveState.switches` with its step, bucket, levels and
reason; the runtime publishes each as a ``comm_switch`` event (:meth:`AdaptiveState.take_switches`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import native_ops
from workers.training.comm.compression import (
    VALUE_DTYPES,
    CompressionState,
    ResidualStore,
    _bool,
    _check_bucket,
    density_of,
    parameter_segments,
    topk_exchange,
)
from workers.training.comm.hierarchical import (
    HierarchicalState,
    sparse_all_reduce,
    sparse_beats_dense,
    split_by_node,
)
from workers.training.comm.stats import all_gather_wire_bytes, ring_all_reduce_wire_bytes

log = logging.getLogger(__name__)

# Top-k compression cost per element before the first top-k step measures it: 65-80 ms for 20.7M
# elements in 57 tensors, one uncontended thread (docs/comm.md, "Where top-k's step time goes") ~ 3.5 ns.
TOPK_CODEC_S_PER_ELEMENT = 3.5e-9
# fp16 cast + copy back before it is measured: two passes over fp32 memory, ~2 x 0.4 ns/element at the
# ~10 GB/s one core streams (order of magnitude; replaced by the measurement after one fp16 step).
FP16_CODEC_S_PER_ELEMENT = 1e-9
# 10 % and 1 %; DGC's 0.1 % on request (ladder=0.1/0.01/0.001): on the bench's models it costs loss that
# 300 steps do not recover (comm-tiny, fixed top-k 0.1 % with DGC's recipe: +9.4 % vs dense; each parameter
# is sent a third of a time in the run), and with it in the ladder the controller went there on slow links
DEFAULT_LADDER = (0.1, 0.01)
# weight of the newest step in the running estimates of throughput and codec cost
EMA = 0.5


# the hierarchical families' extra cost per bucket element before it is measured: the shared-memory
# reduce-scatter and all-gather stream the bucket ~3 times (~1 ns/element, as FP16_CODEC_S_PER_ELEMENT), and
# hier_topk also selects the top-k of the rank's 1/L shard (TOPK_CODEC_S_PER_ELEMENT per shard element)
HIER_S_PER_ELEMENT = 1e-9
HIER_FAMILIES = ("hier", "hier_allgather")


def _family(level: str) -> str:
    """The collective a level's transfer uses (``hier*``: through the node hierarchy)."""
    if level.startswith("hier"):
        return "hier_allgather" if "@" in level else "hier"
    return "allgather" if level.startswith("topk") else "allreduce"


def _kind(level: str) -> str:
    """The codec a level runs on the autograd thread (the hierarchy's stages run on their own threads)."""
    if level.startswith("hier"):
        return "hier"
    return "topk" if level.startswith("topk") else level


def _cost_key(level: str) -> str:
    """What a transfer's extra cost is learnt under: the family, or for a top-k level the level itself (a
    larger k costs more per element to select, gather and add: one estimate for 10 % and 1 % made the
    model call 10 % cheap and keep buckets there, 20.7M model)."""
    return level if "@" in level else _family(level)


def _codec_key(level: str) -> str:
    """What a level's codec time on the autograd thread is learnt under (a flat top-k level: itself)."""
    return level if level.startswith("topk@") else _kind(level)


def _sparse(level: str) -> bool:
    """Whether the level withholds an error-feedback residual (a top-k level, flat or hierarchical)."""
    return "@" in level


def _density(level: str) -> float:
    return float(level.split("@", 1)[1]) if "@" in level else 1.0


def _flat_twin(level: str) -> str:
    """The flat level a hierarchical one becomes where the job has no hierarchy (resumed elsewhere)."""
    if level == "hier":
        return "dense"
    return level.removeprefix("hier_")


def _ladder(value) -> tuple[float, ...]:
    if isinstance(value, int | float):
        parts = [float(value)]
    else:
        parts = [float(x) for x in str(value).replace("/", " ").split()]
    if not parts or any(not 0.0 < d < 1.0 for d in parts):
        raise ValueError(
            f"adaptive: ladder must be densities in (0, 1) separated by '/' (e.g. 0.1/0.01/0.001), got {value!r}"
        )
    return tuple(sorted(set(parts), reverse=True))


@dataclass
class _BucketRecord:
    index: int
    names: tuple[str, ...]
    sizes: tuple[int, ...]  # elements of each parameter segment (one segment: a non-standard layout)
    level: str
    t_enter: float = 0.0
    control_s: float = 0.0  # the decision's all-reduce (bucket 0), not the level's codec
    t_launched: float = 0.0
    t_done: float = 0.0
    wire_bytes: int = 0
    grad_sq: float = 0.0
    residual_sq: float = 0.0
    fresh: bool = False  # the bucket's first step at this level (switched at this step's decision)

    @property
    def elements(self) -> int:
        return sum(self.sizes)


@dataclass
class _StepRecord:
    t_first: float
    buckets: list[_BucketRecord] = field(default_factory=list)
    t_enter_last: float | None = None
    exposed_s: float | None = None  # stats' comm_s_exposed of the step, read at the next step's start


@dataclass
class _Measured:
    """One step's measurements, averaged over the ranks (times, bytes) or summed (squared norms)."""

    period_s: float
    exposed_s: float
    enter_s: list[float]  # each bucket's hook entry, from the first bucket's
    sync_s: list[float]  # each bucket's codec + launch time on the autograd thread
    transfer_s: list[float]
    exposed_b: list[float]
    wire: list[float]
    grad_sq: list[float]
    residual_sq: list[float]

    def residual_ratio(self, i: int) -> float:
        return math.sqrt(self.residual_sq[i] / self.grad_sq[i]) if self.grad_sq[i] > 0 else 0.0


class AdaptiveState(CompressionState):
    """State of ``adaptive``. Options: ``ladder`` (top-k densities, '/'-separated, default
    ``0.1/0.01``; 0.1 % on request), ``levels`` (families it may use, a '/'-separated subset of
    ``dense/fp16/topk/hier``; default all; ``hier`` with ``topk`` adds the ``hier_topk`` levels),
    ``ranks_per_node`` (the node layout the ``hier`` levels need: a node holds that many consecutive
    global ranks; without it, or with one DP rank per node or one node, no ``hier`` level is offered),
    ``start`` (initial level, default the densest), ``residual_bound`` (back off a top-k
    bucket whose residual norm exceeds this many gradient norms; default 4 at 10 % density, scaled by
    sqrt(0.1 / density) below unless ``bound_scaling=false``: :meth:`bound`), ``persist`` (at that many
    consecutive decisions; default 2), ``exposed_high`` (go sparser
    only while exposed comm is over this share of compute; 0.05), ``margin`` (a sparser switch must save
    this share of the step time; 0.05), ``tolerance`` (a denser level may cost this share more; 0.02),
    ``dwell`` (steps between two switches of a bucket; 2), ``revisit`` (steps before a bucket may return
    to a level it left; 20), ``cooldown`` (steps before a backed-off level
    is retried, doubled at each repeat; 50), and the top-k options ``value_dtype``, ``clip_norm``,
    ``momentum``, ``momentum_masking`` (DGC's local steps, at top-k levels only)."""

    def __init__(self, process_group, options: dict | None = None) -> None:
        super().__init__(process_group)
        opts = dict(options or {})
        ladder = _ladder(opts.pop("ladder", "/".join(str(d) for d in DEFAULT_LADDER)))
        asked = "levels" in opts
        families = str(opts.pop("levels", "dense/fp16/topk/hier")).replace("/", " ").split()
        if not families or set(families) - {"dense", "fp16", "topk", "hier"}:
            raise ValueError(
                f"adaptive: levels must be a '/'-separated subset of dense/fp16/topk/hier, got {families}"
            )
        if families == ["hier"]:
            raise ValueError("adaptive: levels needs a flat family beside hier (dense, fp16 or topk)")
        ranks_per_node = opts.pop("ranks_per_node", None)
        self.hierarchy: HierarchicalState | None = None
        if "hier" in families:
            why = self._hierarchy_unavailable(ranks_per_node)
            if why is None:
                self.hierarchy = HierarchicalState(process_group, {"ranks_per_node": int(ranks_per_node)})
            elif asked and dist.get_rank() == 0:
                log.warning("adaptive: no hier levels: %s", why)
        hier = self.hierarchy is not None
        self.levels: list[str] = (
            (["dense"] if "dense" in families else [])
            + (["hier"] if hier else [])
            + (["fp16"] if "fp16" in families else [])
        )
        if "topk" in families:
            # with a hierarchy, top-k goes through it only: the node-summed shards' top-k puts (W - 1) /
            # (nodes - 1) times fewer bytes on the uplink than each rank's own, selects from 1/L of the
            # bucket on the stage threads instead of all of it on the autograd thread, and offering both
            # twins at one density made buckets flap between them (each move flushes one residual into the
            # other, which then reads as residual growth: measured, 20.7M model at 0.5 Gbit/s)
            self.levels += [f"hier_topk@{d:g}" if hier else f"topk@{d:g}" for d in ladder]
        # per bucket (its parameters' names): (offset in the bucket, fp32 error-feedback residual, the
        # parameters' sizes) of this rank's shard at the hier_topk levels (of the node's sum: the L ranks of a
        # node hold disjoint shards)
        self.shard_residuals: dict[tuple[str, ...], tuple[int, torch.Tensor, tuple[int, ...]]] = {}
        self.start = str(opts.pop("start", self.levels[0]))
        if self.start not in self.levels:
            raise ValueError(f"adaptive: start must be one of {self.levels}, got {self.start!r}")
        # comm-tiny, 300 steps, 1 Gbit/s, AdamW (bench/comm.py part 3), before the bound scaled with the
        # density: a bound of 8 went to top-k 1 % then 0.1 % for the last 200 steps, +2.5 % loss vs dense; 2
        # kept fp16, -0.2 %. Scaled (2 at 10 % = 6.3 at 1 %) it still backed the 20.7M model's buckets off
        # 1 % at 0.5 Gbit/s (ratios 7-8 there: the steady state of the fixed hierarchical top-k, the fastest
        # method on that link); 4 at 10 % (12.6 at 1 %) kept them there, and comm-tiny's 300-step loss was
        # -0.7 % vs dense (-0.6 % with 0.1 % in the ladder)
        self.residual_bound = float(opts.pop("residual_bound", 4.0))
        self.persist = int(opts.pop("persist", 2))
        self.bound_scaling = _bool(opts.pop("bound_scaling", True))
        self.exposed_high = float(opts.pop("exposed_high", 0.05))
        self.margin = float(opts.pop("margin", 0.05))
        self.tolerance = float(opts.pop("tolerance", 0.02))
        self.dwell = int(opts.pop("dwell", 2))
        self.revisit = int(opts.pop("revisit", 20))
        self.cooldown = int(opts.pop("cooldown", 50))
        self.value_dtype = VALUE_DTYPES[str(opts.pop("value_dtype", "fp16"))]
        self.clip_norm = float(opts.pop("clip_norm", 0.0))
        self.momentum = float(opts.pop("momentum", 0.0))
        self.momentum_masking = _bool(opts.pop("momentum_masking", True))
        if opts:
            raise ValueError(f"adaptive: unknown options {sorted(opts)}")
        if self.residual_bound <= 0 or min(self.exposed_high, self.margin, self.tolerance) < 0:
            raise ValueError("adaptive: residual_bound must be > 0; exposed_high, margin, tolerance >= 0")
        if self.dwell < 1 or self.persist < 1 or self.cooldown < 0 or self.revisit < 0:
            raise ValueError("adaptive: dwell and persist must be >= 1, cooldown and revisit >= 0")
        if not 0.0 <= self.momentum < 1.0 or self.clip_norm < 0:
            raise ValueError("adaptive: momentum must be in [0, 1) and clip_norm >= 0")
        self.momentum_buffers = ResidualStore() if self.momentum > 0 else None
        self.level_of: dict[str, str] = {}  # parameter name -> level (names survive DDP's re-bucketing)
        # per parameter name too: the step of its bucket's last switch, the sparsest level it may not reach
        # again (the level a residual back-off left) and until which step, and how many back-offs it had
        self.last_switch: dict[str, int] = {}
        self.banned: dict[str, tuple[int, int]] = {}
        self.backoffs: dict[str, int] = {}
        self.over_bound: dict[str, int] = {}  # consecutive decisions its residual was over the bound
        self.left: dict[str, tuple[int, int]] = {}  # parameter name -> (level index it left, at step)
        self._steps_seen = 0  # steps measured since this state was built or loaded
        self.switches: list[dict] = []
        self._published = 0
        self.throughput: dict[str, float] = {}  # "link": achieved wire bytes/s (running estimate)
        # collective family (a top-k level: the level) -> fixed seconds per bucket transfer (hierarchical:
        # per element)
        self.overhead_s: dict[str, float] = {}
        self.codec_s: dict[str, float] = {
            "dense": 0.0,
            "fp16": FP16_CODEC_S_PER_ELEMENT,
            "topk": TOPK_CODEC_S_PER_ELEMENT,
            "hier": FP16_CODEC_S_PER_ELEMENT,  # the hook's 1/W scaling pass; the stages run elsewhere
        }
        self.codec_measured: set[str] = set()
        self.last_decision: dict = {}
        self._current: _StepRecord | None = None
        self._previous: _StepRecord | None = None

    def _hierarchy_unavailable(self, ranks_per_node) -> str | None:
        """Why the ``hier`` levels cannot run in this group (``None``: they can). Every rank answers the
        same: every data-parallel group of the world has the same shape."""
        if ranks_per_node is None:
            return "no ranks_per_node (the node layout) was given"
        members = (
            dist.get_process_group_ranks(self.process_group)
            if self.process_group is not None
            else list(range(dist.get_world_size()))
        )
        try:
            nodes, _ = split_by_node(members, int(ranks_per_node))
        except ValueError as exc:
            return str(exc)
        if len(nodes) < 2:
            return "the data-parallel group is on one node: nothing crosses nodes"
        if len(nodes[0]) < 2:
            return (
                f"the data-parallel group has one rank on each of its {len(nodes)} nodes: the hierarchy "
                "would be the flat all-reduce"
            )
        return None

    def close(self) -> None:
        """Stop the hierarchy's stage threads (after the last backward)."""
        if self.hierarchy is not None:
            self.hierarchy.close()

    # ------------------------------------------------------------------------------------ bookkeeping

    def level_for(self, names: tuple[str, ...]) -> str:
        """A bucket's level: its parameters' (all the same unless DDP re-bucketed; then the densest)."""
        found = [self.levels.index(self.level_of[n]) for n in names if n in self.level_of]
        return self.levels[min(found)] if found else self.start

    def wire_bytes(self, sizes: tuple[int, ...], level: str) -> int:
        """Bytes this rank sends for a bucket of parameter ``sizes`` at ``level`` (ring all-reduce of
        fp32/fp16 values, or the all-gather of the per-parameter top-k message)."""
        n, w = sum(sizes), self.world_size
        if level == "dense":
            return ring_all_reduce_wire_bytes(4 * n, w)
        if level == "fp16":
            return ring_all_reduce_wire_bytes(2 * n, w)
        if level.startswith("hier"):
            h = self.hierarchy
            local = h.ranks_per_node_in_group
            intra = 0 if h.shm is not None else 2 * (local - 1) * 4 * math.ceil(n / local)
            return intra + self._inter_node_bytes(n, level)
        k = sum(native_ops.k_for_density(size, _density(level)) for size in sizes)
        return all_gather_wire_bytes(k * self._entry_bytes(), w)

    def _shard_k(self, n: int, level: str) -> int | None:
        """Top-k count of this rank's shard at a ``hier_topk`` level; ``None`` where the dense shard
        all-reduce moves fewer bytes (as the ``hierarchical`` hook decides)."""
        h = self.hierarchy
        shard = math.ceil(n / h.ranks_per_node_in_group)
        k = native_ops.k_for_density(shard, _density(level))
        return k if sparse_beats_dense(k, self._entry_bytes(), h.nodes_in_group, shard) else None

    def _entry_bytes(self) -> int:
        """Bytes of one top-k entry on the wire: an int32 index and a value in ``value_dtype``."""
        return 4 + torch.finfo(self.value_dtype).bits // 8

    def _hier_payload(self, n: int, level: str) -> int:
        """Bytes this rank puts into collectives for a bucket of ``n`` elements at a ``hier`` level: its
        shard's across nodes, plus the fp32 bucket through the intra-node collectives unless they run in
        shared memory."""
        return self._inter_node_bytes(n, level) + (0 if self.hierarchy.shm is not None else 4 * n)

    def _inter_node_bytes(self, n: int, level: str) -> int:
        """Bytes one rank sends across nodes for a bucket of ``n`` elements at a ``hier`` level."""
        h = self.hierarchy
        shard = math.ceil(n / h.ranks_per_node_in_group)
        k = self._shard_k(n, level) if "@" in level else None
        if k is None:
            return ring_all_reduce_wire_bytes(4 * shard, h.nodes_in_group)
        return all_gather_wire_bytes(k * self._entry_bytes(), h.nodes_in_group)

    def _shard_residual(
        self, names: tuple[str, ...], sizes: tuple[int, ...], residual: torch.Tensor, level: str
    ) -> tuple[int, torch.Tensor, tuple[int, ...]] | None:
        """(offset, residual, parameter sizes) of this rank's shard of the bucket at a ``hier_topk`` level
        (made on first use), else ``None``. A stored shard residual this exchange does not continue is
        first handed back: one of this bucket (another level, or another shard after a resume elsewhere) is
        added into the flat ``residual`` at its offset, which the exchange then sends or keeps feeding back;
        one of a bucket DDP has since re-bucketed goes to its parameters' flat residuals. Nothing withheld is
        lost."""
        for other in [k for k in self.shard_residuals if k != names and set(k) & set(names)]:
            self._release_by_parameter(other)
        n = residual.numel()
        want = None
        if level.startswith("hier_topk"):
            h = self.hierarchy
            shard_len = math.ceil(n / h.ranks_per_node_in_group)
            want = (dist.get_rank(h.intra_group) * shard_len, shard_len)
        stored = self.shard_residuals.get(names)
        if stored is not None and (
            want is None or (stored[0], stored[1].numel()) != want or stored[1].device != residual.device
        ):
            offset, r, _ = self.shard_residuals.pop(names)
            valid = max(0, min(r.numel(), n - offset))
            residual[offset : offset + valid] += r[:valid].to(residual.device)
            stored = None
        if want is None:
            return None
        if stored is None:
            r = torch.zeros(want[1], dtype=torch.float32, device=residual.device)
            stored = self.shard_residuals[names] = (want[0], r, sizes)
        return stored

    def _release_by_parameter(self, names: tuple[str, ...]) -> None:
        """Hand a shard residual of an old bucket of ``names`` back to its parameters' flat residuals (DDP
        rebuilt its buckets: the old offsets only mean something per parameter)."""
        offset, r, sizes = self.shard_residuals.pop(names)
        if len(sizes) != len(names):  # not one slice per parameter: no way to split it
            log.warning("adaptive: bucket of %s changed; its shard residual is dropped", names[0])
            return
        start = 0
        for name, size in zip(names, sizes, strict=True):
            lo, hi = max(start, offset), min(start + size, offset + r.numel())
            if lo < hi:
                self.residuals.add_to_parameter(name, size, lo - start, r[lo - offset : hi - offset])
            start += size

    def link_bytes(self, sizes: tuple[int, ...], level: str) -> int:
        """Bytes a bucket at ``level`` puts on its node's uplink (the link the model queues transfers on):
        a flat collective's per-rank wire bytes (one ring edge leaves each node), or the L ranks' shards
        of a node at a ``hier`` level."""
        if level.startswith("hier"):
            return self.hierarchy.ranks_per_node_in_group * self._inter_node_bytes(sum(sizes), level)
        return self.wire_bytes(sizes, level)

    def comm_stats(self) -> dict[str, float]:
        out = super().comm_stats()
        out["density"] = density_of(out)
        out["switches_total"] = len(self.switches)
        return out

    def take_switches(self) -> list[dict]:
        """Switches recorded since the last call (the runtime publishes each as a ``comm_switch`` event)."""
        new = self.switches[self._published :]
        self._published = len(self.switches)
        return new

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "adaptive": {
                "levels": list(self.levels),
                "level_of": dict(self.level_of),
                "last_switch": dict(self.last_switch),
                "banned": {k: list(v) for k, v in self.banned.items()},
                "backoffs": dict(self.backoffs),
                "over_bound": dict(self.over_bound),
                "left": {k: list(v) for k, v in self.left.items()},
                "switches": [dict(s) for s in self.switches],
                "throughput": dict(self.throughput),
                "overhead_s": dict(self.overhead_s),
                "codec_s": dict(self.codec_s),
                "codec_measured": sorted(self.codec_measured),
                "shard_residuals": {
                    "\n".join(k): [o, r.clone(), list(sizes)]
                    for k, (o, r, sizes) in self.shard_residuals.items()
                },
            },
        }

    def _resumed_level(self, level: str) -> str:
        """A checkpoint's level here: itself, else its twin on this run's route (flat where it has no
        hierarchy, hierarchical where it has one)."""
        if level in self.levels:
            return level
        if self.hierarchy is None:
            return _flat_twin(level)
        return f"hier_{level}" if level.startswith("topk@") else level

    def load_state_dict(self, state: dict) -> None:
        a = state.get("adaptive", {})
        level_of = {n: self._resumed_level(lvl) for n, lvl in a.get("level_of", {}).items()}
        unknown = {lvl for lvl in level_of.values() if lvl not in self.levels}
        if unknown:
            raise ValueError(
                f"adaptive: the checkpoint uses levels {sorted(unknown)} that this job's options do not offer "
                f"({', '.join(self.levels)}); resume with the same ladder and levels"
            )
        super().load_state_dict(state)
        # bans and levels left are stored as indices of the checkpoint's level list: carried over by name
        old_levels = list(a.get("levels", self.levels))

        def carried(entries: dict) -> dict[str, tuple[int, int]]:
            """(level index here, step) of each entry whose level this run offers (a ban of, or a return to,
            a level it does not offer is moot: e.g. 0.1 % from a checkpoint of the older default ladder)."""
            out = {}
            for name, (i, step) in entries.items():
                level = self._resumed_level(old_levels[int(i)]) if int(i) < len(old_levels) else None
                if level in self.levels:
                    out[name] = (self.levels.index(level), int(step))
            return out

        self.level_of = level_of
        self.last_switch = {k: int(v) for k, v in a.get("last_switch", {}).items()}
        self.banned = carried(a.get("banned", {}))
        self.backoffs = {k: int(v) for k, v in a.get("backoffs", {}).items()}
        self.over_bound = {k: int(v) for k, v in a.get("over_bound", {}).items()}
        # kept whatever the hierarchy is now: one whose shard no longer matches is flushed into the flat
        # residual at its offset by the bucket's next exchange (each still counted once over the group)
        self.shard_residuals = {
            tuple(k.split("\n")): (int(v[0]), v[1].clone(), tuple(int(x) for x in v[2]))
            for k, v in a.get("shard_residuals", {}).items()
        }
        self.switches = [dict(s) for s in a.get("switches", [])]
        self._published = len(self.switches)  # the run that recorded them published them
        self.throughput = {k: float(v) for k, v in a.get("throughput", {}).items()}
        self.overhead_s = {k: float(v) for k, v in a.get("overhead_s", {}).items()}
        self.codec_s.update({k: float(v) for k, v in a.get("codec_s", {}).items()})
        self.codec_measured = set(a.get("codec_measured", []))
        self.left = carried(a.get("left", {}))
        self._current = self._previous = None
        self._steps_seen = 0

    # ---------------------------------------------------------------------------------- measurement

    def _measure(self) -> _Measured | None:
        """The previous step's figures, summed over the group by one all-reduce (identical on all ranks)."""
        prev, cur = self._previous, self._current
        if prev is None or not prev.buckets or prev.t_enter_last is None or prev.exposed_s is None:
            return None
        rows, link_free = [], 0.0
        for b in prev.buckets:
            start = max(b.t_launched, link_free)
            link_free = max(link_free, b.t_done)
            sync = b.t_launched - b.t_enter - b.control_s
            exposed = max(0.0, b.t_done - prev.t_enter_last) + (0.0 if b is prev.buckets[-1] else sync)
            level = float(self.levels.index(b.level))
            rows.append(
                [b.t_enter - prev.t_first, sync, max(0.0, b.t_done - start), exposed, float(b.wire_bytes)]
                + [b.grad_sq, b.residual_sq, level]
            )
        flat = torch.tensor(
            [v for row in rows for v in row] + [cur.t_first - prev.t_first, prev.exposed_s],
            dtype=torch.float64,
        )
        if self.world_size > 1:
            dist.all_reduce(flat, group=self.process_group)
        w = self.world_size
        per = flat[:-2].view(len(rows), 8).tolist()
        if [round(r[7] / w) for r in per] != [self.levels.index(b.level) for b in prev.buckets]:
            raise RuntimeError("adaptive: ranks ran different levels in the last step (decisions diverged)")
        return _Measured(
            period_s=float(flat[-2]) / w,
            exposed_s=float(flat[-1]) / w,
            enter_s=[r[0] / w for r in per],
            sync_s=[r[1] / w for r in per],
            transfer_s=[r[2] / w for r in per],
            exposed_b=[r[3] / w for r in per],
            wire=[r[4] / w for r in per],
            grad_sq=[r[5] for r in per],
            residual_sq=[r[6] for r in per],
        )

    def _learn(self, m: _Measured, buckets: list[_BucketRecord]) -> None:
        """Running estimates of the link (bytes/s, from the large dense/fp16 all-reduces when there are
        any: bandwidth-bound), each collective family's fixed cost per bucket (what its transfers took
        beyond bytes / link: latency, waiting for the slowest rank) and each codec's seconds per element."""

        def ema(old, new):
            return new if old is None else (1 - EMA) * old + EMA * new

        # not from a bucket's first step at a level: it pays first-use costs (the hierarchy's shared-memory
        # segments are created and mapped, buffers allocated) that later steps do not -- learnt from it, the
        # model called hier_topk dear after one step and sent every bucket denser (20.7M model, 1 Gbit/s)
        rows = [r for r in zip(buckets, m.transfer_s, m.wire, m.sync_s, strict=True) if not r[0].fresh]
        for family in ("allreduce", "allgather"):
            mine = [(w, t) for b, t, w, _ in rows if _family(b.level) == family and t > 0]
            wire, secs = sum(w for w, _ in mine), sum(t for _, t in mine)
            if wire > 0 and secs > 0 and (family == "allreduce" or "link" not in self.throughput):
                self.throughput["link"] = ema(self.throughput.get("link"), wire / secs)
        link = self.throughput.get("link")
        for key in sorted({_cost_key(b.level) for b, _, _, _ in rows}) if link else ():
            mine = [(b, t) for b, t, _, _ in rows if _cost_key(b.level) == key]
            extra = [max(0.0, t - self.link_bytes(b.sizes, b.level) / link) for b, t in mine]
            if _family(mine[0][0].level) in HIER_FAMILIES:  # grows with the bucket: per element
                new = sum(extra) / max(1, sum(b.elements for b, _ in mine))
            else:
                new = sum(extra) / len(extra)
            self.overhead_s[key] = ema(self.overhead_s.get(key), new)
        by_kind: dict[str, list[float]] = {}
        for b, _, _, sync in rows:
            k = by_kind.setdefault(_codec_key(b.level), [0.0, 0.0])
            k[0], k[1] = k[0] + max(0.0, sync), k[1] + b.elements
        for kind, (secs, elements) in by_kind.items():
            if elements > 0:
                measured = kind in self.codec_measured
                self.codec_s[kind] = ema(self.codec_s[kind] if measured else None, secs / elements)
                self.codec_measured.add(kind)

    def codec(self, level: str) -> float:
        """Codec seconds per element of ``level`` on the autograd thread: measured at that level, else the
        prior of its kind (for top-k: ``TOPK_CODEC_S_PER_ELEMENT``, or another measured top-k level's)."""
        key = _codec_key(level)
        if key in self.codec_measured:
            return self.codec_s[key]
        if level.startswith("topk@"):
            others = [self.codec_s[k] for k in sorted(self.codec_measured) if k.startswith("topk@")]
            if others:
                return sum(others) / len(others)
        return self.codec_s[_kind(level)]

    # --------------------------------------------------------------------------------------- model

    def predict(self, m: _Measured, buckets: list[_BucketRecord], levels: list[str]) -> float:
        """Predicted seconds a step spends on communication under ``levels`` (one per bucket): hook time
        on the autograd thread plus the transfer left after backward, replaying the last step's compute
        gaps between buckets; each transfer queues on one link: its family's fixed cost plus wire bytes at
        the measured link rate."""
        cursor = link_free = hooks = 0.0
        for i, (b, level) in enumerate(zip(buckets, levels, strict=True)):
            gap = max(0.0, m.enter_s[i] - m.enter_s[i - 1] - m.sync_s[i - 1]) if i else 0.0
            codec = self.codec(level) * b.elements
            cursor += gap + codec
            hooks += codec
            link = self.throughput.get("link")
            wire_s = self.link_bytes(b.sizes, level) / link if link else 0.0
            link_free = max(link_free, cursor) + self.fixed_s(level, b.elements) + wire_s
        return hooks + max(0.0, link_free - cursor)

    def bound(self, level: str) -> float:
        """The residual bound at ``level``: ``residual_bound`` at 10 % density, x sqrt(0.1 / density) below
        it with ``bound_scaling`` on. Error feedback holds back what ~1/density steps did not send; for
        gradients that vary from step to step that sum grows like a random walk, sqrt(1/density) gradient
        norms, so a bound fixed across the ladder would call every sparse level's steady state growth
        (measured, 20.7M model, 0.5 Gbit/s: 0.7-1.4 at 10 %, 2-9 at 1 %)."""
        d = _density(level)
        if not self.bound_scaling or d >= 0.1:
            return self.residual_bound
        return self.residual_bound * math.sqrt(0.1 / d)

    def denser(self, level: str) -> str:
        """Where a residual back-off goes from ``level``: the sparsest level of higher density on the same
        route (flat or through the hierarchy), else the sparsest of higher density."""
        before = [lvl for lvl in self.levels[: self.levels.index(level)] if _density(lvl) > _density(level)]
        hier = level.startswith("hier")
        same = [lvl for lvl in before if lvl.startswith("hier") == hier]
        return (same or before or [self.levels[0]])[-1]

    def fixed_s(self, level: str, elements: int) -> float:
        """A transfer's cost beyond its uplink bytes at the measured rate: what was measured under its
        :func:`_cost_key` (the family, a top-k level itself), fixed seconds per bucket (flat) or per element x
        elements (hierarchical); before it is measured there, the mean of its family's other measured keys,
        else 0 for the flat families and the constants above for the hierarchical ones."""
        family, key = _family(level), _cost_key(level)
        same = [v for k, v in sorted(self.overhead_s.items()) if _family(k) == family]
        if key in self.overhead_s:
            value = self.overhead_s[key]
        elif same:  # not measured at this level: another level of its family
            value = sum(same) / len(same)
        elif family == "hier_allgather":
            value = HIER_S_PER_ELEMENT + TOPK_CODEC_S_PER_ELEMENT / self.hierarchy.ranks_per_node_in_group
        else:
            value = HIER_S_PER_ELEMENT if family == "hier" else 0.0
        return value * elements if family in HIER_FAMILIES else value

    # ------------------------------------------------------------------------------------- decision

    def decide(self) -> None:
        """At the first bucket of a step: measure the previous step (all-reduced), then maybe switch."""
        m = self._measure()
        if m is None:
            return
        self._steps_seen += 1
        if (
            self._steps_seen == 1
        ):  # DDP's first iteration (re-bucketing, allocator growth): not representative
            return
        buckets = self._previous.buckets
        self._learn(m, buckets)
        keys = [b.names[0] for b in buckets]
        names = [b.names for b in buckets]
        levels = [b.level for b in buckets]
        step_s = max(m.period_s, 1e-9)
        compute_s = max(step_s - m.exposed_s, 1e-9)
        exposed_share = m.exposed_s / compute_s
        chosen, reasons = list(levels), {}

        for i, level in enumerate(levels):  # rule 1: back off where the residual grew past the bound
            ratio = m.residual_ratio(i)
            bound = self.bound(level)
            over = _sparse(level) and ratio > bound and self.levels.index(level) > 0
            last = max(self.last_switch.get(n, -(10**9)) for n in names[i])
            if over and not (self.persist > 1 and self.step - last <= 1):
                count = max(self.over_bound.get(n, 0) for n in names[i]) + 1
            else:
                count = 0
            for n in names[i]:
                self.over_bound[n] = count
            if over and count >= self.persist:
                for n in names[i]:
                    self.over_bound[n] = 0
                chosen[i] = self.denser(level)
                count = max(self.backoffs.get(n, 0) for n in names[i])
                until = self.step + self.cooldown * 2**count
                for n in names[i]:
                    self.backoffs[n] = count + 1
                    self.banned[n] = (self.levels.index(level), until)
                reasons[i] = (
                    f"residual norm {ratio:.2f}x the gradient's > bound {bound:.3g}"
                    + (f" at {self.persist} decisions in a row" if self.persist > 1 else "")
                    + f": back off (no {level} before step {until})"
                )
        before = self.predict(m, buckets, chosen)
        order = sorted(range(len(buckets)), key=lambda i: -buckets[i].elements)
        for _ in range(2):  # coordinate descent over the buckets, largest first
            for i in order:
                last = max(self.last_switch.get(n, -(10**9)) for n in names[i])
                if i in reasons or self.step - last < self.dwell:
                    continue  # rule 4
                current = self.levels.index(chosen[i])
                ratio = m.residual_ratio(i)
                bans = [
                    self.banned[n][0] for n in names[i] if n in self.banned and self.step < self.banned[n][1]
                ]
                limit = min(bans, default=len(self.levels))
                recent = {
                    self.left[n][0]
                    for n in names[i]
                    if n in self.left and self.step - self.left[n][1] < self.revisit
                }
                costs = {}
                for j in range(len(self.levels)):
                    if j != current and j in recent:
                        continue  # rule 5: no return to a level left less than `revisit` steps ago
                    sparser_blocked = (
                        exposed_share <= self.exposed_high
                        or j >= limit
                        or (_sparse(chosen[i]) and ratio > self.bound(chosen[i]) / 2)
                    )
                    if j > current and sparser_blocked:
                        continue  # rule 2's gates
                    costs[j] = self.predict(m, buckets, chosen[:i] + [self.levels[j]] + chosen[i + 1 :])
                least = min(costs.values())
                pick = min(j for j, c in costs.items() if c <= least + self.tolerance * step_s)
                if pick == current or (
                    pick > current and costs[current] - costs[pick] < self.margin * step_s
                ):
                    continue  # rule 2's margin (rule 3: a denser pick is within tolerance by construction)
                rate = self.throughput.get("link")
                reasons[i] = (
                    f"{'sparser' if pick > current else 'denser'}: exposed comm {m.exposed_s * 1e3:.1f} ms = "
                    f"{exposed_share:.0%} of compute {compute_s * 1e3:.0f} ms (this bucket "
                    f"{m.exposed_b[i] * 1e3:.1f} ms), link {(rate or 0) * 8 / 1e9:.2f} Gbit/s achieved, "
                    f"residual {ratio:.2f}x gradient; predicted comm {costs[current] * 1e3:.1f} -> "
                    f"{costs[pick] * 1e3:.1f} ms/step"
                )
                chosen[i] = self.levels[pick]
        self.last_decision = {
            "step": self.step,
            "exposed_s": m.exposed_s,
            "compute_s": compute_s,
            "throughput_Bps": dict(self.throughput),
            "overhead_s": dict(self.overhead_s),
            "codec_s_per_element": dict(self.codec_s),
            "residual_ratio": [m.residual_ratio(i) for i in range(len(buckets))],
            "predicted_s": {"before": before, "after": self.predict(m, buckets, chosen)},
            "levels": list(chosen),
        }
        for i in sorted(reasons):
            if chosen[i] == levels[i]:
                continue
            for name in names[i]:
                self.level_of[name] = chosen[i]
                self.last_switch[name] = self.step
                self.left[name] = (self.levels.index(levels[i]), self.step)
            self.switches.append(
                {
                    "step": self.step,
                    "bucket": buckets[i].index,
                    "first_param": keys[i],
                    "from": levels[i],
                    "to": chosen[i],
                    "reason": reasons[i],
                }
            )


def adaptive_hook(state: AdaptiveState, bucket):
    buf = bucket.buffer()
    _check_bucket(buf, "adaptive")
    n, w, stats = buf.numel(), state.world_size, state.stats
    is_last = bucket.is_last()
    first = bucket.index() == 0 or state._current is None
    if first:
        if state._current is not None:  # the step that just ended: its exposed time, before stats roll over
            state._current.exposed_s = float(stats.comm_stats()["comm_s_exposed"])
        state._previous, state._current = state._current, _StepRecord(t_first=time.perf_counter())
    t0 = stats.bucket_enter(is_last)
    stats_record = stats.current_record()
    control_s = 0.0
    if first:
        state.decide()  # every rank, at the same point of the same step: one small all-reduce
        control_s = time.perf_counter() - t0
    names = state.residuals._keys(bucket)
    level = state.level_for(names)
    for name in names:
        state.level_of.setdefault(name, level)
    segments = parameter_segments(bucket)
    record = _BucketRecord(
        index=bucket.index(),
        names=names,
        sizes=tuple(size for _, size in segments),
        level=level,
        t_enter=t0,
        control_s=control_s,
        fresh=any(state.last_switch.get(name) == state.step for name in names),
    )
    state._current.buckets.append(record)
    if is_last:
        state._current.t_enter_last = t0
    residual = state.residuals.for_bucket(bucket)
    velocity = state.momentum_buffers.for_bucket(bucket) if state.momentum_buffers is not None else None

    # hands back a shard residual this level does not continue
    shard = state._shard_residual(names, record.sizes, residual, level)
    if velocity is not None and not level.startswith("topk"):
        velocity.zero_()  # DGC's momentum accumulates at the flat top-k levels only: here all is sent
    if shard is not None:  # hier_topk
        fut = _hier_topk(state, buf, residual, shard, record)
        payload = state._hier_payload(n, level)
    elif level == "hier":
        state._scale_and_flush(buf, residual)  # as plain DDP, plus what a top-k level withheld
        fut = state.hierarchy.submit_pipelined(buf, None, bucket.index())
        payload = state._hier_payload(n, level)
    elif level.startswith("topk"):
        ks = [native_ops.k_for_density(size, _density(level)) for size in record.sizes]
        payload = sum(ks) * state._entry_bytes()

        def grad_norm(local: torch.Tensor) -> None:  # the (1/W-scaled) gradient entering error feedback
            record.grad_sq = float(torch.linalg.vector_norm(local, dtype=torch.float32)) ** 2 / w**2

        fut = topk_exchange(state, buf, residual, velocity, segments, ks, after_local=grad_norm)
        record.residual_sq = float(torch.linalg.vector_norm(residual)) ** 2
    else:
        payload = (4 if level == "dense" else 2) * n
        if level == "dense":
            fut = state._dense_all_reduce(bucket, residual)
        else:
            state._scale_and_flush(buf, residual)  # flush what a top-k level withheld
            half = buf.to(torch.float16)
            work = dist.all_reduce(half, group=state.process_group, async_op=True)

            def decode(f):
                buf.copy_(f.value()[0])
                return buf

            fut = work.get_future().then(decode)
    if state.hierarchy is not None:  # what this rank puts into collectives that cross nodes
        stats.add(
            "inter_node_bytes", state._inter_node_bytes(n, level) if level.startswith("hier") else payload
        )
    wire = state.wire_bytes(record.sizes, level)
    record.wire_bytes = wire
    record.t_launched = time.perf_counter()
    stats.bucket_launched(t0, is_last, bytes_sent=payload, wire_bytes=wire, dense_bytes=4 * n)
    stats.add("density_elements", _density(level) * n)
    stats.add("control_s", control_s)

    def done(f):
        record.t_done = time.perf_counter()
        stats.bucket_done(t0, stats_record)
        return f.value()

    state._end_of_bucket(bucket)
    return fut.then(done)


def _hier_topk(state: AdaptiveState, buf, residual, shard, record) -> torch.futures.Future:
    """A ``hier_topk`` bucket: scale by 1/W and flush the flat residual into it, then through the node
    hierarchy with top-k + error feedback of this rank's (node-summed) shard across nodes."""
    shard_residual = shard[1]
    k = state._shard_k(buf.numel(), record.level)
    state._scale_and_flush(buf, residual)

    def inter_stage(piece: torch.Tensor) -> None:  # on the hierarchy's inter-node thread
        record.grad_sq = float(torch.linalg.vector_norm(piece, dtype=torch.float32)) ** 2
        if k is None:  # the dense shard all-reduce moves fewer bytes: error feedback flushed into it
            piece.add_(shard_residual)
            shard_residual.zero_()
            dist.all_reduce(piece, group=state.hierarchy.inter_group)
        else:
            sparse_all_reduce(piece, shard_residual, k, state.value_dtype, state.hierarchy.inter_group)
        record.residual_sq = float(torch.linalg.vector_norm(shard_residual)) ** 2

    return state.hierarchy.submit_pipelined(buf, inter_stage, record.index)
