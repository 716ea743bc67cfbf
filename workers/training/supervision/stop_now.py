"""Stop now: a supervisor asks the ranks of its node to stop cleanly (a cancel, a drain, the end of a
carbon-aware slot) through one file in the node's progress directory (``CANN_TRAIN_PROGRESS_DIR``)::

    stop_now.json    {"id": 1, "reason": "cancelled by alice", "requested_unix": ...}   (the supervisor writes it)

A user's script sees it through the SDK (``cann_train.Run.should_stop``: local rank 0 of each node looks once
a step, and one small all-reduce makes every rank agree), snapshots and exits 0; the supervisor gives it
a grace period before it stops the ranks itself. Files for the reasons of ``snapshot_now``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

REQUEST = "stop_now.json"


def request_stop(directory: str | Path, *, reason: str) -> None:
    """Ask the ranks of this node's progress directory to stop cleanly."""
    path = Path(directory) / REQUEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"id": 1, "reason": reason, "requested_unix": time.time()}))
    os.replace(tmp, path)


def clear(directory: str | Path) -> None:
    try:
        (Path(directory) / REQUEST).unlink()
    except FileNotFoundError:
        pass


class StopRequests:
    """A rank's side (local rank 0 of each node); ``from_env`` returns None where no supervisor watches."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / REQUEST
        self._mtime: int | None = None
        self._doc: dict | None = None

    @classmethod
    def from_env(cls) -> StopRequests | None:
        from workers.training.supervision import progress as progress_mod

        directory = os.environ.get(progress_mod.ENV)
        return cls(directory) if directory else None

    def pending(self) -> dict | None:
        """The request, if there is one: one ``stat`` per call while the file is absent or unchanged (it is
        looked at every step), read again when its modification time changes."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            self._mtime = self._doc = None
            return None
        if mtime != self._mtime:
            try:
                doc = json.loads(self.path.read_text())
            except (OSError, ValueError):
                return None  # replaced or cut while read: the next call reads it again
            self._mtime, self._doc = mtime, doc if isinstance(doc, dict) else None
        return self._doc
