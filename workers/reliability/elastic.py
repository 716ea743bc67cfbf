"""Recovery by whole-group restart from snapshots: watch the ranks of one node, find a dead or hung rank,
let torchrun restart the group, and time what it cost.

torchrun runs with ``--max-restarts N``: when a rank process exits with an error its agent stops the other
ranks (SIGTERM) and starts them all again (``TORCHELASTIC_RESTART_COUNT`` + 1); the runtime then resumes
from the newest snapshot that verifies (``Trainer.resuming``). torchrun only sees processes that exit. A
*hung* rank (a stuck kernel, a collective waiting on a peer that never comes) would hold the group until
gloo's / NCCL's collective timeout (30 minutes by default): :class:`ElasticWatch` notices that no rank has
committed a step for ``hang_timeout_s`` and SIGKILLs the stopped ranks (all of them when none is stopped:
a deadlock looks the same on every rank), which torchrun then treats as a failure like any other. A node's
link taken down by an injected ``drop-link`` (:mod:`workers.reliability.faults`) is found that way: the
ranks wait in their collectives, none stopped; once the fault is recorded the link is brought up again, so
the restarted group can re-form.

The watch reads what the ranks write (:mod:`workers.training.supervision.progress`); it runs in the supervising
process, called from :func:`workers.training.supervision.supervisor.supervise` (``on_poll``) every poll, so it works
while the ranks are dead or stopped. Each fault is reported (``on_fault``) when found and again when the
group has committed its first step after it (``on_recovered``: the step it went back to, the steps lost,
the recovery time). Snapshots the job publishes are reported once each (``on_snapshot``), verified.

Dict shapes (also what :meth:`ElasticWatch.report` returns):

- fault: ``{"kind": "rank-killed"|"rank-hung"|"rank-failed"|"drop-link", "rank", "step", "restart",
  "detected_unix", "fault_unix", "message"}`` (``fault_unix``: when an injected fault fired, else when it was
  detected; ``drop-link``: found while a link an injected fault took down was down, ``rank`` the one it
  targeted)
- recovery: the fault's keys + ``{"resumed_from_step", "snapshot", "tier" (memory|disk), "steps_lost", "rto_s",
  "recovered_unix", "skipped"}`` (``rto_s``: from the fault to the first step committed after it)
- snapshot: ``{"name", "step", "kind", "bytes_written", "raw_bytes", "base", "created_unix", "verified",
  "problem"}``, or ``{"name", "removed": True}`` when retention (or a restore) took it away
- goodput: :func:`workers.reliability.goodput.goodput`
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from workers.reliability.faults import FaultInjector
from workers.reliability.goodput import goodput, kept_losses
from workers.training.supervision import progress as progress_mod

log = logging.getLogger(__name__)

DEFAULT_HANG_TIMEOUT_S = 60.0
SNAPSHOT_SCAN_EVERY_S = 1.0


def _alive(pid: int) -> tuple[bool, bool]:
    """(alive, stopped) for a process id; a zombie is dead."""
    try:
        status = psutil.Process(pid).status()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False, False
    if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
        return False, False
    return True, status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


class ElasticWatch:
    def __init__(
        self,
        run_dir: str | Path,
        *,
        hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S,
        snapshot_dir: str | Path | None = None,
        injector: FaultInjector | None = None,
        on_fault: Callable[[dict], None] = lambda fault: None,
        on_recovered: Callable[[dict], None] = lambda recovery: None,
        on_snapshot: Callable[[dict], None] | None = None,
        launch_unix: float | None = None,
        fresh: bool = True,
        membership_changes: bool = False,
    ):
        """``fresh``: clear ``run_dir``'s progress (a new launch); False: a node that joins a running group
        watches the directory as it is, from the restart count its ranks are at (the restarts before it are
        not its to report). ``membership_changes``: the ranks run under an elastic node range (``--nnodes
        MIN:MAX``), where torchrun also restarts a healthy group to let a node join, without counting a
        failure: a rank that dies without an injected fault is then held until the next ranks start --
        on a higher restart count it was a fault (reported with the times it was found), on the same count
        the group re-formed (an event, ``membership-change``, not a fault)."""
        if hang_timeout_s <= 0:
            raise ValueError(f"hang_timeout_s must be > 0, got {hang_timeout_s}")
        self.dir = Path(run_dir) / "progress"
        if fresh and self.dir.exists():  # what an earlier launch wrote is not this run's progress
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hang_timeout_s = hang_timeout_s
        self.snapshot_dir = Path(snapshot_dir) if snapshot_dir else None
        self.injector = injector
        self.on_fault, self.on_recovered, self.on_snapshot = on_fault, on_recovered, on_snapshot
        self.launch_unix = time.time() if launch_unix is None else launch_unix
        self.end_unix: float | None = None
        self.timeline = progress_mod.TimelineReader(self.dir)
        self.faults: list[dict] = []
        self.events: list[dict] = []  # corrupt snapshots and other non-disrupting faults
        self.restart = 0
        if not fresh:
            ranks = progress_mod.read_progress(self.dir).values()
            self.restart = max((d.get("restart", 0) for d in ranks), default=0)
        self.membership_changes = membership_changes
        self._pending: dict | None = None  # a dead rank held until the next ranks say what it was
        self._faulted_restarts: set[int] = set()
        self._advance = (None, time.monotonic())  # (newest step seen, when it was first seen)
        self._cut: tuple[float, str] | None = None  # the risk watch's request to cut this stall early
        self._snapshots: dict[str, dict] = {}
        self._last_scan = 0.0
        self._storage_import: threading.Thread | None = None
        """The snapshot scan's storage module (it imports torch: 4 s here, 9-13 s under load) imported on a
        thread of its own: a poll that waited for it saw a short run end before an injected fault was due,
        and found no fault for that long; until it is in, the polls skip the scan."""
        if self.snapshot_dir is not None:
            self._storage_import = threading.Thread(
                target=importlib.import_module,
                args=("workers.training.checkpoint.storage",),
                name="elastic-watch-storage-import",
                daemon=True,
            )
            self._storage_import.start()

    @property
    def env(self) -> dict[str, str]:
        """What the ranks' environment needs (merge it into torchrun's)."""
        return {progress_mod.ENV: str(self.dir)}

    # ------------------------------------------------------------------------------------------- polling

    def poll(self) -> None:
        now = time.time()
        ranks = progress_mod.read_progress(self.dir)
        self.timeline.read_new()
        if ranks:
            newest = max(d.get("restart", 0) for d in ranks.values())
            if self._pending is not None and newest > self._pending["restart"]:
                self._record_pending()  # torchrun restarted the group: the rank's death was a failure
            for missed in range(self.restart, newest):  # restarted between two polls: a fault all the same
                if missed in self._faulted_restarts:
                    continue
                # the injected kill or hang that hit that group, when one did: it is the cause (CI, 2026-12-04:
                # a pp2 group killed at its step restarted before the next poll saw a rank dead)
                fired = self._fired_on(missed)
                if fired is not None:
                    kind = "rank-killed" if fired.kind == "kill-rank" else "rank-hung"
                    message = (
                        f"rank {fired.rank} (pid {fired.pid}) was {'killed' if kind == 'rank-killed' else 'stopped'} "
                        f"by the injected fault {fired.fault}; torchrun restarted the group before the watch saw it"
                    )
                    self._record(kind, fired.rank, now, fired.fired_unix, message, restart=missed)
                else:
                    self._record(
                        "rank-failed",
                        None,
                        now,
                        now,
                        "a rank exited and torchrun restarted the group",
                        restart=missed,
                    )
            self.restart = max(self.restart, newest)
        current = {r: d for r, d in ranks.items() if d.get("restart") == self.restart}
        if self.injector is not None:
            for fired in self.injector.poll(current):
                log.info("injected %s at step %s (%s)", fired.fault, fired.step, fired.detail)
                if fired.kind == "corrupt-snapshot":
                    self.events.append({"kind": "snapshot-corrupted", **fired.to_dict()})
                elif fired.refused:  # nothing happened to the run: an event that says why, not a fault
                    self.events.append(fired.to_dict())
        if self._pending is not None:
            self._settle_pending(current)
        elif self.restart not in self._faulted_restarts:
            self._find_fault(current, now)
        self._find_recoveries()
        if (
            self.snapshot_dir is not None
            and not self._storage_import.is_alive()
            and time.monotonic() - self._last_scan >= SNAPSHOT_SCAN_EVERY_S
        ):
            self._last_scan = time.monotonic()
            self._scan_snapshots()

    def _last_step(self, restart: int) -> int | None:
        steps = [
            e["step"]
            for e in self.timeline.events
            if e.get("event") == "step" and e.get("restart") == restart
        ]
        return max(steps) if steps else None

    def _injected(self, rank: int | None, pid: int | None, kinds: tuple[str, ...]):
        if self.injector is None:
            return None
        for fired in reversed(self.injector.fired):
            if (
                fired.kind in kinds
                and (pid is None or fired.pid == pid)
                and (rank is None or fired.rank == rank)
            ):
                return fired
        return None

    def _fired_on(self, restart: int):
        """The injected kill or hang that hit torchrun restart ``restart``'s group, if one did."""
        fired = self.injector.fired if self.injector is not None else []
        return next(
            (f for f in fired if f.kind in ("kill-rank", "hang-rank") and (f.restart or 0) == restart), None
        )

    def _link_down(self):
        """The injected ``drop-link`` whose link is down now (the first, if several), else None."""
        down = self.injector.links_down.values() if self.injector is not None else ()
        return min(down, key=lambda fired: fired.fired_unix, default=None)

    def cut_hang(self, after_s: float, reason: str) -> dict:
        """The node's risk watch judged the ranks' stall a hang (``reason``): cut it once no step has been
        committed for ``after_s`` (sooner than the hang timeout), as the timeout would; a step committed
        first ends the stall and the request with it. The answer is the risk action's outcome."""
        if after_s <= 0:
            raise ValueError(f"after_s must be > 0, got {after_s}")
        if after_s >= self.hang_timeout_s:
            return {
                "status": "refused",
                "note": f"the hang timeout ({self.hang_timeout_s:g} s) cuts it as soon",
            }
        self._cut = (float(after_s), reason)
        return {"status": "requested", "after_s": round(after_s, 3), "hang_timeout_s": self.hang_timeout_s}

    def _find_fault(self, current: dict[int, dict], now: float) -> None:
        dead, stopped, training = [], [], False
        for rank, doc in sorted(current.items()):
            alive, is_stopped = _alive(doc["pid"])
            if not alive and doc.get("phase") != "finishing":
                dead.append((rank, doc))
            if is_stopped:
                stopped.append((rank, doc))
            training = training or doc.get("phase") == "training"
        newest = max((d.get("step") or 0 for d in current.values()), default=None)
        if newest != self._advance[0]:
            self._advance = (newest, time.monotonic())
            self._cut = None  # a step was committed: the stall the risk watch saw is over
        if dead:
            # the agent stops the other ranks at once: by the next poll several may be gone; the one an
            # injected fault killed is the cause (without one, the watch cannot tell which went first)
            injected = [(r, d) for r, d in dead if self._injected(r, d["pid"], ("kill-rank",))]
            rank, doc = (injected or dead)[0]
            fired = self._injected(rank, doc["pid"], ("kill-rank",))
            link = None if fired else self._link_down()
            kind = "rank-killed" if fired else "drop-link" if link else "rank-failed"
            message = (
                f"rank {rank} (pid {doc['pid']}) was killed by the injected fault {fired.fault}"
                if fired
                else f"rank {rank} (pid {doc['pid']}) exited during {doc.get('phase')}"
                + (
                    f" (ranks {', '.join(str(r) for r, _ in dead)} were gone by then)"
                    if len(dead) > 1
                    else ""
                )
                + (f" after the injected fault {link.fault} took {link.detail}" if link else "")
            )
            at = fired.fired_unix if fired else link.fired_unix if link else now
            if self.membership_changes and not fired and not link:
                self._pending = {
                    "kind": kind,
                    "rank": rank,
                    "detected": now,
                    "at": at,
                    "message": message,
                    "restart": self.restart,
                    "known": {d["pid"] for d in current.values()},
                    "since": time.monotonic(),
                }
                return
            self._record(kind, link.rank if link else rank, now, at, message)
            return
        stalled_s = time.monotonic() - self._advance[1]
        limit = self.hang_timeout_s if self._cut is None else self._cut[0]
        if training and stalled_s > limit:
            victims = stopped or sorted(current.items())
            for _rank, doc in victims:
                try:
                    os.kill(doc["pid"], signal.SIGKILL)  # works on a stopped process too
                except ProcessLookupError:
                    pass
            first = victims[0][0] if len(victims) == 1 or stopped else None
            fired = self._injected(first, None, ("hang-rank",)) if stopped else None
            link = None if stopped else self._link_down()
            ranks = ", ".join(str(r) for r, _ in victims)
            if stopped:
                who = f"rank {ranks} (stopped)" + (f"; injected fault {fired.fault}" if fired else "")
            elif link:
                who = f"rank {ranks} (waiting across a link: injected fault {link.fault} took {link.detail})"
            else:
                who = "every rank of this node (none was stopped: a deadlock looks the same on all)"
            cause = fired or link
            cut = (
                ""
                if self._cut is None
                else f"cut early by the job's risk policy ({self._cut[1]}); hang timeout {self.hang_timeout_s:g} s"
            )
            self._cut = None
            self._record(
                "drop-link" if link else "rank-hung",
                link.rank if link else first,
                now,
                cause.fired_unix if cause else now - stalled_s,
                f"no step committed for {stalled_s:.1f} s ({cut or f'hang timeout {self.hang_timeout_s:g} s'}): "
                f"killed {who}",
            )

    def _record_pending(self) -> None:
        p, self._pending = self._pending, None
        self._record(p["kind"], p["rank"], p["detected"], p["at"], p["message"], restart=p["restart"])

    def _settle_pending(self, current: dict[int, dict]) -> None:
        """A rank died under an elastic node range: new ranks on the same restart count mean the agents
        re-formed the group (a node joined or left) without a failure; none for the hang timeout, a fault."""
        p = self._pending
        started = [d for d in current.values() if d["pid"] not in p["known"] and _alive(d["pid"])[0]]
        if started:
            self._pending = None
            self._advance = (self._advance[0], time.monotonic())
            self.events.append(
                {
                    "kind": "membership-change",
                    "restart": p["restart"],
                    "detected_unix": p["detected"],
                    "message": f"{p['message']}: the group re-formed (a node joined or left), no failure",
                }
            )
            log.info("membership change: %s; the group re-formed", p["message"])
        elif time.monotonic() - p["since"] > self.hang_timeout_s:
            self._record_pending()

    def _record(
        self,
        kind: str,
        rank: int | None,
        detected: float,
        at: float,
        message: str,
        restart: int | None = None,
    ) -> None:
        restart = self.restart if restart is None else restart
        self._faulted_restarts.add(restart)
        if self.injector is not None and self.injector.links_down:
            # the ranks are dead (killed, or torchrun is restarting them): the flaky link recovers, so the
            # group can re-form across it
            restored = self.injector.restore_links()
            message += (
                f"; the link of {', '.join(restored)} is up again"
                if restored
                else "; the link could not be brought up again (see the log)"
            )
        fault = {
            "kind": kind,
            "rank": rank,
            "step": self._last_step(restart),
            "restart": restart,
            "detected_unix": detected,
            "fault_unix": at,
            "message": message,
        }
        self.faults.append(fault)
        log.warning("fault: %s", message)
        self.on_fault(dict(fault))

    def _find_recoveries(self) -> None:
        for fault in self.faults:
            if "rto_s" in fault:
                continue
            later = [e for e in self.timeline.events if e.get("restart", 0) > fault["restart"]]
            first_step = next((e for e in later if e.get("event") == "step"), None)
            if first_step is None:
                continue
            resumed = next(
                (e for e in later if e.get("event") == "resumed" and e["restart"] == first_step["restart"]),
                None,
            )
            from_step = resumed.get("from_step") if resumed else None
            back_to = from_step if from_step is not None else first_step["step"] - 1
            # the faulted group's last step, now that it is gone: when the fault was found, the timeline could
            # still lack a step its survivors committed a moment before they were stopped
            last = self._last_step(fault["restart"])
            if last is not None and (fault["step"] is None or last > fault["step"]):
                fault["step"] = last
            fault.update(
                resumed_from_step=from_step,
                snapshot=resumed.get("snapshot") if resumed else None,
                tier=resumed.get("tier") if resumed else None,
                skipped=resumed.get("skipped", []) if resumed else [],
                steps_lost=max(0, (fault["step"] or back_to) - back_to),
                rto_s=round(first_step["t"] - fault["fault_unix"], 4),
                recovered_unix=first_step["t"],
            )
            log.warning(
                "recovered from %s: back to step %s, %s step(s) lost, %.2f s",
                fault["kind"],
                back_to,
                fault["steps_lost"],
                fault["rto_s"],
            )
            self.on_recovered(dict(fault))

    def _scan_snapshots(self) -> None:
        from workers.training.checkpoint.storage import CorruptSnapshot, list_snapshots, verify

        names = list_snapshots(self.snapshot_dir)
        for name in names:
            if name in self._snapshots:
                continue
            try:
                info = verify(self.snapshot_dir, name)
            except CorruptSnapshot as exc:
                doc = {"name": name, "verified": False, "problem": str(exc)}
            else:
                body = info.manifest
                doc = {
                    "name": name,
                    "step": info.step,
                    "kind": info.kind,
                    "bytes_written": body.get("bytes_written"),
                    "raw_bytes": body.get("raw_bytes"),
                    "base": info.base,
                    "created_unix": body.get("created_unix"),
                    "verified": True,
                    "problem": None,
                }
            self._snapshots[name] = doc
            if self.on_snapshot is not None:
                self.on_snapshot(dict(doc))
        for name in [n for n in self._snapshots if n not in names and not self._snapshots[n].get("removed")]:
            self._snapshots[name] = {**self._snapshots[name], "removed": True}
            if self.on_snapshot is not None:
                self.on_snapshot({"name": name, "removed": True})

    # ------------------------------------------------------------------------------------------- results

    def finish(self, *, lost: bool = False) -> None:
        """The supervised process has ended: read what is left and stop the clock. ``lost``: the agent was
        killed and its supervisor stopped the ranks it left; their end is no fault of theirs (the caller
        reports the lost agent), so it is not looked for."""
        if not lost:
            self.poll()
            if self._pending is not None:  # the ranks died and none followed: that was the end of them
                self._record_pending()
        if self.snapshot_dir is not None:  # the last snapshot may be younger than the last periodic scan
            self._storage_import.join()
            self._scan_snapshots()
        self.end_unix = time.time()
        if self.injector is not None and self.injector.links_down:  # the run ended before it was found
            log.warning("drop-link: the run ended with a link down; bringing it up")
            self.injector.restore_links()
        if self.snapshot_dir is not None:
            from workers.training.checkpoint import memory

            memory.remove(self.snapshot_dir)  # the run is over: free the RAM of its in-memory snapshots

    @property
    def snapshots_seen(self) -> list[dict]:
        """Every snapshot reported during the run, including those retention removed since."""
        return list(self._snapshots.values())

    def report(self) -> dict:
        end = self.end_unix or time.time()
        return {
            "restarts": self.restart,
            "faults": [dict(f) for f in self.faults],
            "events": [dict(e) for e in self.events],
            "goodput": goodput(self.timeline.events, launch_unix=self.launch_unix, end_unix=end),
            "losses": kept_losses(self.timeline.events),
            "snapshots": [d for d in self._snapshots.values() if not d.get("removed")],
            # injected faults the run ended before (an injector fires from outside, when it sees the step):
            # said, not dropped, so that a scenario that did not happen never reads as one survived
            "faults_not_fired": [str(f) for f in self.injector.pending] if self.injector is not None else [],
        }
