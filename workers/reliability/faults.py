"""Fault injection: the failures elastic training must survive, fired from outside the ranks.

A fault plan is a comma-separated list (``JobConfig.inject``, ``cann-train elastic --inject``; its grammar,
which the job's config checks, is the runtime's: :mod:`workers.training.supervision.fault_plan`)::

    kill-rank@step=17,hang-rank@step=40:rank=1,corrupt-snapshot@step=30,kill-worker@step=12

``kind@step=N[:rank=R]``. Each fault fires once, when the targeted rank reports step ``N`` committed (its
``rank<r>.json`` progress file, :mod:`workers.training.supervision.progress`); ``rank`` defaults to the highest rank.
Faults fire in the order written: one waits until those before it have fired (a plan is a scenario).

- ``kill-rank``        SIGKILL the rank's process (a crash: OOM killer, segfault, lost device).
- ``hang-rank``        SIGSTOP it (a hang: a stuck kernel or collective); the watcher's hang timeout must
                       find it, it never comes back by itself.
- ``corrupt-snapshot`` flip one byte in the middle of the newest published snapshot's largest file (bit
                       rot, a torn write): the next resume must skip it for the previous good one. Fires at
                       step ``N`` or, if no snapshot is published by then, as soon as one is.
- ``kill-worker``      SIGKILL the process that supervises the ranks (the Celery worker of the node): only
                       where the caller passes ``kill_worker`` (the control plane); its ranks die with it.
- ``drop-link``        take down the link of the node that holds the rank: the network namespace its process
                       runs in (``ip netns identify <pid>``), ``ip -n <ns> link set ctnet0 down``. Only on the
                       emulated two-tier network (:mod:`workers.training.comm.netem`, one namespace per node);
                       a rank in no named namespace (a run on the machine's own network) is refused: nothing
                       is done and the record says why (``Fired.refused``). Every rank waiting on a
                       collective across that link stops making progress, so the watcher's hang timeout
                       finds it. The link comes back, like a flaky port that recovers, when the watcher has
                       recorded the fault and killed the ranks (:meth:`FaultInjector.restore_links`, before
                       the group re-forms), and at the latest when the watch finishes.

The injector is driven by the watcher's poll loop (:meth:`FaultInjector.poll`); which faults have fired is
kept in ``state_path`` when one is given, so that a relaunched attempt (a new supervisor) does not fire
them again when it passes the same steps. Links it took down are not: a supervisor that dies with a link
down leaves it down until the emulated network is torn down.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from workers.training.supervision.fault_plan import DROP_LINK_NEEDS_NETEM, Fault, parse_faults

IP_TIMEOUT_S = 10.0  # an `ip` call takes milliseconds; this only bounds a stuck one
log = logging.getLogger(__name__)


@dataclass
class Fired:
    """A fault the injector fired: when, on which rank and process, at which committed step."""

    fault: str
    kind: str
    step: int
    rank: int | None
    pid: int | None
    restart: int | None
    fired_unix: float
    detail: str = ""
    refused: bool = False
    """Nothing was done (``detail`` says why): a ``drop-link`` on a rank outside the emulated network."""

    def to_dict(self) -> dict:
        return asdict(self)


class FaultInjector:
    def __init__(
        self,
        faults: list[Fault] | str,
        *,
        world_size: int,
        snapshot_dir: str | Path | None = None,
        state_path: str | Path | None = None,
        kill_worker: Callable[[], None] | None = None,
    ):
        self.faults = parse_faults(faults) if isinstance(faults, str) else list(faults)
        self.world_size = world_size
        self.snapshot_dir = Path(snapshot_dir) if snapshot_dir else None
        self.state_path = Path(state_path) if state_path else None
        self.kill_worker = kill_worker
        for f in self.faults:
            if f.rank is not None and not 0 <= f.rank < world_size:
                raise ValueError(f"{f}: the run has ranks 0-{world_size - 1}")
            if f.kind == "corrupt-snapshot" and self.snapshot_dir is None:
                raise ValueError(f"{f}: the run takes no snapshots (set a snapshot interval and directory)")
            if f.kind == "kill-worker" and kill_worker is None:
                raise ValueError(f"{f}: only a job supervised by a control-plane worker has a worker to kill")
        self.fired: list[Fired] = []
        self.links_down: dict[str, Fired] = {}
        """Network namespace -> the ``drop-link`` that took its link down, until :meth:`restore_links`."""
        self._done: set[str] = set(self._load_state())
        self._disrupted_restart: int | None = None
        """The torchrun restart whose ranks the last kill or hang hit: the next one waits for the group
        after it. Two kills due at once (a poll that came late, the ranks several steps on) would otherwise
        both hit one group, which restarts once: one fault recorded for two injected."""

    def _load_state(self) -> list[str]:
        if self.state_path is None or not self.state_path.exists():
            return []
        try:
            return list(json.loads(self.state_path.read_text()).get("fired", []))
        except (OSError, ValueError, AttributeError):
            return []

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fired": sorted(self._done)}))
        os.replace(tmp, self.state_path)

    @property
    def pending(self) -> list[Fault]:
        return [f for f in self.faults if str(f) not in self._done]

    def poll(self, progress: dict[int, dict]) -> list[Fired]:
        """Fire the faults that are due given the ranks' progress; returns those fired now."""
        fired = []
        for fault in self.pending:  # in the order written: a fault waits for the ones before it
            rank = self.world_size - 1 if fault.rank is None else fault.rank
            doc = progress.get(0 if fault.kind in ("corrupt-snapshot", "kill-worker") else rank)
            if not doc or doc.get("step") is None or doc["step"] < fault.step:
                break
            if doc.get("phase") not in ("training", "finishing"):
                break
            disrupting = fault.kind in ("kill-rank", "hang-rank")
            if (
                disrupting
                and self._disrupted_restart is not None
                and (doc.get("restart") or 0) <= self._disrupted_restart
            ):
                break  # that group's ranks are dying or hung: this fault is for the group that follows
            event = self._fire(fault, rank, doc)
            if event is None:
                break  # not possible yet (no snapshot published): try again at the next poll
            self._done.add(str(fault))
            self._save_state()
            self.fired.append(event)
            fired.append(event)
            if disrupting:
                self._disrupted_restart = doc.get("restart") or 0
        return fired

    def _fire(self, fault: Fault, rank: int, doc: dict) -> Fired | None:
        now = time.time()
        common = dict(fault=str(fault), kind=fault.kind, step=doc["step"], restart=doc.get("restart"))
        if fault.kind in ("kill-rank", "hang-rank"):
            sig = signal.SIGKILL if fault.kind == "kill-rank" else signal.SIGSTOP
            try:
                os.kill(doc["pid"], sig)
            except ProcessLookupError:
                return None  # it is gone already (restarting): fire on its successor
            return Fired(**common, rank=rank, pid=doc["pid"], fired_unix=now, detail=sig.name)
        if fault.kind == "corrupt-snapshot":
            target = newest_snapshot_file(self.snapshot_dir)
            if target is None:
                return None
            offset = flip_a_byte(target)
            return Fired(
                **common,
                rank=None,
                pid=None,
                fired_unix=now,
                detail=f"{target.parent.name}/{target.name}: byte {offset} flipped",
            )
        if fault.kind == "drop-link":
            return self._drop_link(fault, rank, doc, common, now)
        assert fault.kind == "kill-worker" and self.kill_worker is not None
        self._done.add(str(fault))
        self._save_state()  # before the worker dies with us: the next attempt must not fire it again
        self.kill_worker()
        return Fired(**common, rank=None, pid=os.getpid(), fired_unix=now, detail="SIGKILL")

    def _drop_link(self, fault: Fault, rank: int, doc: dict, common: dict, now: float) -> Fired | None:
        from workers.training.comm.netem import IFNAME

        pid = doc["pid"]
        try:
            namespace = network_namespace_of(pid)
            if not namespace:
                raise RuntimeError(
                    f"rank {rank} (pid {pid}) runs in no named network namespace: {DROP_LINK_NEEDS_NETEM}"
                )
            set_link(namespace, up=False)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            if not Path(f"/proc/{pid}").exists():
                return None  # it is gone already (restarting): fire on its successor
            log.warning("%s refused: %s", fault, exc)
            return Fired(**common, rank=rank, pid=pid, fired_unix=now, detail=f"refused: {exc}", refused=True)
        self.links_down[namespace] = fired = Fired(
            **common, rank=rank, pid=pid, fired_unix=now, detail=f"{IFNAME} of {namespace} down"
        )
        return fired

    def restore_links(self) -> list[str]:
        """Bring up every link a ``drop-link`` took down; returns their namespaces. One that cannot be
        brought up (its namespace was removed meanwhile) is logged and forgotten."""
        restored = []
        for namespace in list(self.links_down):
            del self.links_down[namespace]
            try:
                set_link(namespace, up=True)
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                log.warning("the link of %s could not be brought up again: %s", namespace, exc)
                continue
            restored.append(namespace)
        return restored


