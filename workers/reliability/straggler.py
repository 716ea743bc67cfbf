"""Straggler / degraded-rank detection from live per-rank step timing (pure engine).

Fed, per optimizer step and per rank, the step's wall time and the part of it the rank spent blocked in
collectives (:mod:`workers.training.supervision.step_times` carries them from the ranks), it scores every rank
against its peers and flags a rank that keeps the others waiting.

Which signal. In synchronous data parallelism the gradient all-reduce lines the ranks up: every rank's step
takes (nearly) the same wall time, the slow one's included, so step time alone cannot name the straggler.
What differs is how the step splits: the slow rank arrives last at each collective and so *waits the
least*, while every healthy rank waits for it. The detector therefore compares each rank's **compute time**
``step_time - collective_wait`` (the time it was not waiting for anyone) with its peers': the straggler has
the most. When a rank is slowed anywhere in its loop (data, optimizer, a stop between two collectives) the
excess may land in its step ``s`` while its peers' waiting lands in their step ``s + 1``; compute time
still puts the excess on the slow rank only, since a peer's wait is subtracted from its own step. Without
a measured wait (``None``) compute falls back to the step time, which still finds a straggler where ranks
do not synchronise every step.

The rule, per rank (all thresholds in :class:`StragglerPolicy`):

1. *Excess, per step*: ``excess = c - median(c)`` over the ranks of the step (the first ``warmup_steps``
   steps of a run are skipped: lazy initialisation and allocator warm-up differ between ranks).
2. *Share, per bucket of about a second* (Minder's per-second view of its metrics): the rank's summed
   excess over the bucket's summed median step time, i.e. the fraction of the job's time in that bucket
   spent waiting for this rank. The bucket is *slow* for the rank when the share is at least ``min_share``
   **and** it is a peer outlier (Minder's "similarity": a faulty machine differs from its peers, Deng et
   al., NSDI 2025): its robust, modified z-score across the ranks' shares,
   ``z = (share - median) / (1.4826 * MAD)``, is at least 3.5, the cut-off Iglewicz & Hoaglin (1993)
   recommend for the modified z-score. The median is the bucket's; the MAD (scaled to a standard
   deviation under normality, Rousseeuw & Croux 1993; floored at ``share_floor``) is pooled over every
   rank's deviation in the last ``noise_buckets`` buckets, which a straggler among a majority of healthy
   ranks does not move much.
3. *Persistence* (Minder's "continuity"): flag when at least ``slow_buckets`` (2) of the last
   ``of_buckets`` (5) buckets were slow for the rank. A step's excess counts in the one bucket its step
   ends in, so one long step (a GC pause, a page-fault storm) is one slow bucket: never a flag. A flag
   clears when none of the last ``of_buckets`` buckets was slow.

The score in [0, 1] is the evidence the rule has: ``min(1, sum over the last buckets of
min(1, share / min_share) [where z >= 3.5] / slow_buckets)``; a flagged rank scores 1.

Limits, stated: the median needs a healthy majority among the ranks compared, and with fewer than
``min_ranks`` (default 3) ranks nothing is flagged (with two ranks, which one is "normal" is not decidable
from peers: rank 0 alone may do more, e.g. logging). A rank that stops for good stops every rank: no step
completes and this detector sees nothing; that is the hang watch's case (:mod:`workers.reliability.elastic`).
Several ranks slow together (a slow node of 8 ranks in a 16-rank job) are outliers as long as they are a
minority of the ranks compared.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from workers.training.supervision.step_times import StepTimesReader

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): MAD -> standard deviation under normality (Rousseeuw & Croux 1993)
MODIFIED_Z_OUTLIER = 3.5  # Iglewicz & Hoaglin 1993, "How to Detect and Handle Outliers", sec. 3.3


@dataclass(frozen=True)
class StragglerPolicy:
    """Thresholds of the flag rule. Defaults marked *assumption* are ours, checked on this repository's
    jobs (``bench/fault_detect.py`` measures them); the z cut-off and the MAD scale are from the
    literature."""

    bucket_s: float = 1.0
    """Seconds of steps per bucket (assumption: Minder scores per-second metrics; a step longer than this
    is a bucket of its own)."""
    min_share: float = 0.25
    """A bucket is slow for a rank when the others waited for it at least this fraction of the bucket
    (assumption). 0.1 (a job 10% slower because of one rank) flagged healthy ranks of the synthetic 8-rank
    jobs of ``tests/unit/test_straggler.py`` (30% jitter, a 3x hiccup in 1% of rank-steps: two hiccups of one
    rank in five seconds are two slow buckets), and 0.2 did when a rank's 0.8 s pause met one hiccup; 0.25
    flags none of them and still every degradation of ``bench/fault_detect.py`` (a 0.5 s stop shares 0.3-0.5
    of its bucket). A rank persistently 10-25% slower is not flagged: the limit of this choice."""
    z_threshold: float = MODIFIED_Z_OUTLIER
    noise_buckets: int = 10
    """The MAD is pooled over every rank's share in the last this many buckets (assumption): with a few
    ranks, the MAD of one bucket's handful of shares is itself noisy (one lucky rank inflates it)."""
    share_floor: float = 0.01
    """The spread of the ranks' shares is floored at this (1% of the bucket; assumption): with ranks
    nearly equal the MAD is ~0 and any difference would be an outlier."""
    slow_buckets: int = 2
    of_buckets: int = 5
    """Persistence: flag when ``slow_buckets`` of the last ``of_buckets`` buckets were slow (assumption;
    2 is the least that one long step cannot meet. Measured on the 4-rank bench job, 19 degradations and
    110 healthy buckets: 3 of 5 missed 3 degradations within 10 s, 2 of 5 none, and neither raised a
    false flag; no healthy bucket was slow, the largest healthy share was 0.07)."""
    warmup_steps: int = 5
    """Steps of each run (and each torchrun restart) not scored (assumption)."""
    min_ranks: int = 3
    """Fewer ranks than this: nothing is scored (see the module's limits)."""
    max_pending_steps: int = 256
    """Steps waiting for some rank's report beyond this many are dropped, oldest first."""

    def __post_init__(self) -> None:
        for name in ("bucket_s", "min_share", "z_threshold", "share_floor"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        for name in ("slow_buckets", "of_buckets", "noise_buckets", "max_pending_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.slow_buckets > self.of_buckets:
            raise ValueError(
                f"slow_buckets ({self.slow_buckets}) must not exceed of_buckets ({self.of_buckets})"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps!r}")
        if self.min_ranks < 2:
            raise ValueError(f"min_ranks must be >= 2 (a rank needs peers), got {self.min_ranks!r}")


@dataclass
class StragglerFlag:
    """One episode of a rank flagged as a straggler."""

    rank: int
    step: int
    """The step that closed the bucket whose evaluation raised the flag."""
    t: float
    """When that step ended (the ranks' clock, ``time.time()`` in :mod:`.step_times`)."""
    restart: int
    score: float
    share: float
    """The rank's share of the flagging bucket (fraction of its time the others waited for this rank)."""
    slow_buckets: int
    signal: str
    """``compute`` (step minus collective wait) or ``step_time`` (no wait measured)."""
    reason: str
    cleared_step: int | None = None
    cleared_t: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Bucket:
    """Steps of about ``bucket_s`` seconds, summed per rank."""

    sum_excess: np.ndarray
    sum_median: float = 0.0
    steps: int = 0
    t_start: float | None = None
    t_end: float = 0.0


@dataclass
class _Closed:
    share: np.ndarray
    z: np.ndarray
    slow: np.ndarray
    evidence: np.ndarray
    seconds: float
    steps: int


@dataclass
class _RankState:
    score: float = 0.0
    share: float = 0.0
    slow_buckets: int = 2
    flag: StragglerFlag | None = None  # the open episode, if flagged now


@dataclass
class StragglerDetector:
    """Online detector for one job of ``world_size`` ranks. Feed :meth:`observe` in any order across ranks;
    a step is scored once every rank has reported it, a bucket when a step ends ``bucket_s`` after the
    bucket's start. Not thread-safe (one feeder). Cost: O(world_size) per reported step."""

    world_size: int
    policy: StragglerPolicy = field(default_factory=StragglerPolicy)

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {self.world_size!r}")
        self.restart = 0
        self.steps_scored = 0
        self.buckets_scored = 0
        self.flags: list[StragglerFlag] = []  # every episode, open and cleared, in order
        self.cleared: list[StragglerFlag] = []
        """Episodes cleared since the caller last emptied this list (a watch reports each once)."""
        self._pending: dict[int, dict[int, tuple[float, float | None, float]]] = {}
        self._ranks = [_RankState() for _ in range(self.world_size)]
        self._signal = "compute"
        self._reset()

    def _reset(self) -> None:
        """A new run of the group (start, torchrun restart): buckets and warm-up start again."""
        self._seen_steps = 0
        self._bucket = _Bucket(np.zeros(self.world_size))
        self._closed: deque[_Closed] = deque(maxlen=self.policy.of_buckets)
        self._deviations: deque[np.ndarray] = deque(maxlen=self.policy.noise_buckets)

    # ------------------------------------------------------------------------------------------- input

    def observe(
        self,
        *,
        rank: int,
        step: int,
        step_time_s: float,
        collective_wait_s: float | None = None,
        t: float | None = None,
        restart: int = 0,
    ) -> list[StragglerFlag]:
        """Rank ``rank`` finished ``step`` (of torchrun restart ``restart``) in ``step_time_s`` seconds,
        ``collective_wait_s`` of them blocked in collectives (None: not measured), at time ``t`` (default
        now). Returns the flags this report raised (when it completed a bucket that raised some)."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an integer in [0, {self.world_size}), got {rank!r}")
        for name, v in (("step_time_s", step_time_s), ("collective_wait_s", collective_wait_s)):
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
        if step_time_s is None:
            raise ValueError("step_time_s must be a number of seconds, got None")
        if restart < self.restart:
            return []  # a late line of a group torchrun has since restarted
        if restart > self.restart:  # the group re-formed and counts steps again from its snapshot
            self.restart = restart
            self._pending.clear()
            self._reset()
        samples = self._pending.setdefault(int(step), {})
        samples[rank] = (float(step_time_s), collective_wait_s, time.time() if t is None else float(t))
        if len(samples) < self.world_size:
            if len(self._pending) > self.policy.max_pending_steps:
                del self._pending[min(self._pending)]  # a step some rank never reported (it died)
            return []
        del self._pending[step]
        self._seen_steps += 1
        if self.world_size < self.policy.min_ranks or self._seen_steps <= self.policy.warmup_steps:
            return []
        return self._score_step(int(step), samples)

    # -------------------------------------------------------------------------------------- the rule

    def _score_step(
        self, step: int, samples: dict[int, tuple[float, float | None, float]]
    ) -> list[StragglerFlag]:
        ranks = range(self.world_size)
        d = np.array([samples[r][0] for r in ranks])
        waits = [samples[r][1] for r in ranks]
        if all(w is not None for w in waits):
            c = np.maximum(d - np.array(waits, dtype=float), 0.0)
            self._signal = "compute"
        else:
            c = d
            self._signal = "step_time"
        median_step = float(np.median(d))
        t = max(samples[r][2] for r in ranks)
        b = self._bucket
        if b.t_start is None:
            b.t_start = t - median_step
        b.sum_excess += c - np.median(c)
        b.sum_median += median_step
        b.steps += 1
        b.t_end = t
        self.steps_scored += 1
        if b.t_end - b.t_start < self.policy.bucket_s:
            return []
        self._bucket = _Bucket(np.zeros(self.world_size), t_start=t)
        return self._close(b, step, t)

    def _close(self, b: _Bucket, step: int, t: float) -> list[StragglerFlag]:
        p = self.policy
        share = b.sum_excess / b.sum_median if b.sum_median > 0 else np.zeros(self.world_size)
        med = float(np.median(share))
        self._deviations.append(np.abs(share - med))
        mad = float(np.median(np.concatenate(self._deviations)))
        z = (share - med) / max(MAD_TO_SIGMA * mad, p.share_floor)
        slow = (share >= p.min_share) & (z >= p.z_threshold)
        evidence = np.where(z >= p.z_threshold, np.minimum(1.0, np.maximum(share, 0.0) / p.min_share), 0.0)
        self._closed.append(_Closed(share, z, slow, evidence, b.t_end - b.t_start, b.steps))
        self.buckets_scored += 1
        raised = []
        for r, st in enumerate(self._ranks):
            st.share = float(share[r])
            st.slow_buckets = sum(int(c.slow[r]) for c in self._closed)
            st.score = min(1.0, sum(float(c.evidence[r]) for c in self._closed) / p.slow_buckets)
            if st.flag is None and st.slow_buckets >= p.slow_buckets:
                st.flag = StragglerFlag(
                    rank=r,
                    step=step,
                    t=t,
                    restart=self.restart,
                    score=round(st.score, 4),
                    share=round(st.share, 4),
                    slow_buckets=st.slow_buckets,
                    signal=self._signal,
                    reason=self._reason(r, st),
                )
                self.flags.append(st.flag)
                raised.append(st.flag)
            elif st.flag is not None and st.slow_buckets == 0:
                st.flag.cleared_step, st.flag.cleared_t = step, t
                self.cleared.append(st.flag)
                st.flag = None
        return raised

    def _reason(self, rank: int, st: _RankState) -> str:
        slow = [c for c in self._closed if c.slow[rank]]
        mean_share = sum(float(c.share[rank]) for c in slow) / len(slow)
        seconds = sum(c.seconds for c in self._closed)
        zmin = min(float(c.z[rank]) for c in slow)
        if self._signal == "compute":
            what, tail = (
                "computing (not waiting) beyond the median rank",
                "the other ranks wait for it in collectives",
            )
        else:
            what, tail = (
                "in steps longer than the median rank's",
                "no collective wait was measured: step time only",
            )
        return (
            f"rank {rank} spent on average {mean_share:.0%} of the time {what} in {len(slow)} of the last "
            f"{len(self._closed)} buckets ({seconds:.1f} s; z >= {zmin:.1f} in each): {tail}"
        )

    # ------------------------------------------------------------------------------------------ output

    def scores(self) -> dict[int, float]:
        return {r: st.score for r, st in enumerate(self._ranks)}

    def flagged(self) -> dict[int, StragglerFlag]:
        """The ranks flagged now (open episodes)."""
        return {r: st.flag for r, st in enumerate(self._ranks) if st.flag is not None}

    def report(self) -> dict:
        """JSON-ready: per rank ``{rank, score, share, slow_buckets, flagged, reason}`` (``share``: of the
        last bucket), every flag episode, the steps scored and the policy."""
        ranks = [
            {
                "rank": r,
                "score": round(st.score, 4),
                "share": round(st.share, 4),
                "slow_buckets": st.slow_buckets,
                "flagged": st.flag is not None,
                "reason": st.flag.reason if st.flag is not None else None,
            }
            for r, st in enumerate(self._ranks)
        ]
        return {
            "ranks": ranks,
            "flags": [f.to_dict() for f in self.flags],
            "steps_scored": self.steps_scored,
            "buckets_scored": self.buckets_scored,
            "signal": self._signal,
            "policy": asdict(self.policy),
        }


class StragglerWatch:
    """Follows the ranks' step-time files in a progress directory and feeds a :class:`StragglerDetector`.

    Call :meth:`poll` from the supervisor's poll loop (beside ``ElasticWatch.poll``); ``on_flag`` gets each
    new flag as a dict with ``detected_unix`` (this process's clock when the flag was seen) added."""

    def __init__(
        self,
        progress_dir: str | Path,
        world_size: int,
        *,
        policy: StragglerPolicy | None = None,
        on_flag: Callable[[dict], None] = lambda flag: None,
        clock: Callable[[], float] = time.time,
    ):
        self.reader = StepTimesReader(progress_dir)
        self.detector = StragglerDetector(world_size, policy or StragglerPolicy())
        self.on_flag = on_flag
        self._clock = clock
        self.detections: list[dict] = []
        self.samples = 0

    def poll(self) -> list[dict]:
        new = []
        for line in self.reader.read_new():
            if line.get("step_s") is None:
                continue  # a rank's first line has nothing to measure from
            try:
                raised = self.detector.observe(
                    rank=int(line["rank"]),
                    step=int(line["step"]),
                    step_time_s=float(line["step_s"]),
                    collective_wait_s=None if line.get("wait_s") is None else float(line["wait_s"]),
                    t=float(line.get("t", self._clock())),
                    restart=int(line.get("restart", 0)),
                )
            except (ValueError, TypeError, KeyError):
                continue  # a line from a rank outside this job's world, or malformed
            self.samples += 1
            for flag in raised:
                d = {**flag.to_dict(), "detected_unix": self._clock()}
                self.detections.append(d)
                new.append(d)
                self.on_flag(d)
        return new
