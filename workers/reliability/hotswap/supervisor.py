"""The hot-swap supervisor: :func:`run_hot_swap` starts the Lighthouse, the replicas and the warm spares as
processes of their own (``python -m workers.reliability.hotswap``), fires the faults from outside and puts
a successor in a killed replica's place (see the package docstring)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from workers.reliability.hotswap.checks import check_hot_swap_input
from workers.reliability.hotswap.limits import (
    ASSIGN_AFTER_KILL_MAX_S,
    COLLECTIVE_TIMEOUT_S,
    FINISH_GRACE_S,
    LOG_TAIL_CHARS,
    POLL_S,
    HotSwapError,
)
from workers.reliability.hotswap.network import is_loopback, url_host
from workers.reliability.hotswap.results import read_status, summarize


def run_hot_swap(
    cfg,
    replicas: int,
    *,
    steps: int,
    inject: list[tuple[str, int]] = (),
    run_dir: Path,
    heartbeat_timeout_ms: int = 1000,
    timeout_s: float = 600,
    host: str | None = None,
    target: int | None = None,
    spares: int = 1,
    threads_per_replica: int = 1,
    python: str | None = None,
    kill_delay_s: float = 0.0,
) -> dict:
    """Train ``cfg`` for ``steps`` committed steps on ``replicas`` data-parallel replicas with hot-swap
    recovery, firing ``inject`` (``[("kill-replica", step), ...]``; each kills ``target``, default the
    last replica, when it reports ``step`` committed, and puts a successor in its place at once: one of
    ``spares`` warm standby processes (started with the replicas, torch imported and the model built, so
    the successor only heals), else a fresh process). ``kill_delay_s``: fire that long after the step is
    reported instead (a fault inside a step, not on its boundary). Raises ``ValueError`` for
    bad input, :class:`HotSwapError` when the run fails or passes ``timeout_s``.

    Returns ``steps replicas faults[{kind replica step rto_s rejoin_s steps_lost ...}] loss_last losses
    checksums_equal_after_rejoin goodput{wall_s productive_s goodput ...} replica_processes checksums``.
    ``rto_s``: kill -> the survivors' next committed step without the killed replica; ``rejoin_s``: kill ->
    the replacement's first committed step (or its heal, when the survivors had finished by then)."""
    faults = check_hot_swap_input(
        cfg,
        replicas,
        steps=steps,
        inject=inject,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
        timeout_s=timeout_s,
        target=target,
        spares=spares,
    )
    if not isinstance(kill_delay_s, int | float) or isinstance(kill_delay_s, bool) or kill_delay_s < 0:
        raise ValueError(f"kill_delay_s must be a number >= 0, got {kill_delay_s!r}")
    from workers.training.supervision.supervisor import node_address

    host = host or node_address()
    target = replicas - 1 if target is None else target
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stale = (
        *run_dir.glob("replica*"),
        *run_dir.glob("spare*"),
        *(run_dir / f for f in ("go", "finish", "lighthouse.json")),
    )
    for old in stale:
        if old.is_file():
            old.unlink()
    job = replace(cfg, steps=steps, start_step=0, resume=False, snapshot_every=0)
    spec = {
        "config": job.to_dict(),
        "replicas": replicas,
        "steps": steps,
        "host": host,
        "run_dir": str(run_dir),
        "threads": threads_per_replica,
        "collective_timeout_s": COLLECTIVE_TIMEOUT_S,
        "timeout_s": timeout_s,
    }
    sup = _Supervisor(run_dir, spec, python or sys.executable, heartbeat_timeout_ms, timeout_s, spares)
    try:
        sup.start_lighthouse()
        for n in range(replicas):
            sup.start_replica(n)
        sup.watch(
            [
                {"kind": kind, "step": step, "replica": target, "delay_s": kill_delay_s}
                for kind, step in faults
            ]
        )
    finally:
        sup.stop_all()
    return summarize(
        run_dir, replicas=replicas, steps=steps, fired=sup.fired, launch=sup.t_launch, end=sup.t_end
    )


