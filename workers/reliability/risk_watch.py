"""One node's fault-risk loop, run by the node's supervisor beside the recovery watch (pure engine).

:class:`NodeRiskWatch` is polled from :func:`workers.training.supervision.supervisor.supervise` (``on_poll``), on the
supervisor's thread, while the node's ranks train:

- **telemetry**: a :class:`~workers.reliability.telemetry.sampler.TelemetrySampler` samples this node's
  sources (psutil, NVML, npu-smi; each absent one says why) and the job's own signals (per-rank step time,
  collective wait, heartbeat age, fed from the ranks' step lines) every ``telemetry_every_s`` on a background
  thread, under its CPU budget; :meth:`poll` publishes each sample as a ``telemetry`` event. What the
  sources cannot give (``absent``) is sent with the first sample and again only when it changes.
- **straggler risk**: the ranks' step lines (:mod:`.step_times`) feed a
  :class:`~workers.reliability.straggler.StragglerDetector`; a rank flagged, or cleared, is a ``risk`` event
  at once, and every sample interval a ``risk`` event carries each rank's score.
- **failure risk** (optional): a trained failure model (``cann-train faults train``; loaded with
  :func:`workers.reliability.risk.evaluate.load_model`) scores the node's telemetry over its horizon through
  :class:`~workers.reliability.risk.live.LiveRiskScorer`. Without one the risk event says so: the node's risk
  is then the straggler score alone, never a made-up figure.

The node's risk is the larger of the two; its level follows issue 14's tiers: ``high`` at 0.85 (act),
``medium`` at 0.6 (warn), else ``low``.

**Prevention** (:class:`PreventionPolicy`, per job: ``act`` or ``observe``). Each action is a ``risk``
event with an ``action`` (``{"action", "status", "reason", "risk", "at_unix", ...}``), kept in
:attr:`NodeRiskWatch.actions`, with its outcome when it has one:

- ``warn`` at 0.6, once per episode (an episode ends when the risk falls below 0.6 again);
- ``snapshot-now`` at 0.85, once per episode and at most every ``snapshot_cooldown_s``: the node's ranks are
  asked for a snapshot off the job's cadence (:mod:`.snapshot_now`); its outcome is the step it was taken
  at, the stall it cost and the steps it protects (those since the snapshot before it: what a failure of
  the node would otherwise have cost the job). ``refused`` for a job that takes no snapshots, ``observed``
  (not taken) under the ``observe`` policy, ``unanswered`` when the ranks did not take it within
  ``answer_timeout_s``.

- ``drain`` once that snapshot is taken: the node of each flagged rank (before any flag, of the rank whose
  score is the risk; this node when the failure model's risk is the higher) is taken out of an elastic job
  through the ``drain`` callback (the control plane's ``node_drain``), and the job goes on on the nodes left
  from that snapshot; ``refused`` with the callback's reason where it cannot be (a job that is not elastic,
  node 0, too few nodes left), ``observed`` under ``observe``.

Rebalancing a straggler (shifting micro-batches) is not built yet.

**A stall** (:meth:`NodeRiskWatch.stall`): the straggler detector scores the steps the ranks commit, so a rank
that commits none (hung, stopped, deadlocked: its peers then wait in their collectives and commit none
either) would keep the last score it had. While the group is training, no step line for
``max(STALL_FLOOR_S, STALL_STEPS x the median step time)`` raises the risk to ``warn_at``, rising to
``act_at`` at twice that (and 1.0 a little later); the stopped ranks (SIGSTOP, a debugger) are named,
else every rank of the group. Each change of its level is a ``risk`` event at once (not at the next
telemetry sample). A stall is no time for a snapshot (the ranks cannot take one): at ``act_at`` the action
is ``cut-hang`` instead, which asks the recovery watch (``cut_hang``) to treat the stall as the hang it is
once it has lasted ``max(cut_hang_min_s, twice the stall threshold, a quarter of the hang timeout)``, well
before the job's hang timeout; ``observed`` under ``observe``.

Which ranks. Every rank of the job writes its step lines into the progress directory of the node it runs on,
so a node's watch compares its own ranks (a straggler among a node's 8 ranks). Where nodes share the
directory (one machine, a shared filesystem: the watch sees more ranks than the node runs), only node 0's
watch scores them, over every rank of the job, and the others publish telemetry only.

Events (``workers/events.py``; ``values``)::

    telemetry: {"node", "node_rank", "attempt", "sampled_at", "source", "metrics", ["absent"], ["info"], "cost"}
    risk:      {"node", "node_rank", "attempt", "risk", "level", "ranks": [{"rank", "score", "share",
                "flagged", "reason"}...], "straggler": {"signal", "steps_scored", ...},
                "failure": {"risk", "model", "trained_on", "horizon_s", ...} | {"absent": why},
                ["flag": the flag just raised or cleared], "stall": {"stalled_s", "expected_s", "score",
                "ranks", "stopped", "step"} | None}
"""

