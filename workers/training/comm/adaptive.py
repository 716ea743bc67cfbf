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

What it measures, per step and bucket (:class:`~workers.training.comm.adaptive_control.StepRecord`):
when each bucket's hook was entered and left (its synchronous codec time on the autograd thread) and when
its collective finished, the bytes it put on the wire, and at top-k levels the gradient's and the
residual's norms. From those:

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

How it decides (:meth:`AdaptiveState.decide`, at the first bucket of each step; the cost model and the
rules live in :mod:`.adaptive_control`, the levels in :mod:`.adaptive_levels`). A cost model replays the
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

import torch
import torch.distributed as dist

import native_ops
from workers.training.comm.adaptive_control import AdaptiveControl, BucketRecord, StepRecord
from workers.training.comm.adaptive_levels import (
    DEFAULT_LADDER,
    FP16_CODEC_S_PER_ELEMENT,
    TOPK_CODEC_S_PER_ELEMENT,
    flat_twin,
    level_density,
    parse_ladder,
)
from workers.training.comm.compression import (
    VALUE_DTYPES,
    CompressionState,
    ResidualStore,
    check_bucket,
    density_of,
    option_bool,
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


class AdaptiveState(AdaptiveControl, CompressionState):
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
        ladder = parse_ladder(opts.pop("ladder", "/".join(str(d) for d in DEFAULT_LADDER)))
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
        self.bound_scaling = option_bool(opts.pop("bound_scaling", True))
        self.exposed_high = float(opts.pop("exposed_high", 0.05))
        self.margin = float(opts.pop("margin", 0.05))
        self.tolerance = float(opts.pop("tolerance", 0.02))
        self.dwell = int(opts.pop("dwell", 2))
        self.revisit = int(opts.pop("revisit", 20))
        self.cooldown = int(opts.pop("cooldown", 50))
        self.value_dtype = VALUE_DTYPES[str(opts.pop("value_dtype", "fp16"))]
        self.clip_norm = float(opts.pop("clip_norm", 0.0))
        self.momentum = float(opts.pop("momentum", 0.0))
        self.momentum_masking = option_bool(opts.pop("momentum_masking", True))
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
        self._current: StepRecord | None = None
        self._previous: StepRecord | None = None

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
        k = sum(native_ops.k_for_density(size, level_density(level)) for size in sizes)
        return all_gather_wire_bytes(k * self._entry_bytes(), w)

    def _shard_k(self, n: int, level: str) -> int | None:
        """Top-k count of this rank's shard at a ``hier_topk`` level; ``None`` where the dense shard
        all-reduce moves fewer bytes (as the ``hierarchical`` hook decides)."""
        h = self.hierarchy
        shard = math.ceil(n / h.ranks_per_node_in_group)
        k = native_ops.k_for_density(shard, level_density(level))
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
            return flat_twin(level)
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


def adaptive_hook(state: AdaptiveState, bucket):
    buf = bucket.buffer()
    check_bucket(buf, "adaptive")
    n, w, stats = buf.numel(), state.world_size, state.stats
    is_last = bucket.is_last()
    first = bucket.index() == 0 or state._current is None
    if first:
        if state._current is not None:  # the step that just ended: its exposed time, before stats roll over
            state._current.exposed_s = float(stats.comm_stats()["comm_s_exposed"])
        state._previous, state._current = state._current, StepRecord(t_first=time.perf_counter())
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
    record = BucketRecord(
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
        ks = [native_ops.k_for_density(size, level_density(level)) for size in record.sizes]
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
    stats.add("density_elements", level_density(level) * n)
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
