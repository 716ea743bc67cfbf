"""What the ranks tell the supervisor that watches them, through files in one directory.

The supervisor (``workers.reliability.elastic.ElasticWatch``) puts ``CANN_TRAIN_PROGRESS_DIR`` into the
ranks' environment. Each rank then keeps ``rank<r>.json`` up to date (pid, torchrun restart, phase, newest
committed step, when), and rank 0 appends its timeline to ``timeline.jsonl`` (process start, ready, resumed,
each committed step with its loss and times, end), from which faults are timed and goodput is computed.

Files, not Redis or the TCPStore: the watcher must read them while the ranks are dead, hung or being
restarted, and a job that runs without the control plane (``cann-train elastic``) has no Redis. A rank
writes two small files per step (an ``os.replace`` and an append, no fsync): microseconds beside a step.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

ENV = "CANN_TRAIN_PROGRESS_DIR"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun in every rank it starts
GROUP_START_ENV = "CANN_TRAIN_GROUP_START"
"""How many times this node's agent has started its ranks (1: the first group), set by the warm agent
(``workers.training.supervision.agent``) before each start. torchrun's restart count counts failures only: a group
re-formed after a membership change (a node joined or left without a rank failing) starts at the old count."""
TIMELINE = "timeline.jsonl"
NODE = os.environ.get("CANN_TRAIN_NODE") or socket.gethostname()
"""The node this rank runs on, as its supervisor names it (``workers.training.supervision.supervisor.node_name``): the
fault-risk loop drains a straggler's node by this name."""


def restart_count() -> int:
    """Which torchrun restart this rank process belongs to (0: the first start)."""
    try:
        return int(os.environ.get(RESTART_ENV, "0"))
    except ValueError:
        return 0


def group_start() -> int:
    """Which start of its node agent's ranks this rank belongs to (1: the first; 1 where no agent says)."""
    try:
        return max(1, int(os.environ.get(GROUP_START_ENV, "1")))
    except ValueError:
        return 1


def process_start_unix() -> float:
    """When this process was started (the kernel's record, so the import of torch is counted)."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # no psutil or no /proc: the moment we were asked is the best we know
        return time.time()


class ProgressWriter:
    """A rank's side. ``None``-safe construction: :meth:`from_env` returns None when nobody watches."""

    def __init__(self, directory: str | Path, rank: int, restart: int | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.restart = restart_count() if restart is None else restart
        self.pid = os.getpid()
        self._path = self.dir / f"rank{rank}.json"
        self._tmp = self.dir / f".rank{rank}.json.tmp"
        self._timeline = None
        if rank == 0:
            self._timeline = (self.dir / TIMELINE).open("a")
            if self._timeline.tell() and not (self.dir / TIMELINE).read_bytes().endswith(b"\n"):
                self._timeline.write("\n")  # the last line was cut by a kill: do not glue ours to it
        self.step: int | None = None

    @classmethod
    def from_env(cls, rank: int) -> ProgressWriter | None:
        directory = os.environ.get(ENV)
        return cls(directory, rank) if directory else None

    def update(self, phase: str, step: int | None = None, *, t: float | None = None) -> None:
        """``phase``: ``starting`` | ``resuming`` | ``training`` | ``finishing``; ``step``: newest committed;
        ``t``: when (default now; a deferred write passes the time it was asked for)."""
        if step is not None:
            self.step = step
        doc = {
            "rank": self.rank,
            "pid": self.pid,
            "node": NODE,
            "restart": self.restart,
            "phase": phase,
            "step": self.step,
            "t": time.time() if t is None else t,
        }
        self._tmp.write_text(json.dumps(doc))
        os.replace(self._tmp, self._path)

    def event(self, event: str, **values) -> None:
        """A line of rank 0's timeline (other ranks write none)."""
        if self._timeline is None:
            return
        values.setdefault("t", time.time())
        self._timeline.write(json.dumps({"event": event, "restart": self.restart, **values}) + "\n")
        self._timeline.flush()

    def close(self) -> None:
        if self._timeline is not None:
            self._timeline.close()
            self._timeline = None


def read_progress(directory: str | Path) -> dict[int, dict]:
    """Each rank's newest ``rank<r>.json`` (a file being replaced right now is simply read next time)."""
    out: dict[int, dict] = {}
    for path in Path(directory).glob("rank*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rank"), int):
            out[doc["rank"]] = doc
    return out


class TimelineReader:
    """Follows rank 0's ``timeline.jsonl`` as it grows (whole lines only)."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / TIMELINE
        self.offset = 0
        self._partial = b""
        self.events: list[dict] = []

    def read_new(self) -> list[dict]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        pieces = (self._partial + data).split(b"\n")
        self._partial = pieces.pop()
        new = []
        for piece in pieces:
            try:
                doc = json.loads(piece)
            except ValueError:
                continue  # a line cut by a kill mid-write
            if isinstance(doc, dict):
                new.append(doc)
        self.events.extend(new)
        return new
