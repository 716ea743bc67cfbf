"""The cost model and the rules of the ``adaptive`` comm hook (:mod:`.adaptive`): what one step measured
(:class:`BucketRecord`, :class:`StepRecord`, summed over the group into :class:`Measured`), the running
estimates learnt from it, the predicted communication cost of an assignment of levels to buckets, and the
decision (:meth:`AdaptiveControl.decide`). The module docstring of :mod:`.adaptive` explains the model and
the rules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from workers.training.comm.adaptive_levels import (
    HIER_FAMILIES,
    HIER_S_PER_ELEMENT,
    TOPK_CODEC_S_PER_ELEMENT,
    level_codec_key,
    level_cost_key,
    level_density,
    level_family,
    level_is_sparse,
    level_kind,
)

# weight of the newest step in the running estimates of throughput and codec cost
EMA = 0.5


@dataclass
class BucketRecord:
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
class StepRecord:
    t_first: float
    buckets: list[BucketRecord] = field(default_factory=list)
    t_enter_last: float | None = None
    exposed_s: float | None = None  # stats' comm_s_exposed of the step, read at the next step's start


@dataclass
class Measured:
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


class AdaptiveControl:
    """The measuring and deciding half of :class:`~workers.training.comm.adaptive.AdaptiveState` (a base
    class of it): it works on the state's options (``levels``, ``residual_bound``, ``persist``, ...), its
    per-parameter bookkeeping (``level_of``, ``last_switch``, ``banned``, ...), its running estimates
    (``throughput``, ``overhead_s``, ``codec_s``) and the step records the hook fills in."""

    # ---------------------------------------------------------------------------------- measurement

    def _measure(self) -> Measured | None:
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
        return Measured(
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

    def _learn(self, m: Measured, buckets: list[BucketRecord]) -> None:
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
            mine = [(w, t) for b, t, w, _ in rows if level_family(b.level) == family and t > 0]
            wire, secs = sum(w for w, _ in mine), sum(t for _, t in mine)
            if wire > 0 and secs > 0 and (family == "allreduce" or "link" not in self.throughput):
                self.throughput["link"] = ema(self.throughput.get("link"), wire / secs)
        link = self.throughput.get("link")
        for key in sorted({level_cost_key(b.level) for b, _, _, _ in rows}) if link else ():
            mine = [(b, t) for b, t, _, _ in rows if level_cost_key(b.level) == key]
            extra = [max(0.0, t - self.link_bytes(b.sizes, b.level) / link) for b, t in mine]
            if level_family(mine[0][0].level) in HIER_FAMILIES:  # grows with the bucket: per element
                new = sum(extra) / max(1, sum(b.elements for b, _ in mine))
            else:
                new = sum(extra) / len(extra)
            self.overhead_s[key] = ema(self.overhead_s.get(key), new)
        by_kind: dict[str, list[float]] = {}
        for b, _, _, sync in rows:
            k = by_kind.setdefault(level_codec_key(b.level), [0.0, 0.0])
            k[0], k[1] = k[0] + max(0.0, sync), k[1] + b.elements
        for kind, (secs, elements) in by_kind.items():
            if elements > 0:
                measured = kind in self.codec_measured
                self.codec_s[kind] = ema(self.codec_s[kind] if measured else None, secs / elements)
                self.codec_measured.add(kind)

    def codec(self, level: str) -> float:
        """Codec seconds per element of ``level`` on the autograd thread: measured at that level, else the
        prior of its kind (for top-k: ``TOPK_CODEC_S_PER_ELEMENT``, or another measured top-k level's)."""
        key = level_codec_key(level)
        if key in self.codec_measured:
            return self.codec_s[key]
        if level.startswith("topk@"):
            others = [self.codec_s[k] for k in sorted(self.codec_measured) if k.startswith("topk@")]
            if others:
                return sum(others) / len(others)
        return self.codec_s[level_kind(level)]

    # --------------------------------------------------------------------------------------- model

    def predict(self, m: Measured, buckets: list[BucketRecord], levels: list[str]) -> float:
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
        d = level_density(level)
        if not self.bound_scaling or d >= 0.1:
            return self.residual_bound
        return self.residual_bound * math.sqrt(0.1 / d)

    def denser(self, level: str) -> str:
        """Where a residual back-off goes from ``level``: the sparsest level of higher density on the same
        route (flat or through the hierarchy), else the sparsest of higher density."""
        before = [
            lvl
            for lvl in self.levels[: self.levels.index(level)]
            if level_density(lvl) > level_density(level)
        ]
        hier = level.startswith("hier")
        same = [lvl for lvl in before if lvl.startswith("hier") == hier]
        return (same or before or [self.levels[0]])[-1]

    def fixed_s(self, level: str, elements: int) -> float:
        """A transfer's cost beyond its uplink bytes at the measured rate: what was measured under its
        :func:`~workers.training.comm.adaptive_levels.level_cost_key` (the family, a top-k level itself),
        fixed seconds per bucket (flat) or per element x elements (hierarchical); before it is measured
        there, the mean of its family's other measured keys, else 0 for the flat families and the
        constants of :mod:`.adaptive_levels` for the hierarchical ones."""
        family, key = level_family(level), level_cost_key(level)
        same = [v for k, v in sorted(self.overhead_s.items()) if level_family(k) == family]
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
            over = level_is_sparse(level) and ratio > bound and self.levels.index(level) > 0
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
                        or (level_is_sparse(chosen[i]) and ratio > self.bound(chosen[i]) / 2)
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
