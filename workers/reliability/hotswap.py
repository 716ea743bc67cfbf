"""Hot swap: data-parallel replicas that survive a killed replica without restarting (torchft).

:func:`run_hot_swap` supervises one job of ``replicas`` replica processes on this node: a torchft
Lighthouse (the quorum service, its own process) and one process per replica, each a replica group of one
rank with its own torchft ``Manager``. Every step, each replica

1. joins the step's quorum (``Manager.start_quorum``, synchronous): the Lighthouse answers with the
   replicas alive now; a replica that is behind (a restarted one, at step 0) *heals* first: it fetches the
   model and optimizer state from a healthy peer over HTTP (torchft's checkpoint transport) and jumps to the
   peers' step;
2. runs forward and backward on its slice of the step's global batch: the normal runtime's model
   (:class:`~workers.training.model.Transformer`, same seeded init), data order
   (:class:`~workers.training.data.ShardedTokenLoader`, replica ``r`` of ``R`` takes the ``r``-th slice of
   step ``s``'s samples, as DP rank ``r`` does), LR schedule (:func:`~workers.training.trainer.lr_at`),
   clipping and AdamW;
3. averages gradients and loss over the replicas of the quorum with **one flat** ``Manager.allreduce``
   (torchft's own ``DistributedDataParallel`` crashes the survivor when a kill lands inside its
   all-reduce: the failed future is swallowed and ``assert fut._fut`` fires, measured here, issue 12);
4. steps the optimizer only if ``Manager.should_commit()`` says so: a step whose all-reduce lost a peer is
   not committed and is tried again in the next quorum, so no step is committed twice or skipped. The
   survivors do not compute it again: their local gradients (on their own slices of the step, from the same
   parameters) are still in ``p.grad`` -- the failed all-reduce worked on a flat copy -- and are what a
   second forward and backward would give bit for bit; only the all-reduce is repeated, with the new quorum.

The supervisor (this process) fires the faults from outside: ``("kill-replica", s)`` SIGKILLs the target
replica's process when it reports step ``s`` committed, and starts a replacement at once. The survivors
never stop: their next quorum drops the dead replica after the Lighthouse heartbeat timeout, and they go
on with a smaller global batch (their slices only) until the replacement has healed and joined.

Each replica writes its progress to ``run_dir/replica<N>.json`` (pid, attempt, state, step, loss, time;
atomic replace) and appends every committed step, failed attempt and heal to
``run_dir/replica<N>.events.jsonl``; the supervisor fires faults from the first and measures from the
second. ``run_dir/replica<N>.log`` and ``run_dir/lighthouse.log`` hold the processes' output.

Network: the Lighthouse, each Manager's gRPC server and each checkpoint HTTP server listen on ``host`` only
(the node's address, ``CANN_TRAIN_NODE_ADDR``, default 127.0.0.1) — torchft binds ``[::]`` by default. Gloo
binds the interface ``GLOO_SOCKET_IFNAME`` names (``lo`` when ``host`` is a loopback address and nothing
is set). Each replica's TCPStore (torch's c10d store, rendezvous of the cross-replica gloo group) still
listens on all interfaces: torch offers no bind address for it, as for ``torchrun``'s own store.

Pure engine: torch, torchft; no Django, no Celery.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

FAULT_KINDS = ("kill-replica",)
POLL_S = 0.005
"""Supervisor poll period: how late after a replica reports the fault's step the kill lands (5 ms, small
beside a step of the tiny models, ~20 ms on this machine)."""
HEARTBEAT_INTERVAL_MS = 100
"""Manager -> Lighthouse heartbeat period: torchft's default (``Manager(heartbeat_interval=100 ms)``)."""
QUORUM_TICK_MS = 100
"""How often the Lighthouse re-checks a pending quorum: torchft's default (``quorum_tick_ms``)."""
JOIN_TIMEOUT_MS = 5000
"""How long a new quorum waits for a replica that heartbeats but has not asked to join. torchft's
Lighthouse CLI default is 60 s; our replicas ask for a quorum within milliseconds of starting to heartbeat
(the start barrier holds them until all heartbeat), so 5 s only bounds a replica that died in between."""
COLLECTIVE_TIMEOUT_S = 30.0
"""torchft ``Manager(timeout=...)``: all-reduce, ``should_commit``, the heal's checkpoint fetch; and the
gloo group's timeout. A killed peer fails a collective at once (its sockets close); this bounds a peer
that hangs. torchft's default is 60 s; 30 s leaves a fetch of a ~100M-parameter AdamW state (1.2 GB over
loopback) ample room."""
QUORUM_TIMEOUT_S = 60.0
"""torchft ``Manager(quorum_timeout=...)``, its default: the longest a replica waits for a quorum."""
CONNECT_TIMEOUT_S = 10.0
"""torchft ``Manager(connect_timeout=...)``: gRPC connections to the Lighthouse and the peers' Managers."""
MAX_FAILED_COMMITS = 20
"""A replica whose step fails to commit this many times in a row exits with an error (torchft
``max_retries``) instead of retrying until the run's timeout: something is broken, not a peer lost."""
ASSIGN_AFTER_KILL_MAX_S = 5.0
"""A spare takes its slot when the survivors have committed a step without the killed replica, or at the
latest this long (plus two heartbeat timeouts) after the kill, should they be slow to."""
FINISH_GRACE_S = 30.0
"""After every replica is done: how long they may take to leave before they are killed."""
LOG_TAIL_CHARS = 4000


