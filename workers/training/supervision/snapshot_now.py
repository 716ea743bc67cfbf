"""Snapshot now: a supervisor asks the ranks of its node for a snapshot off the job's cadence (the first
prevention action of the fault-risk loop, ``workers.reliability.risk_watch``), through two files in the
node's progress directory (``CANN_TRAIN_PROGRESS_DIR``)::

    snapshot_now.json       {"id": 3, "reason": "...", "requested_unix": ...}     (the supervisor writes it)
    snapshot_now.done.json  {"id": 3, "step": 118, "name": "step-000118", "stall_s": 0.21,
                             "previous_step": 100, "at_unix": ...}                 (local rank 0 writes it)

Files for the same reasons as the progress files: the supervisor and the ranks share no Redis when a job
runs under ``cann-train elastic``, and the request must survive a supervisor that restarts.

Agreement. A snapshot is a collective (DCP): every rank must take it at the same step. Each node's local
rank 0 looks at its node's request file once per step (one ``stat``) and puts 1 into the step's packed
all-reduce when a request it has not answered is there (``Trainer.train_step``); the sum is the same on every
rank, so all snapshot after the same step when any node asked. Then every local rank 0 answers the request
of its node (if any), so a request from any node is answered by one snapshot of the whole job.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

REQUEST = "snapshot_now.json"
DONE = "snapshot_now.done.json"


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("id"), int) else None


def request_snapshot(directory: str | Path, *, reason: str) -> int:
    """Ask the ranks of this node's progress directory for a snapshot now; returns the request's id."""
    directory = Path(directory)
    last = max((_read_json(directory / name) or {}).get("id", 0) for name in (REQUEST, DONE))
    rid = int(last) + 1
    _write_json(directory / REQUEST, {"id": rid, "reason": reason, "requested_unix": time.time()})
    return rid


def answer(directory: str | Path, request_id: int) -> dict | None:
    """The ranks' answer to request ``request_id`` (or a later one), or None while it is pending."""
    done = _read_json(Path(directory) / DONE)
    return done if done is not None and done["id"] >= request_id else None


class SnapshotRequests:
    """A rank's side (local rank 0 of each node): is there a request not answered yet? One ``stat`` per
    call while nothing changed. ``from_env`` returns None where no supervisor watches."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._mtime: float | None = None
        self._pending: dict | None = None
        self.answered = (_read_json(self.dir / DONE) or {}).get("id", 0)

    @classmethod
    def from_env(cls) -> SnapshotRequests | None:
        from workers.training.supervision import progress as progress_mod

        directory = os.environ.get(progress_mod.ENV)
        return cls(directory) if directory else None

    def pending(self) -> dict | None:
        try:
            mtime = (self.dir / REQUEST).stat().st_mtime_ns
        except OSError:
            return None
        if mtime != self._mtime:
            self._mtime = mtime
            self._pending = _read_json(self.dir / REQUEST)
        if self._pending is not None and self._pending["id"] > self.answered:
            return self._pending
        return None

    def answer(self, *, step: int, name: str | None, stall_s: float, previous_step: int | None) -> None:
        """The snapshot the job just took answers this node's pending request (if any)."""
        request = self.pending()
        if request is None:
            return
        self.answered = request["id"]
        _write_json(
            self.dir / DONE,
            {
                "id": request["id"],
                "step": step,
                "name": name,
                "stall_s": round(stall_s, 6),
                "previous_step": previous_step,
                "at_unix": time.time(),
            },
        )