from __future__ import annotations

import logging
import queue
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from workers.reliability.risk.policy import ACT_RISK, WARN_RISK, PreventionPolicy, risk_level
from workers.reliability.straggler import StragglerDetector, StragglerPolicy
from workers.reliability.telemetry.base import TelemetrySample
from workers.reliability.telemetry.job import JobSignals
from workers.reliability.telemetry.sampler import DEFAULT_INTERVAL_S, TelemetrySampler, collectors_for_node
from workers.training.supervision import snapshot_now
from workers.training.supervision.progress import read_progress
from workers.training.supervision.step_times import StepTimesReader

log = logging.getLogger(__name__)

Publish = Callable[[str, dict[str, Any], int | None], None]
"""``publish(kind, values, step)``: put an event on the job's stream."""


def _int_or(value, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


GROUP_FORMED_AFTER_STEPS = 3
"""Steps past a torchrun group's first step line after which its ranks are taken as known (see
:meth:`NodeRiskWatch._form_group`; 3, not 1, so that a rank's file read a moment before its line was
written cannot leave it out)."""


STALL_FLOOR_S = 4.0
"""No step committed for this long (at least) while training is a stall: above the README's straggler
detection time (1.9-3.7 s), and above the pauses a loaded 2-core machine gives a healthy group."""
STALL_STEPS = 10
"""... or for this many of the group's median step times, where that is longer (slow steps)."""


def _stopped(pid) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a tracer): a rank that cannot commit a step."""
    try:
        return psutil.Process(int(pid)).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except (psutil.Error, TypeError, ValueError):
        return False


class NodeRiskWatch:
    def __init__(
        self,
        progress_dir: str | Path,
        *,
        node: str,
        node_rank: int,
        local_ranks: int,
        publish: Publish,
        attempt: int = 1,
        telemetry_every_s: float = DEFAULT_INTERVAL_S,
        straggler_policy: StragglerPolicy | None = None,
        failure_model=None,
        failure_model_absent: str = "no failure model is configured (train one: cann-train faults train)",
        collectors: list | None = None,
        prevention: PreventionPolicy | None = None,
        protected: bool = False,
        drain: Callable[[str, str], dict] | None = None,
        cut_hang: Callable[[float, str], dict] | None = None,
        hang_timeout_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ):
        """``protected``: the job takes snapshots (a snapshot now is possible, and a failure costs steps, not
        the run). ``drain(node, reason) -> {"status": "done" | "refused", "note", ...}`` takes a node out of
        the job (None: no one can; a drain is then refused saying so). ``cut_hang(after_s, reason) ->
        {"status": "requested" | "refused", ...}``: the recovery watch's :meth:`ElasticWatch.cut_hang`, which
        kills a stalled group after ``after_s`` (``hang_timeout_s``: the job's, which a cut comes before)."""
        if local_ranks < 1:
            raise ValueError(f"local_ranks must be >= 1, got {local_ranks!r}")
        self.dir = Path(progress_dir)
        self.node, self.node_rank, self.local_ranks = node, int(node_rank), int(local_ranks)
        self.attempt = int(attempt)
        self.publish = publish
        self.policy = straggler_policy or StragglerPolicy()
        self.prevention = prevention or PreventionPolicy()
        self.drain = drain
        self.cut_hang = cut_hang
        self.hang_timeout_s = hang_timeout_s
        self.protected = bool(protected)
        self._last_line_unix: float | None = None  # when the newest step line was written
        self._recent_step_s: deque[float] = deque(maxlen=64)
        self._stall: dict | None = None  # the stall as of the last poll
        self._stall_level: str | None = None
        self._stall_cut = False  # this stall's cut-hang action was taken
        self.actions: list[dict] = []
        self._warned = False  # the open episode (risk >= warn_at) was warned about
        self._acted = False  # ... and acted on (risk >= act_at)
        self._request: dict | None = None  # the snapshot-now action waiting for the ranks' answer
        self._last_request_unix: float | None = None
        self._clock = clock
        self.reader = StepTimesReader(self.dir)
        self.signals = JobSignals()
        self.detector: StragglerDetector | None = None
        self._ranks: list[int] = []  # the job ranks the detector compares, in index order
        self._index: dict[int, int] = {}
        self._group_restart: int | None = None  # the torchrun restart whose group the detector compares
        self._forming: dict | None = None  # a newer group's first lines, until its ranks are known
        self.scoring = True  # False: another node's watch scores the shared directory
        self.flags: list[dict] = []
        self.published = {"telemetry": 0, "risk": 0}
        self.publish_errors = 0
        self.lines_dropped = 0
        """Step lines refused as malformed (reported in :meth:`report`)."""
        self.last_step: int | None = None
        self._samples: queue.SimpleQueue[TelemetrySample] = queue.SimpleQueue()
        self._absent_sent: dict[str, str] | None = None
        self.scorer = None
        self.failure_absent = failure_model_absent
        if failure_model is not None:
            from workers.reliability.risk.live import LiveRiskScorer

            self.scorer = LiveRiskScorer(failure_model)
        self.sampler = TelemetrySampler(
            collectors if collectors is not None else collectors_for_node(job=self.signals),
            callback=self._samples.put,
            interval_s=telemetry_every_s,
            node=node,
        )

    # ------------------------------------------------------------------------------------------ running

    def start(self) -> NodeRiskWatch:
        self.sampler.start()
        return self

    def stop(self) -> None:
        self.sampler.stop()
        self.poll()  # the samples and flags of the last interval
        # and the node's risk as the attempt ends: a job shorter than one sampling interval has only the
        # sample taken at start, before any step, so without this its last risk would know no rank
        self._publish_risk()

    def __enter__(self) -> NodeRiskWatch:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def poll(self) -> None:
        """Read the ranks' new step lines, score them, publish what is new (on the caller's thread)."""
        # the reader gives each rank's lines in turn; the detector and a forming group want them step by step
        lines = sorted(
            self.reader.read_new(), key=lambda d: (_int_or(d.get("restart"), 0), _int_or(d["step"], 0))
        )
        for line in lines:
            self._observe(line)
        self._stall = self.stall()
        level = None if self._stall is None else risk_level(self._stall["score"])
        if level != self._stall_level:  # a stall begun, risen or over: said at once
            self._stall_level = level
            if self._stall is None:
                self._stall_cut = False
            self._publish_risk()
        while True:
            try:
                sample = self._samples.get_nowait()
            except queue.Empty:
                break
            self._publish_sample(sample)
        if self._request is not None:
            self._follow_request()

    def stall(self) -> dict | None:
        """The group's stall now (module docstring), or None: it committed a step recently enough, it is not
        training (starting, resuming, finishing: no step is due), or it has not formed."""
        if (
            not self.scoring
            or self.detector is None
            or self._last_line_unix is None
            or not self._recent_step_s
        ):
            return None
        stalled = self._clock() - self._last_line_unix
        expected = max(STALL_FLOOR_S, STALL_STEPS * statistics.median(self._recent_step_s))
        if stalled < expected:
            return None
        docs = read_progress(self.dir)
        newest = max((_int_or(d.get("restart"), 0) for d in docs.values()), default=0)
        group = {r: d for r, d in docs.items() if r in self._index and _int_or(d.get("restart"), 0) == newest}
        if not group or any(d.get("phase") != "training" for d in group.values()):
            return None
        stopped = [r for r, d in sorted(group.items()) if _stopped(d.get("pid"))]
        score = min(1.0, WARN_RISK + (ACT_RISK - WARN_RISK) * (stalled / expected - 1.0))
        return {
            "stalled_s": round(stalled, 3),
            "expected_s": round(expected, 3),
            "score": round(score, 4),
            "ranks": stopped or sorted(group),
            "stopped": bool(stopped),
            "step": self.last_step,
        }

    # ---------------------------------------------------------------------------------------- the ranks

    def _observe(self, line: dict) -> None:
        rank, step_s = line.get("rank"), line.get("step_s")
        if not isinstance(rank, int) or step_s is None:
            return
        wait = line.get("wait_s")
        try:
            step, restart = int(line["step"]), int(line.get("restart", 0))
            self.signals.record_step(rank=rank, step=step, step_time_s=float(step_s), collective_wait_s=wait)
        except (ValueError, TypeError, KeyError):
            self.lines_dropped += 1  # malformed (a cut line is never returned by the reader): counted
            return
        self.last_step = max(self.last_step or 0, step)
        written = line.get("t")
        written = float(written) if isinstance(written, int | float) else self._clock()
        self._last_line_unix = max(self._last_line_unix or 0.0, written)
        self._recent_step_s.append(float(step_s))
        if self._group_restart is not None and restart < self._group_restart:
            return  # a late line of a group torchrun has since restarted
        forming = self._forming
        if self._group_restart is None or restart > self._group_restart:
            if forming is None or restart > forming["restart"]:
                forming = self._forming = {
                    "restart": restart,
                    "ranks": set(),
                    "lo": step,
                    "hi": step,
                    "lines": [],
                }
        if forming is not None and restart == forming["restart"]:
            forming["ranks"].add(rank)
            forming["lo"], forming["hi"] = min(forming["lo"], step), max(forming["hi"], step)
            forming["lines"].append(line)
            if forming["hi"] >= forming["lo"] + GROUP_FORMED_AFTER_STEPS:
                self._form_group(forming)
            return
        self._score(line)

    def _form_group(self, forming: dict) -> None:
        """The detector over the ranks of one torchrun group (a restart). A group steps in lock-step, so
        once any rank is ``GROUP_FORMED_AFTER_STEPS`` steps past the group's first line, every rank still in
        it has written lines of this restart; ranks whose files hold only older restarts (a drained node's,
        a shrunk world's) are not compared, and would otherwise keep every step from ever completing."""
        seen = sorted(forming["ranks"])
        self._forming = None
        self._group_restart = forming["restart"]
        self._ranks = seen
        self._index = {r: i for i, r in enumerate(seen)}
        shared = len(seen) > self.local_ranks
        self.scoring = not shared or self.node_rank == 0
        self.detector = StragglerDetector(max(1, len(seen)), self.policy) if self.scoring else None
        for line in forming["lines"]:
            self._score(line)

    def _score(self, line: dict) -> None:
        rank = line["rank"]
        if self.detector is None or rank not in self._index:
            return
        wait = line.get("wait_s")
        try:
            raised = self.detector.observe(
                rank=self._index[rank],
                step=int(line["step"]),
                step_time_s=float(line["step_s"]),
                collective_wait_s=None if wait is None else float(wait),
                t=float(line.get("t") or self._clock()),
                restart=int(line.get("restart", 0)),
            )
        except (ValueError, TypeError):
            self.lines_dropped += 1
            return
        cleared, self.detector.cleared = self.detector.cleared, []
        for flag in raised:
            self._send_flag(flag, "raised")
        for flag in cleared:
            self._send_flag(flag, "cleared")

    def _send_flag(self, flag, what: str) -> None:
        d = {**flag.to_dict(), "rank": self._ranks[flag.rank], "event": what, "detected_unix": self._clock()}
        d["reason"] = d["reason"].replace(f"rank {flag.rank} ", f"rank {d['rank']} ", 1)
        if what == "raised":
            self.flags.append(d)
        self._publish_risk(flag=d)

    # ------------------------------------------------------------------------------------------ events

    def _send(self, kind: str, values: dict, step: int | None) -> None:
        try:
            self.publish(kind, values, step)
            self.published[kind] += 1
        except Exception:  # noqa: BLE001 - a publishing failure must not stop the watch or the training
            self.publish_errors += 1
            if self.publish_errors == 1:
                log.warning("node %s: %s event not published", self.node, kind, exc_info=True)

    def _publish_sample(self, sample: TelemetrySample) -> None:
        values = {**sample.to_event_values(), "node_rank": self.node_rank, "attempt": self.attempt}
        if values.get("absent") == self._absent_sent:
            values.pop("absent", None)  # unchanged since it was last sent
        else:
            self._absent_sent = dict(values.get("absent") or {})
        self._send("telemetry", values, self.last_step)
        if self.scorer is not None:
            self.scorer.add(sample)
        self._publish_risk()

    def ranks_report(self) -> list[dict]:
        if self.detector is None:
            return []
        report = self.detector.report()["ranks"]
        for row in report:
            job_rank = self._ranks[row["rank"]]
            row["rank"] = job_rank
            if row["reason"]:
                row["reason"] = row["reason"].replace(
                    f"rank {self._index[job_rank]} ", f"rank {job_rank} ", 1
                )
        return report

    def failure_risk(self) -> dict:
        if self.scorer is None:
            return {"absent": self.failure_absent}
        scored = self.scorer.score(self.node)
        if scored is None:
            return {"absent": "no telemetry sample yet", "model": self.scorer.model.name}
        kept = scored["samples"]
        needed = self.scorer.keep
        if kept < needed:  # the model's window is not filled yet: its figure would not mean what it says
            return {
                "absent": f"{kept} of the {needed} samples {self.scorer.interval_s:.0f} s apart the model "
                "scores are in so far",
                "model": scored["model"],
                "trained_on": scored["trained_on"],
            }
        return scored

    def _stalled_ranks(self, ranks: list[dict]) -> list[dict]:
        """``ranks`` (:meth:`ranks_report`) with the stalled ones scored and flagged by the stall."""
        stall = self._stall
        if stall is None:
            return ranks
        for row in ranks:
            if row["rank"] in stall["ranks"]:
                row["score"] = max(row.get("score") or 0.0, stall["score"])
                row["flagged"] = True
                row["reason"] = (
                    f"rank {row['rank']} committed no step for {stall['stalled_s']:.1f} s (one was due within "
                    f"{stall['expected_s']:.1f} s)" + (": its process is stopped" if stall["stopped"] else "")
                )
        return ranks

    def _publish_risk(self, *, flag: dict | None = None) -> None:
        if not self.scoring:
            return
        ranks = self._stalled_ranks(self.ranks_report())
        failure = self.failure_risk()
        parts = (
            [r["score"] for r in ranks]
            + ([failure["risk"]] if "risk" in failure else [])
            + ([self._stall["score"]] if self._stall is not None else [])
        )
        risk = round(max(parts), 4) if parts else None
        det = self.detector
        values: dict[str, Any] = {
            "node": self.node,
            "node_rank": self.node_rank,
            "attempt": self.attempt,
            "risk": risk,
            "level": risk_level(risk),
            "ranks": ranks,
            "straggler": {
                "signal": det.report()["signal"] if det is not None else None,
                "steps_scored": det.steps_scored if det is not None else 0,
                "buckets_scored": det.buckets_scored if det is not None else 0,
                "min_ranks": self.policy.min_ranks,
                **(
                    {
                        "absent": f"{len(self._ranks)} rank(s): a straggler needs at least {self.policy.min_ranks} to compare"
                    }
                    if len(self._ranks) < self.policy.min_ranks
                    else {}
                ),
            },
            "failure": failure,
            "stall": self._stall,
        }
        if flag is not None:
            values["flag"] = flag
        self._send("risk", values, self.last_step)
        self._prevent(risk, ranks, failure)

    # -------------------------------------------------------------------------------------- prevention

    def _why(self, risk: float, ranks: list[dict], failure: dict) -> str:
        flagged = [r["reason"] for r in ranks if r.get("flagged") and r.get("reason")]
        if flagged:
            return f"risk {risk:.2f}: {flagged[0]}"
        if "risk" in failure and failure["risk"] >= risk:
            return (
                f"risk {risk:.2f}: the {failure.get('model')} failure model over {failure.get('horizon_s')} s"
            )
        top = max(ranks, key=lambda r: r["score"], default=None)
        return f"risk {risk:.2f}: rank {top['rank']}'s straggler score" if top else f"risk {risk:.2f}"

    def _action(self, action: str, status: str, risk: float | None, reason: str, **more) -> dict:
        d = {
            "action": action,
            "status": status,
            "risk": risk,
            "reason": reason,
            "at_unix": self._clock(),
            **more,
        }
        self.actions.append(d)
        self._send(
            "risk",
            {"node": self.node, "node_rank": self.node_rank, "attempt": self.attempt, "risk": risk,
             "level": risk_level(risk), "action": d},
            self.last_step,
        )  # fmt: skip
        return d

    def _prevent(self, risk: float | None, ranks: list[dict], failure: dict) -> None:
        p = self.prevention
        if risk is None or risk < p.warn_at:
            self._warned = self._acted = False  # the episode is over
            return
        why = self._why(risk, ranks, failure)
        if not self._warned:
            self._warned = True
            self._action("warn", "sent", risk, why)
        if self._stall is not None and self._stall["score"] >= risk:
            if risk >= p.act_at:
                self._cut_stall(risk, why)
            return  # stalled ranks take no snapshot: the stall is cut, not snapshotted
        if risk < p.act_at or self._acted:
            return
        now = self._clock()
        if p.mode == "observe":
            self._acted = True
            self._action("snapshot-now", "observed", risk, why, note="the job's risk policy is observe only")
            for node in self.nodes_to_drain(ranks, failure, risk):
                self._action(
                    "drain",
                    "observed",
                    risk,
                    why,
                    drain_node=node,
                    note="the job's risk policy is observe only",
                )
        elif not self.protected:
            self._acted = True
            self._action(
                "snapshot-now",
                "refused",
                risk,
                why,
                note="the job takes no snapshots: nothing to protect it with",
            )
        elif self._request is None and (
            self._last_request_unix is None or now - self._last_request_unix >= p.snapshot_cooldown_s
        ):
            self._acted = True
            self._last_request_unix = now
            rid = snapshot_now.request_snapshot(self.dir, reason=why)
            self._request = self._action(
                "snapshot-now",
                "requested",
                risk,
                why,
                request=rid,
                at_step=self.last_step,
                nodes=self.nodes_to_drain(ranks, failure, risk),
            )

    def _cut_stall(self, risk: float, why: str) -> None:
        """``cut-hang``, once a stall: the recovery watch kills the stalled group after ``after_s`` (sooner
        than the job's hang timeout), and torchrun restarts it from its newest snapshot."""
        if self._stall_cut:
            return
        self._stall_cut = True
        p = self.prevention
        after_s = max(p.cut_hang_min_s, 2.0 * self._stall["expected_s"])
        if self.hang_timeout_s:
            after_s = max(after_s, self.hang_timeout_s * p.cut_hang_share)
        after_s = round(after_s, 3)
        if p.mode == "observe":
            self._action("cut-hang", "observed", risk, why, after_s=after_s,
                         note="the job's risk policy is observe only")  # fmt: skip
        elif self.cut_hang is None:
            self._action(
                "cut-hang", "refused", risk, why, after_s=after_s, note="nothing can cut a hang here"
            )
        else:
            try:
                answer = dict(self.cut_hang(after_s, why))
            except Exception as exc:  # noqa: BLE001 - the recovery watch's refusal is the action's outcome
                answer = {"status": "refused", "note": f"the cut failed: {type(exc).__name__}: {exc}"}
            status = answer.pop("status", "refused")
            self._action("cut-hang", status, risk, why, **{"after_s": after_s, **answer})

    def nodes_to_drain(self, ranks: list[dict], failure: dict, risk: float) -> list[str]:
        """The nodes to drain: this node when its failure risk is what crossed the line; else those of the
        flagged ranks, or, while the detector has flagged none yet, of the ranks whose straggler score is the
        risk (a rank's score can cross ``act_at`` a bucket before its flag: draining this node then took
        the wrong one out, or had the drain refused on node 0, CI 2026-12-06), as their progress files name
        them."""
        if "risk" in failure and failure["risk"] >= risk:
            return [self.node]
        culprits = [r["rank"] for r in ranks if r.get("flagged")] or [
            r["rank"] for r in ranks if r.get("score") is not None and r["score"] >= risk
        ]
        if not culprits:
            return [self.node]
        progress = read_progress(self.dir)
        return sorted({str(progress.get(r, {}).get("node") or self.node) for r in culprits})

    def _drain_node(self, node: str, req: dict) -> None:
        """Once the snapshot is taken: the node goes, and the job goes on from that snapshot elsewhere."""
        if self.drain is None:
            self._action(
                "drain",
                "refused",
                req["risk"],
                req["reason"],
                drain_node=node,
                note="nothing can drain a node here",
            )
            return
        try:
            answer = dict(self.drain(node, req["reason"]))
        except Exception as exc:  # noqa: BLE001 - the control plane's failure is the action's outcome
            answer = {"status": "refused", "note": f"the drain failed: {type(exc).__name__}: {exc}"}
        status = answer.pop("status", "refused")
        self._action("drain", status, req["risk"], req["reason"], drain_node=node, **answer)

    def _follow_request(self) -> None:
        req = self._request
        done = snapshot_now.answer(self.dir, req["request"])
        if done is not None:
            self._request = None
            previous = done.get("previous_step")
            self._action(
                "snapshot-now",
                "done",
                req["risk"],
                req["reason"],
                request=req["request"],
                outcome={
                    "step": done["step"],
                    "snapshot": done.get("name"),
                    "stall_s": done.get("stall_s"),
                    "seconds_after_request": round(done["at_unix"] - req["at_unix"], 3),
                    "previous_snapshot_step": previous,
                    # what a failure of the node now no longer costs: the steps since the snapshot before
                    "steps_protected": None if previous is None else done["step"] - previous,
                },
            )
            for node in req.get("nodes") or []:
                self._drain_node(node, req)
        elif self._clock() - req["at_unix"] > self.prevention.answer_timeout_s:
            self._request = None
            self._action(
                "snapshot-now",
                "unanswered",
                req["risk"],
                req["reason"],
                request=req["request"],
                note=f"the ranks took no snapshot within {self.prevention.answer_timeout_s:.0f} s",
            )

    def report(self) -> dict:
        """JSON-ready: what the watch saw (flags raised, events published) and what telemetry cost."""
        return {
            "node": self.node,
            "flags": self.flags,
            "published": dict(self.published),
            "publish_errors": self.publish_errors,
            "lines_dropped": self.lines_dropped,
            "actions": self.actions,
            "prevention": asdict(self.prevention),
            "telemetry": self.sampler.describe(),
            "scored_ranks": self._ranks if self.scoring else [],
        }