class HotSwapError(RuntimeError):
    """The hot-swap run failed (a replica died by itself, a timeout); the message has the logs' tails."""


# ------------------------------------------------------------------------------------------- input


def check_hot_swap_input(
    cfg,
    replicas: int,
    *,
    steps: int,
    inject,
    heartbeat_timeout_ms: int,
    timeout_s: float,
    target: int | None = None,
    spares: int = 0,
) -> list[tuple[str, int]]:
    """Every reason this run cannot be a hot-swap run, as one ``ValueError``; the faults, sorted by step."""
    errors: list[str] = []
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
        errors.append(
            f"replicas must be an integer >= 2 (a survivor must keep training while one is replaced), got {replicas!r}"
        )
        replicas = 0
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        errors.append(f"steps must be an integer >= 1, got {steps!r}")
        steps = 0
    if (
        isinstance(heartbeat_timeout_ms, bool)
        or not isinstance(heartbeat_timeout_ms, int)
        or heartbeat_timeout_ms < 1
    ):
        errors.append(f"heartbeat_timeout_ms must be an integer >= 1, got {heartbeat_timeout_ms!r}")
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or not timeout_s > 0:
        errors.append(f"timeout_s must be a number > 0, got {timeout_s!r}")
    if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
        errors.append(f"spares must be an integer >= 0, got {spares!r}")
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < max(replicas, 1)
    ):
        errors.append(f"target must be a replica index in 0..{replicas - 1}, got {target!r}")
    faults: list[tuple[str, int]] = []
    for item in inject or ():
        if not isinstance(item, list | tuple) or len(item) != 2:
            errors.append(f"inject items are (kind, step) pairs, got {item!r}")
            continue
        kind, step = item
        if kind not in FAULT_KINDS:
            errors.append(f"unknown fault kind {kind!r} for hot swap (known: {', '.join(FAULT_KINDS)})")
            continue
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step < max(steps, 1):
            errors.append(
                f"{kind}@step={step!r}: the step must be an integer in 1..{steps - 1} "
                "(a fault fires after a committed step, before the last one)"
            )
            continue
        faults.append((kind, step))
    errors += _layout_errors(cfg, replicas)
    if errors:
        raise ValueError("; ".join(errors))
    return sorted(faults, key=lambda f: f[1])


def _layout_errors(cfg, replicas: int) -> list[str]:
    """Hot swap replaces whole data-parallel replicas of one rank each: a layout that splits the model
    (TP/PP/CP/EP) or shards it across the replicas (ZeRO/FSDP) loses state with any one process."""
    from workers.training.config import JobConfig

    if not isinstance(cfg, JobConfig):
        return [f"cfg must be a JobConfig, got {type(cfg).__name__}"]
    errors = []
    s = cfg.strategy
    split = {name: getattr(s, name) for name in ("tp", "pp", "cp", "ep") if getattr(s, name) > 1}
    if split:
        degrees = ", ".join(f"{k}={v}" for k, v in split.items())
        errors.append(
            f"strategy.{next(iter(split))}: hot swap replaces data-parallel replicas; a failure in a "
            f"{degrees} group breaks the group, use restart recovery (whole-group restart from a snapshot)"
        )
    if s.zero_stage:
        errors.append(
            f"strategy.zero_stage: hot-swap replicas hold the whole model (plain data parallel); got zero_stage "
            f"{s.zero_stage}, whose shards die with their rank: use zero_stage 0 or restart recovery"
        )
    if cfg.model.moe is not None:
        errors.append(
            "model.moe: hot swap trains dense models (MoE balancing is not exchanged between replicas)"
        )
    if cfg.comm_hook:
        errors.append("comm_hook: hot-swap replicas all-reduce plain gradients; leave comm_hook out")
    if replicas:
        gbs, mbs = cfg.training.global_batch_size, s.micro_batch_size
        if gbs % (replicas * mbs):
            errors.append(
                f"training.global_batch_size: must be divisible by replicas*micro_batch_size "
                f"({replicas}*{mbs}), got {gbs}"
            )
    return errors