class _Supervisor:
    """Starts the Lighthouse, the replicas and the warm spares, fires faults, puts a spare (or a fresh
    process) in a killed replica's place, and never waits unbounded: every wait checks the run's deadline
    and the processes' health."""

    def __init__(
        self, run_dir: Path, spec: dict, python: str, heartbeat_timeout_ms: int, timeout_s: float, spares: int
    ):
        self.run_dir, self.spec, self.python = run_dir, spec, python
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.spare_count = spares
        self.t_launch = time.time()
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.t_end: float | None = None
        self.lighthouse: subprocess.Popen | None = None
        self.procs: dict[int, subprocess.Popen] = {}
        self.spares: list[tuple[int, subprocess.Popen]] = []  # (spare index, process), not yet assigned
        self.spare_seq = 0
        self.assignments: list[dict] = []  # spares given a slot, not told yet
        self.attempts: dict[int, int] = {}
        self.killed: set[int] = set()  # pids we killed
        self.fired: list[dict] = []
        self.env = dict(os.environ)
        self.env.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
        self.env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        if is_loopback(spec["host"]):
            self.env.setdefault("GLOO_SOCKET_IFNAME", "lo")

    def _popen(self, args: list[str], log: Path) -> subprocess.Popen:
        from workers.training.supervision.supervisor import die_with_parent

        with log.open("ab") as out:
            return subprocess.Popen(
                [self.python, "-m", "workers.reliability.hotswap", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=str(Path(__file__).resolve().parents[3]),  # the repository root
                preexec_fn=die_with_parent,
            )

    def start_lighthouse(self) -> None:
        out = self.run_dir / "lighthouse.json"
        self.lighthouse = self._popen(
            [
                "lighthouse",
                "--bind",
                f"{url_host(self.spec['host'])}:0",
                "--heartbeat-timeout-ms",
                str(self.heartbeat_timeout_ms),
                "--out",
                str(out),
            ],
            self.run_dir / "lighthouse.log",
        )
        while not out.exists():
            self._check_deadline("the Lighthouse to start")
            if self.lighthouse.poll() is not None:
                raise HotSwapError(
                    f"the Lighthouse exited with {self.lighthouse.returncode}\n{self._tails()}"
                )
            time.sleep(POLL_S)
        port = json.loads(out.read_text())["port"]
        self.spec["lighthouse"] = f"http://{url_host(self.spec['host'])}:{port}"
        tmp = self.run_dir / ".spec.json.tmp"
        tmp.write_text(json.dumps(self.spec))
        os.replace(tmp, self.run_dir / "spec.json")

    def start_replica(self, n: int) -> None:
        self.attempts[n] = self.attempts.get(n, 0) + 1
        self.procs[n] = self._popen(
            [
                "replica",
                "--spec",
                str(self.run_dir / "spec.json"),
                "--replica",
                str(n),
                "--attempt",
                str(self.attempts[n]),
            ],
            self.run_dir / f"replica{n}.log",
        )

    def start_spare(self) -> None:
        k = self.spare_seq
        self.spare_seq += 1
        proc = self._popen(
            ["replica", "--spec", str(self.run_dir / "spec.json"), "--spare", str(k)],
            self.run_dir / f"spare{k}.log",
        )
        self.spares.append((k, proc))

    def replace_replica(self, n: int, t_kill: float) -> dict:
        """A killed replica's successor: the oldest warm spare (torch imported and the model built; one still
        starting takes the slot when it is ready), else a fresh process. Returns which, and how warm.

        A spare is told its slot only once the survivors have committed a step without the killed replica
        (:meth:`_assign_spares`): joining the survivors' first quorum after the kill would hold their step
        until it has fetched the state and computed, so their recovery would wait for its heal."""
        while self.spares:
            k, proc = self.spares.pop(0)
            if proc.poll() is not None:
                continue
            warm = (self.run_dir / f"spare{k}.ready").exists()
            self.attempts[n] = self.attempts.get(n, 0) + 1
            self.procs[n] = proc
            self.assignments.append({"spare": k, "replica": n, "attempt": self.attempts[n], "t_kill": t_kill})
            return {"successor": f"spare{k}", "successor_was_ready": warm}
        self.start_replica(n)  # seconds of start-up: it joins after the survivors' recovery anyway
        return {"successor": "fresh process", "successor_was_ready": False}

    def _assign_spares(self, statuses: dict[int, dict | None]) -> None:
        for a in list(self.assignments):
            survivors = [s for n, s in statuses.items() if n != a["replica"] and s is not None]
            recovered = any((s.get("quorum_t") or 0) > a["t_kill"] for s in survivors)
            late = time.time() > a["t_kill"] + ASSIGN_AFTER_KILL_MAX_S + 2 * self.heartbeat_timeout_ms / 1000
            if not (recovered or late):
                continue
            tmp = self.run_dir / f".spare{a['spare']}.assign.tmp"
            tmp.write_text(json.dumps({"replica": a["replica"], "attempt": a["attempt"]}))
            os.replace(tmp, self.run_dir / f"spare{a['spare']}.assign")
            self.assignments.remove(a)
            if self.spare_count:
                # the next fault finds a warm spare too; started now, after the survivors' recovery: a process
                # importing torch and building the model beside them slowed the step they recover with
                self.start_spare()

    def status(self, n: int) -> dict | None:
        """Replica ``n``'s progress, if it is from the process running now."""
        doc = read_status(self.run_dir, n)
        return doc if doc is not None and doc.get("pid") == self.procs[n].pid else None

    def watch(self, faults: list[dict]) -> None:
        pending = list(faults)
        go = False
        while True:
            self._check_deadline("the run to finish")
            for name, proc in [
                *((f"replica {n}", p) for n, p in self.procs.items()),
                *((f"spare {k}", p) for k, p in self.spares),
            ]:
                if proc.poll() is not None and proc.pid not in self.killed:
                    raise HotSwapError(
                        f"{name} (pid {proc.pid}) exited with {proc.returncode}\n{self._tails()}"
                    )
            if self.lighthouse is not None and self.lighthouse.poll() is not None:
                raise HotSwapError(
                    f"the Lighthouse exited with {self.lighthouse.returncode}\n{self._tails()}"
                )
            statuses = {n: self.status(n) for n in self.procs}
            if not go and all(s is not None and s["state"] != "starting" for s in statuses.values()):
                (self.run_dir / "go").write_text(str(time.time()))
                go = True
                # spares start now, not beside the replicas: three processes importing torch on a small
                # node delay the start of training more than a spare that is late for an early fault
                for _ in range(self.spare_count):
                    self.start_spare()
            for fault in list(pending):
                s = statuses[fault["replica"]]
                if s is None or s.get("step") is None or s["step"] < fault["step"]:
                    continue
                due = fault.setdefault("due", time.time() + fault.get("delay_s", 0.0))
                if time.time() < due:
                    continue
                pid = self.procs[fault["replica"]].pid
                os.kill(pid, signal.SIGKILL)
                t_kill = time.time()
                self.killed.add(pid)
                self.procs[fault["replica"]].wait()
                pending.remove(fault)
                successor = self.replace_replica(fault["replica"], t_kill)
                self.fired.append(
                    {**fault, "t_kill": t_kill, "pid": pid, "step_at_kill": s["step"], **successor}
                )
                statuses[fault["replica"]] = None
            self._assign_spares(statuses)
            if not pending and all(s is not None and s["state"] == "done" for s in statuses.values()):
                self.t_end = max(s["time"] for s in statuses.values())
                (self.run_dir / "finish").write_text(str(time.time()))
                self._wait_exit()
                return
            time.sleep(POLL_S)

    def _wait_exit(self) -> None:
        deadline = time.monotonic() + FINISH_GRACE_S + 2 * self.heartbeat_timeout_ms / 1000
        for proc in [*self.procs.values(), *(p for _, p in self.spares)]:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _check_deadline(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise HotSwapError(f"timed out after {self.timeout_s:.0f} s waiting for {what}\n{self._tails()}")

    def _tails(self) -> str:
        from workers.training.supervision.supervisor import read_tail

        parts = []
        for log in sorted(self.run_dir.glob("*.log")):
            tail = read_tail(log, LOG_TAIL_CHARS)
            parts.append(f"--- {log.name} (last {LOG_TAIL_CHARS} chars) ---\n{tail}")
        return "\n".join(parts)

    def stop_all(self) -> None:
        procs = [
            *self.procs.values(),
            *(p for _, p in self.spares),
            *([self.lighthouse] if self.lighthouse else []),
        ]
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