def _ip(*argv: str) -> str:
    try:
        proc = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except FileNotFoundError:
        raise RuntimeError("`ip` (iproute2) not found") from None
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def network_namespace_of(pid: int) -> str:
    """The named network namespace (``ip netns``) process ``pid`` runs in; "" when it is in none."""
    names = _ip("netns", "identify", str(pid)).split()
    return names[0] if names else ""


def set_link(namespace: str, *, up: bool) -> None:
    """Bring the emulated node link (``ctnet0``) of ``namespace`` up or down."""
    from workers.training.comm.netem import IFNAME

    _ip("-n", namespace, "link", "set", IFNAME, "up" if up else "down")


def newest_snapshot_file(snapshot_dir: Path | None) -> Path | None:
    """The largest data file of the newest published snapshot (``None`` before the first one)."""
    if snapshot_dir is None:
        return None
    from workers.training.checkpoint.storage import list_snapshots

    for name in list_snapshots(snapshot_dir):
        files = sorted((snapshot_dir / name).glob("rank*.bin"), key=lambda p: p.stat().st_size)
        if files:
            return files[-1]
    return None


def flip_a_byte(path: Path) -> int:
    """Invert one byte in the middle of ``path`` (in place, fsynced). Returns its offset."""
    size = path.stat().st_size
    offset = size // 2
    with path.open("r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    return offset
