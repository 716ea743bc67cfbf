"""Degrade one rank from outside while it trains: what a straggler detector must find.

- :class:`StopBursts`: SIGSTOP the process for ``stop_s`` about every ``every_s`` seconds, then SIGCONT (a
  node that stalls in bursts: thermal throttling, a noisy neighbour, a flapping link's retransmits).
  ``jitter_s`` spreads the bursts: strictly periodic stops can lock onto one phase of the training step
  (measured on the 4-rank bench job: for 5 s in a row every stop landed while the rank was inside its
  gradient all-reduce, where a stopped rank and its waiting peers look the same to any timer), which the
  stalls it stands for do not do.
- :class:`CpuQuota`: confine the process to a fraction of a core with the kernel's CFS bandwidth control
  (a node slower all the time: a throttled or shared CPU), in a cgroup of its own: cgroup v2 ``cpu.max``
  where a v2 hierarchy with the cpu controller is writable, else cgroup v1 ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us`` (kernel docs: ``Documentation/scheduler/sched-bwc.rst``). Needs write access to the
  hierarchy (root, or a delegated subtree); :meth:`CpuQuota.available` says why not where it cannot.

Neither fakes anything: the rank really stops or really gets less CPU, and its peers really wait for it.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000  # the kernel's default CFS bandwidth period (sched-bwc.rst: 100 ms)


class StopBursts:
    """SIGSTOP ``pid`` for ``stop_s`` every ``every_s`` (+- up to ``jitter_s``, uniform) seconds on a
    background thread, until :meth:`stop` (which leaves the process running). ``started_unix``: when the
    first SIGSTOP was sent."""

    def __init__(
        self,
        pid: int,
        *,
        stop_s: float = 0.5,
        every_s: float = 1.0,
        jitter_s: float = 0.0,
        seed: int | None = None,
    ):
        if not 0 < stop_s < every_s:
            raise ValueError(f"need 0 < stop_s < every_s, got stop_s={stop_s} every_s={every_s}")
        if not 0 <= jitter_s < every_s - stop_s:
            raise ValueError(f"need 0 <= jitter_s < every_s - stop_s, got jitter_s={jitter_s}")
        self.pid, self.stop_s, self.every_s, self.jitter_s = pid, stop_s, every_s, jitter_s
        self._rng = random.Random(seed)
        self.started_unix: float | None = None
        self.bursts = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"stop-bursts-{pid}", daemon=True)

    def start(self) -> StopBursts:
        self._thread.start()
        while self.started_unix is None and self._thread.is_alive():
            time.sleep(0.001)
        return self

    def _run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self._done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                if self.started_unix is None:
                    self.started_unix = time.time()
                self.bursts += 1
                self._done.wait(self.stop_s)
                os.kill(self.pid, signal.SIGCONT)
                next_at += self.every_s + self._rng.uniform(-self.jitter_s, self.jitter_s)
                self._done.wait(max(0.0, next_at - time.monotonic()))
        except ProcessLookupError:
            return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5.0)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _v2_root() -> Path | None:
    """A writable cgroup v2 hierarchy whose children may use the cpu controller."""
    for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        ctl = root / "cgroup.subtree_control"
        try:
            if "cpu" in ctl.read_text().split() and os.access(root, os.W_OK):
                return root
        except OSError:
            continue
    return None


def _v1_root() -> Path | None:
    for name in ("cpu", "cpu,cpuacct"):
        root = CGROUP_ROOT / name
        if (root / "cpu.cfs_quota_us").exists() and os.access(root, os.W_OK):
            return root
    return None


class CpuQuota:
    """Move ``pid`` (all its threads) into a new cgroup limited to ``cores`` CPUs worth of time per period;
    :meth:`release` moves it back where it was and removes the group."""

    def __init__(self, pid: int, cores: float, *, period_us: int = CFS_PERIOD_US):
        if not cores > 0:
            raise ValueError(f"cores must be > 0, got {cores!r}")
        self.pid, self.cores, self.period_us = pid, cores, period_us
        self.started_unix: float | None = None
        self.group: Path | None = None
        self._home: Path | None = None

    @staticmethod
    def available() -> tuple[bool, str]:
        if _v2_root() is not None:
            return True, "cgroup v2 cpu.max"
        if _v1_root() is not None:
            return True, "cgroup v1 cpu.cfs_quota_us"
        return False, f"no writable cgroup hierarchy with the cpu controller under {CGROUP_ROOT}"

    def _current_group(self, root: Path, v2: bool) -> Path:
        for line in Path(f"/proc/{self.pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (v2 and controllers == "") or (not v2 and "cpu" in controllers.split(",")):
                return root / path.lstrip("/")
        return root

    def apply(self) -> CpuQuota:
        quota_us = max(1000, int(self.cores * self.period_us))  # the kernel's minimum quota is 1 ms
        v2 = _v2_root()
        root = v2 or _v1_root()
        if root is None:
            raise RuntimeError(self.available()[1])
        self._home = self._current_group(root, v2 is not None)
        self.group = root / f"cann-train-degrade-{self.pid}"
        self.group.mkdir(exist_ok=True)
        if v2 is not None:
            (self.group / "cpu.max").write_text(f"{quota_us} {self.period_us}")
        else:
            (self.group / "cpu.cfs_period_us").write_text(str(self.period_us))
            (self.group / "cpu.cfs_quota_us").write_text(str(quota_us))
        (self.group / "cgroup.procs").write_text(str(self.pid))
        self.started_unix = time.time()
        return self

    def release(self) -> None:
        if self.group is None:
            return
        try:
            (self._home / "cgroup.procs").write_text(str(self.pid))
        except OSError:
            pass  # the process is gone: the group is empty anyway
        try:
            self.group.rmdir()
        except OSError:
            pass
        self.group = None