# -------------------------------------------------------------------------------------- supervisor


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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


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
        if _is_loopback(spec["host"]):
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
                cwd=str(Path(__file__).resolve().parents[2]),
                preexec_fn=die_with_parent,
            )

    def start_lighthouse(self) -> None:
        out = self.run_dir / "lighthouse.json"
        self.lighthouse = self._popen(
            [
                "lighthouse",
                "--bind",
                f"{_url_host(self.spec['host'])}:0",
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
        self.spec["lighthouse"] = f"http://{_url_host(self.spec['host'])}:{port}"
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


# ----------------------------------------------------------------------------------------- results


def read_status(run_dir: Path, n: int) -> dict | None:
    """``replica<n>.json`` (None while absent or being replaced)."""
    try:
        doc = json.loads((Path(run_dir) / f"replica{n}.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_events(run_dir: Path, n: int) -> list[dict]:
    """``replica<n>.events.jsonl``, whole lines only (a kill may cut the last one)."""
    path = Path(run_dir) / f"replica{n}.events.jsonl"
    out = []
    if not path.exists():
        return out
    for line in path.read_bytes().split(b"\n"):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def summarize(
    run_dir: Path, *, replicas: int, steps: int, fired: list[dict], launch: float, end: float | None
) -> dict:
    """The run's figures, from the replicas' event files and the faults the supervisor fired."""
    events = {n: read_events(run_dir, n) for n in range(replicas)}
    commits = {n: [e for e in evs if e.get("event") == "commit"] for n, evs in events.items()}
    losses: dict[int, float] = {}
    for n in sorted(commits, reverse=True):  # the lowest replica that committed a step wins
        for e in commits[n]:
            losses[e["step"]] = e["loss"]
    losses = dict(sorted(losses.items()))
    processes = []
    for n, evs in events.items():
        for pid in dict.fromkeys(e["pid"] for e in evs):
            mine = [e for e in commits[n] if e["pid"] == pid]
            committed = [e["step"] for e in mine]
            healed = [e for e in evs if e["pid"] == pid and e.get("event") == "healed"]
            processes.append(
                {
                    "replica": n,
                    "pid": pid,
                    "attempt": next(e["attempt"] for e in evs if e["pid"] == pid),
                    "steps_committed": len(committed),
                    "first_step": min(committed, default=None),
                    "last_step": max(committed, default=None),
                    "duplicate_commits": len(committed) - len(set(committed)),
                    "gaps": sum(1 for a, b in zip(committed, committed[1:], strict=False) if b != a + 1),
                    "failed_attempts": sum(1 for e in evs if e["pid"] == pid and e.get("event") == "failed"),
                    "healed": [
                        {"from_step": h["from_step"], "to_step": h["to_step"], "s": h["seconds"]}
                        for h in healed
                    ],
                    "finished": any(e["pid"] == pid and e.get("event") == "done" for e in evs),
                }
            )
    out_faults = [_fault_figures(f, events, commits) for f in fired]
    checksums_ok, checksums = _checksums(out_faults, events)
    return {
        "steps": max(losses, default=0),
        "replicas": replicas,
        "faults": out_faults,
        "loss_last": losses[max(losses)] if losses else None,
        "losses": losses,
        "checksums_equal_after_rejoin": checksums_ok,
        "checksums": checksums,
        "goodput": _goodput(commits, events, replicas, launch, end),
        "replica_processes": processes,
        "run_dir": str(run_dir),
    }


def _fault_figures(fault: dict, events: dict[int, list[dict]], commits: dict[int, list[dict]]) -> dict:
    n, t_kill = fault["replica"], fault["t_kill"]
    survivors = [e for m, cs in commits.items() if m != n for e in cs]
    # The first step the survivors committed without the killed replica: one whose quorum was formed after
    # the kill (a commit needs every member's all-reduce, which a dead process cannot give). A step whose
    # quorum was formed before may still commit after the kill, carrying the victim's last gradient.
    after = sorted((e for e in survivors if e["t_compute"] > t_kill), key=lambda e: e["t_commit"])
    first = after[0] if after else None
    before = sorted(e["t_commit"] - e["t_compute"] for e in survivors if e["t_commit"] < t_kill)
    last_before = max(
        (e["step"] for e in survivors if first is not None and e["t_commit"] < first["t_commit"]),
        default=None,
    )
    failed = [
        e
        for m, evs in events.items()
        if m != n
        for e in evs
        if e.get("event") == "failed"
        and e["t_end"] > t_kill
        and (first is None or e["t_end"] <= first["t_commit"])
    ]
    new = [e for e in events[n] if e["pid"] != fault["pid"] and e.get("t", e.get("t_commit", 0)) > t_kill]
    new_pid = next((e["pid"] for e in new), None)
    rejoin = next((e for e in new if e.get("event") == "commit"), None)
    healed = next((e for e in new if e.get("event") == "healed"), None)
    back = rejoin["t_commit"] if rejoin else (healed["t"] if healed else None)
    return {
        "kind": "replica-killed",
        "replica": n,
        "step": fault["step_at_kill"],
        "requested_step": fault["step"],
        "rto_s": round(first["t_commit"] - t_kill, 4) if first else None,
        # a survivor's step (quorum -> commit) before the kill: the RTO holds at least one of them when the
        # kill lands between two steps
        "step_s_before": round(before[len(before) // 2], 4) if before else None,
        "rejoin_s": round(back - t_kill, 4) if back is not None else None,
        "steps_lost": max(0, last_before + 1 - first["step"]) if first and last_before is not None else 0,
        "survivor_next_step": first["step"] if first else None,
        "survivor_failed_attempts": len(failed),
        "rejoined_at_step": rejoin["step"] if rejoin else (healed["to_step"] if healed else None),
        "heal_s": healed["seconds"] if healed else None,
        "pid_killed": fault["pid"],
        "pid_restarted": new_pid,
        "successor": fault["successor"],
        "successor_was_ready": fault["successor_was_ready"],
    }


def _checksums(faults: list[dict], events: dict[int, list[dict]]) -> tuple[bool, dict]:
    """Parameter + optimizer-state checksums: at each rejoin step every replica that committed it, and at
    the end every replica. Equal everywhere = the rejoined replica holds exactly the survivors' state."""
    final = {}
    for n, evs in events.items():
        done = [e for e in evs if e.get("event") == "done"]
        if done:
            final[n] = done[-1]["checksum"]
    at_rejoin = []
    ok = len(final) == len(events) and len(set(final.values())) == 1
    for f in faults:
        step = f["rejoined_at_step"]
        if step is None:
            ok = False
            continue
        sums = {
            n: e["checksum"]
            for n, evs in events.items()
            for e in evs
            if e.get("event") == "commit" and e["step"] == step and e.get("checksum")
        }
        at_rejoin.append({"step": step, "by_replica": sums})
        # a rejoin by healing at the very end has no commit of its own: the final checksums decide
        if len(sums) >= 2 and len(set(sums.values())) != 1:
            ok = False
    return ok, {"final": final, "at_rejoin": at_rejoin}


def _goodput(commits, events, replicas: int, launch: float, end: float | None) -> dict:
    """Replica-seconds: each replica slot's committed step time (forward, backward, all-reduce, optimizer;
    the quorum wait before it excluded) over the wall time from launch to the last replica done, averaged
    over the slots. A slot that is down, starting, healing or redoing a failed step produces nothing."""
    end = end or max(
        (e.get("t", e.get("t_commit", launch)) for evs in events.values() for e in evs), default=launch
    )
    wall = max(0.0, end - launch)
    productive = sum(e["t_commit"] - e["t_compute"] for cs in commits.values() for e in cs) / replicas
    failed = sum(
        e["t_end"] - e["t_compute"] for evs in events.values() for e in evs if e.get("event") == "failed"
    )
    quorum = sum(e["t_compute"] - e["t_start"] for cs in commits.values() for e in cs)
    ready = [
        e["t"] for evs in events.values() for e in evs if e.get("event") == "ready" and e["attempt"] == 1
    ]
    return {
        "wall_s": round(wall, 4),
        "productive_s": round(productive, 4),
        "goodput": round(productive / wall, 5) if wall > 0 else None,
        "badput": {
            "startup_s": round(max(ready, default=launch) - launch, 4),
            "failed_steps_s": round(failed / replicas, 4),
            "quorum_s": round(quorum / replicas, 4),
        },
    }


# ------------------------------------------------------------------------------------------ replica


class _Reporter:
    """A replica's side of the files: ``replica<N>.json`` (atomic replace) and the events log."""

    def __init__(self, run_dir: Path, replica: int, attempt: int):
        self.run_dir, self.replica, self.attempt, self.pid = run_dir, replica, attempt, os.getpid()
        self.path = run_dir / f"replica{replica}.json"
        self.tmp = run_dir / f".replica{replica}.json.{self.pid}.tmp"
        events = run_dir / f"replica{replica}.events.jsonl"
        cut = events.exists() and events.stat().st_size and not events.read_bytes().endswith(b"\n")
        self.events = events.open("a")
        if cut:
            self.events.write("\n")  # a killed predecessor's last line was cut: do not glue ours to it
        self.step: int | None = None
        self.loss: float | None = None

    def status(self, state: str, **values) -> None:
        doc = {
            "replica": self.replica,
            "pid": self.pid,
            "attempt": self.attempt,
            "state": state,
            "step": self.step,
            "loss": self.loss,
            "time": time.time(),
            **values,
        }
        self.tmp.write_text(json.dumps(doc))
        os.replace(self.tmp, self.path)

    def event(self, event: str, **values) -> None:
        values.setdefault("t", time.time())
        doc = {"event": event, "replica": self.replica, "pid": self.pid, "attempt": self.attempt, **values}
        self.events.write(json.dumps(doc) + "\n")
        self.events.flush()


class _ReplicaModel:
    """What the normal runtime builds from the config, for one data-parallel replica of ``replicas``: the
    model (same seeded init), AdamW/SGD as :class:`~workers.training.trainer.Trainer` builds them, the
    data slice of DP rank ``replica``, the LR schedule, micro-batching and clipping."""

    def __init__(self, cfg):
        import torch

        from workers.devices import backend as device_mod
        from workers.training.data import TokenCorpus
        from workers.training.model import Transformer

        self.cfg = cfg
        self.device_choice = device_mod.select_device(cfg.device if cfg.device != "auto" else None)
        torch.manual_seed(cfg.seed)
        self.model = Transformer.build(cfg.model, cfg.seed)
        self.corpus = TokenCorpus.from_source(cfg.data)
        from workers.training.trainer import AUTOCAST_DTYPES

        self.autocast = AUTOCAST_DTYPES.get(cfg.training.dtype)
        self.device = self.loader = self.optimizer = None

    def use_slot(self, replica: int, replicas: int) -> None:
        """Train as replica ``replica`` of ``replicas``: its device (local rank ``replica``, as the runtime
        places DP ranks on a node), its slice of every global batch, the optimizer over its parameters."""
        import torch

        from workers.training.data import ShardedTokenLoader

        cfg = self.cfg
        self.device = self.device_choice.device_for_local_rank(replica)
        if self.device.type != "cpu":
            getattr(torch, self.device.type).set_device(self.device)
        self.model.to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # Two persistent flat buffers, each the gradients plus the loss: the backward accumulates into
        # views of ``grads`` (as DDP's gradient_as_bucket_view), and the all-reduce runs on ``comm``, a copy:
        # torchft may leave a failed all-reduce's tensor half reduced, and the local gradients must survive
        # it for the next quorum. At 100M parameters this replaced a fresh 400 MB torch.cat and a copy back
        # into every p.grad per step (page faults on new memory: ~1.3 s of a 2.2 s step on this machine).
        n = sum(p.numel() for p in self.params)
        dtype = self.params[0].dtype
        self.grads = torch.zeros(n + 1, dtype=dtype, device=self.device)
        self.comm = torch.zeros(n + 1, dtype=dtype, device=self.device)
        self._point_grads_at(self.grads)
        if cfg.training.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.params, lr=cfg.lr, momentum=0.9)
        else:  # as Trainer: torch's AdamW, fused where the parameters are plain CPU/CUDA tensors
            fused = {"fused": True} if self.device.type in ("cpu", "cuda") else {}
            self.optimizer = torch.optim.AdamW(
                self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, **fused
            )
        self.loader = ShardedTokenLoader(
            self.corpus,
            cfg.model.seq_length,
            cfg.training.global_batch_size,
            dp_rank=replica,
            dp_size=replicas,
            seed=cfg.seed,
        )

    def _point_grads_at(self, flat) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p)
            offset += n

    def state_dict(self) -> dict:
        """What a healing peer fetches (the live tensors: torchft serves them before this replica's next
        optimizer step, which waits for the transfer to finish)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def forward_backward(self, step: int):
        """This replica's loss on its slice of step ``step``'s global batch; gradients accumulated."""
        import torch

        from workers.training.parallelize import cross_entropy
        from workers.training.trainer import lr_at

        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, self.cfg)
        self.loader.load_state_dict({"consumed_samples": step * self.cfg.training.global_batch_size})
        inputs, labels = self.loader.next_batch()
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        self.grads.zero_()  # the gradients are views of it: accumulated in place by the backward
        mbs = self.cfg.strategy.micro_batch_size
        micro = list(zip(inputs.split(mbs), labels.split(mbs), strict=True))
        total = torch.zeros((), device=self.device)
        for x, y in micro:
            ctx = (
                torch.autocast(self.device.type, dtype=self.autocast)
                if self.autocast
                else contextlib.nullcontext()
            )
            with ctx:
                loss = cross_entropy(self.model(x), y) / len(micro)
            loss.backward()
            total += loss.detach()
        return total

    def flat_grads(self, loss):
        """The gradients and the loss, copied into the buffer the all-reduce may overwrite."""
        self.grads[-1] = loss
        self.comm.copy_(self.grads)
        return self.comm

    def apply_averaged(self, flat) -> tuple[float, float]:
        """The averaged buffer becomes the gradients (the two buffers swap: no copy back), clipped as the
        Trainer does; (loss, grad norm). The norm is float32 over the flat buffer (pairwise-summed): all
        replicas compute it from the same averaged bytes, so they agree; a float64 pass (the Trainer's
        layout-independent norm) cost 0.8 s a step at 100M parameters here."""
        import torch

        assert flat is self.comm
        self.grads, self.comm = self.comm, self.grads
        self._point_grads_at(self.grads)
        grads = self.grads[:-1]
        loss = float(self.grads[-1])
        grad_norm = float(torch.linalg.vector_norm(grads))
        clip = self.cfg.grad_clip
        if clip > 0 and grad_norm > clip:
            grads.mul_(clip / (grad_norm + 1e-6))
        return loss, grad_norm

    def checksum(self) -> str:
        """sha256 over every parameter and optimizer-state tensor, in a fixed order."""
        import torch

        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        for index, state in sorted(self.optimizer.state_dict()["state"].items()):
            for key, value in sorted(state.items()):
                h.update(f"{index}.{key}".encode())
                if isinstance(value, torch.Tensor):
                    h.update(
                        value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                    )
                else:
                    h.update(repr(value).encode())
        return h.hexdigest()


@contextlib.contextmanager
def _manager_server_bound_to(host: str):
    """torchft's ``Manager`` starts its gRPC server on ``[::]`` (all interfaces) with no way to say
    otherwise; this binds it to ``host`` for the ``Manager`` built inside the block."""
    import torchft.manager as tm

    original = tm.ManagerServer

    def bound(**kwargs):
        kwargs["bind"] = f"{_url_host(host)}:0"
        return original(**kwargs)

    tm.ManagerServer = bound
    try:
        yield
    finally:
        tm.ManagerServer = original


def _bound_http_transport(host: str, timeout):
    """torchft's ``HTTPTransport`` (the checkpoint server a healing peer fetches from) listening on
    ``host`` only, and advertising it (torchft binds ``("", 0)`` on IPv6 and advertises the host name)."""
    import socket
    from http.server import ThreadingHTTPServer

    import torchft.checkpointing.http_transport as ht

    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class BoundServer(ThreadingHTTPServer):
        address_family = family
        request_queue_size = 1024  # as torchft's server

        def __init__(self, _address, handler):
            super().__init__((host, 0), handler)

    class BoundHTTPTransport(ht.HTTPTransport):
        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            return f"http://{_url_host(host)}:{port}/checkpoint/"

    original = ht._IPv6HTTPServer
    ht._IPv6HTTPServer = BoundServer
    try:
        return BoundHTTPTransport(timeout=timeout, num_chunks=0)
    finally:
        ht._IPv6HTTPServer = original


def _wait_for_file(path: Path, timeout_s: float, *, unless: Path | None = None) -> bool:
    """Wait for ``path``; False if ``unless`` appears first. ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if unless is not None and unless.exists():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(POLL_S)
    return True


def replica_main(spec_path: Path, replica: int | None, attempt: int = 1, spare: int | None = None) -> int:
    """One replica process: build, heartbeat, wait for the start, train with a commit per step, then
    stay in the quorum (so a replica still healing can fetch from it) until the supervisor says finish.
    A spare (``spare`` given, ``replica`` None) builds everything that does not depend on the slot, then
    waits for ``spare<k>.assign`` to say which replica it replaces."""
    t_process = time.time()
    spec = json.loads(Path(spec_path).read_text())
    run_dir, host, steps = Path(spec["run_dir"]), spec["host"], spec["steps"]
    report = None
    if replica is not None:
        report = _Reporter(run_dir, replica, attempt)
        report.status("starting")
        report.event("start", t=t_process)

    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo

    from workers.training.config import JobConfig

    torch.set_num_threads(spec["threads"])
    cfg = JobConfig.from_dict(spec["config"])
    rep = _ReplicaModel(cfg)
    timeout = timedelta(seconds=spec["collective_timeout_s"])
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    transport = _bound_http_transport(host, timeout)
    if spare is not None:
        t_built = time.time()
        (run_dir / f"spare{spare}.ready").write_text(str(t_built))
        assign = run_dir / f"spare{spare}.assign"
        if not _wait_for_file(assign, spec["timeout_s"], unless=run_dir / "finish"):
            return 0  # the run ended without needing this spare
        doc = json.loads(assign.read_text())
        replica, attempt = doc["replica"], doc["attempt"]
        report = _Reporter(run_dir, replica, attempt)
        report.status("starting")
        report.event("start", spare=spare, spare_built_s=round(t_built - t_process, 4))
    rep.use_slot(replica, spec["replicas"])
    with _manager_server_bound_to(host):
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=rep.load_state_dict,
            state_dict=rep.state_dict,
            min_replica_size=1,
            use_async_quorum=False,  # heal before the forward pass: a rejoined replica contributes at once
            timeout=timeout,
            quorum_timeout=timedelta(seconds=QUORUM_TIMEOUT_S),
            connect_timeout=timedelta(seconds=CONNECT_TIMEOUT_S),
            rank=0,
            world_size=1,
            store_addr=host,
            store_port=store.port,
            lighthouse_addr=spec["lighthouse"],
            replica_id=f"replica{replica}",
            hostname=host,
            heartbeat_interval=timedelta(milliseconds=HEARTBEAT_INTERVAL_MS),
            checkpoint_transport=transport,
            init_sync=False,  # every replica starts from the same seeded init; a restarted one heals
            max_retries=MAX_FAILED_COMMITS,
        )
    report.status("ready")
    report.event("ready")
    _wait_for_file(run_dir / "go", spec["timeout_s"])

    step = 0
    quorum = width_before = None
    kept = None  # (step, loss) of local gradients an all-reduce failed on: still in p.grad, still valid
    while True:
        t_start = time.time()
        manager.start_quorum()
        t_compute = time.time()
        if manager.current_step() != step:
            report.event(
                "healed",
                from_step=step,
                to_step=manager.current_step(),
                seconds=round(t_compute - t_start, 4),
            )
            step = manager.current_step()
        if step >= steps:
            break
        width = manager.num_participants()
        reused = kept is not None and kept[0] == step
        if reused:
            # the last attempt at this step lost a peer in its all-reduce: this replica's gradients (on its
            # slice of the step, from the same parameters) are what running the step again would give, bit
            # for bit -- all-reduce them with the new quorum instead of computing them again
            loss = kept[1]
        else:
            loss = rep.forward_backward(step)
        kept = None
        flat = rep.flat_grads(loss)
        if _quorum_size(manager) > 1:
            manager.allreduce(flat).wait()  # AVG over the quorum; an error is recorded, not raised
        # else: alone in the quorum, the average is the buffer itself (gloo's one-rank all-reduce still
        # copied 400 MB through its pair buffers: ~0.5 s of a survivor's step at 100M parameters here)
        if manager.errored() is None:
            loss_avg, grad_norm = rep.apply_averaged(flat)
        if manager.should_commit():
            rep.optimizer.step()
            t_commit = time.time()
            step = manager.current_step()
            values = {"step": step, "loss": loss_avg, "grad_norm": grad_norm, "participants": width}
            if reused:
                values["gradients_reused"] = True
            # the first commit of a quorum that did not shrink (torchft bumps its private quorum id when the
            # membership changes): record the state, so that replicas can be compared right after a rejoin.
            # Not after a shrink (nothing to compare), and after t_commit: sha256 over 1.2 GB of state took
            # 0.9 s at 100M parameters, which is the instrument's cost, not the recovery's.
            quorum_id = getattr(manager, "_quorum_id", None)
            if (quorum_id != quorum or quorum_id is None) and (width_before is None or width >= width_before):
                values["checksum"] = rep.checksum()
            quorum, width_before = quorum_id, width
            report.step, report.loss = step, loss_avg
            report.event("commit", t_start=t_start, t_compute=t_compute, t_commit=t_commit, **values)
            report.status("training", quorum_t=t_compute)
        else:
            error = manager.errored()
            kept = (step, loss)  # flat_grads copied them: p.grad is untouched by the failed all-reduce
            report.event(
                "failed",
                step=step,
                t_start=t_start,
                t_compute=t_compute,
                t_end=time.time(),
                error=str(error)[:300],
            )
    report.step = step
    report.event("done", step=step, checksum=rep.checksum())
    report.status("done")
    # Stay in the quorum until the supervisor says finish: a replacement that joins now still needs a
    # healthy peer to heal from (without one it would form a quorum alone and train from scratch).
    finish = run_dir / "finish"
    while not finish.exists():
        manager.start_quorum()
        time.sleep(0.05)
    manager.shutdown(wait=False)
    report.events.close()
    return 0


def _quorum_size(manager) -> int:
    """How many replicas the current quorum's process group spans (torchft 0.2.0 has no public accessor:
    its ``Manager._pg`` is the group ``start_quorum`` configured). 0 when it cannot tell: then all-reduce."""
    try:
        return int(manager._pg.size())
    except Exception:  # a torchft without these internals: fall back to always all-reducing
        return 0


def _torchft_extension():
    """torchft's Rust extension without the ``torchft`` package's ``__init__`` (which imports torch, seconds
    of start-up the Lighthouse does not need)."""
    import importlib.machinery
    import importlib.util

    spec = importlib.util.find_spec("torchft")
    if spec is None or not spec.submodule_search_locations:
        raise HotSwapError("torchft is not installed (pip install torchft==0.2.0)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = next(folder.glob("_torchft*.so"), None)
    if path is None:
        raise HotSwapError(f"torchft's extension _torchft*.so is missing from {folder}")
    loader = importlib.machinery.ExtensionFileLoader("torchft._torchft", str(path))
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location("torchft._torchft", path, loader=loader)
    )
    loader.exec_module(module)
    return module


def lighthouse_main(bind: str, heartbeat_timeout_ms: int, out: Path) -> int:
    """The Lighthouse in a process of its own (its Rust logger writes a line per quorum tick to stderr:
    into ``lighthouse.log``, not the caller's terminal). Writes its port to ``out``, serves until killed."""
    server = _torchft_extension().LighthouseServer(
        bind=bind,
        min_replicas=1,
        join_timeout_ms=JOIN_TIMEOUT_MS,
        quorum_tick_ms=QUORUM_TICK_MS,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )
    port = int(server.address().rsplit(":", 1)[1])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": port, "pid": os.getpid()}))
    os.replace(tmp, out)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.reliability.hotswap")
    sub = parser.add_subparsers(dest="role", required=True)
    r = sub.add_parser("replica", help="one replica process (started by run_hot_swap)")
    r.add_argument("--spec", required=True, type=Path)
    slot = r.add_mutually_exclusive_group(required=True)
    slot.add_argument("--replica", type=int, help="the replica slot this process trains as")
    slot.add_argument("--spare", type=int, help="a warm spare: waits for spare<k>.assign")
    r.add_argument("--attempt", type=int, default=1)
    lh = sub.add_parser("lighthouse", help="the torchft Lighthouse (started by run_hot_swap)")
    lh.add_argument("--bind", required=True)
    lh.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    lh.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.role == "lighthouse":
        return lighthouse_main(args.bind, args.heartbeat_timeout_ms, args.out)
    code = replica_main(args.spec, args.replica, args.attempt, args.spare)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the gloo group and torchft's threads need no teardown: the peers expect us gone


if __name__ == "__main__":
    from workers.devices import backend as _device

    _device.prepare_environment()
    sys.exit(main())
