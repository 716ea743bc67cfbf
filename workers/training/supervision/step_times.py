"""Per-rank step timing, through files beside the progress files: what the straggler detector reads.

Every rank appends one line per optimizer step to ``steps_rank<r>.jsonl`` in the progress directory
(``CANN_TRAIN_PROGRESS_DIR``, :mod:`workers.training.supervision.progress`)::

    {"step": 118, "restart": 0, "t": 1796135321.45, "step_s": 0.0251, "wait_s": 0.0042}

- ``t``: when the step ended on this rank (``time.time()``; one clock per node, see below);
- ``step_s``: wall time since this rank's previous line, i.e. the whole loop iteration (data, forward,
  backward, optimizer, progress files, metrics gathers): a rank stopped *anywhere* in its loop shows it;
- ``wait_s``: the part of the step this rank spent blocked in collectives waiting for its peers (``null``
  when the trainer does not measure it): the sum of
  - the DDP comm hook's exposed communication time (``workers.training.comm.stats``: from this rank's last
    gradient bucket being ready to every bucket reduced), i.e. the time between this rank finishing its
    backward and its gradients being reduced. A watched DDP job without a ``comm_hook`` of its own runs
    torch's plain all-reduce hook with our timing for this (bitwise the same gradients as DDP's built-in
    reduction: checked on the dp2 example, 15 steps, every loss equal); and
  - the wall time of the step's own *blocking* collectives (the trainer's packed all-reduce of loss and
    gradient norm, the per-rank metrics all-gather, the energy all-reduce), each timed where it is called
    (:data:`blocking_wait`). A rank stopped after its gradients were reduced makes its peers wait in the
    next of these, which the hook does not see (measured on the 4-rank bench job: with the hook's time
    alone, about half of the 0.5 s stops of a rank were invisible in every rank's split of the step).

  Other layouts (FSDP, TP, PP) wait inside collectives that run in the middle of forward and backward;
  only the step's own blocking collectives are timed there, so a straggler is found less reliably (a
  measurement of the NCCL/HCCL streams' waits would close that gap on GPUs and NPUs).

Why every rank and not rank 0's ``train`` events: in synchronous data parallelism every rank's step takes
the same wall time (the gradient all-reduce lines them up), so step time alone cannot say *which* rank is
slow; the split of each rank's step into compute and wait can (:mod:`workers.reliability.straggler`).
Files, as for progress: they are read while ranks are stopped, and a job run by ``cann-train elastic`` has
no Redis. One append per step (no fsync): microseconds beside a step.

Clocks: ``t`` orders steps and places the window; only durations (``step_s``, ``wait_s``), measured on each
rank's own monotonic clock, are compared across ranks, so clock skew between nodes does not bias the scores.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path

from workers.training.supervision import progress as progress_mod

FILE_PATTERN = "steps_rank*.jsonl"
_RANK_OF = re.compile(r"steps_rank(\d+)\.jsonl")


def rank_files(directory: str | Path) -> list[tuple[int, Path]]:
    """``(rank, path)`` of every rank's step file in ``directory``, by rank."""
    found = ((_RANK_OF.fullmatch(p.name), p) for p in Path(directory).glob(FILE_PATTERN))
    return sorted((int(m.group(1)), p) for m, p in found if m)


class BlockingWait:
    """Wall seconds this process spent inside the step's own blocking collectives since the last
    :meth:`take` (one per process: a rank). ``with blocking_wait.timed(): dist.all_reduce(t)``."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def timed(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t0

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


blocking_wait = BlockingWait()
"""This rank's clock of blocking collectives (the trainer, the rank metrics and the energy meter add to it)."""


def watched() -> bool:
    """Whether a supervisor follows this run's per-rank step times (``CANN_TRAIN_PROGRESS_DIR`` is set)."""
    return bool(os.environ.get(progress_mod.ENV))


class StepTimesWriter:
    """A rank's side: one ``record`` per optimizer step. ``from_env`` returns None when nobody watches."""

    def __init__(self, directory: str | Path, rank: int, restart: int | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = int(rank)
        self.restart = progress_mod.restart_count() if restart is None else int(restart)
        self._file = (self.dir / f"steps_rank{self.rank}.jsonl").open("a")
        if self._file.tell() and not (self.dir / f"steps_rank{self.rank}.jsonl").read_bytes().endswith(b"\n"):
            self._file.write("\n")  # the last line was cut by a kill: do not glue ours to it
        self._last: float | None = None

    @classmethod
    def from_env(cls, rank: int, restart: int | None = None) -> StepTimesWriter | None:
        directory = os.environ.get(progress_mod.ENV)
        return cls(directory, rank, restart) if directory else None

    def record(
        self,
        step: int,
        *,
        wait_s: float | None = None,
        step_time_s: float | None = None,
        at: float | None = None,
    ) -> None:
        """Step ``step`` just ended on this rank (at ``at``, default now). ``step_s`` is ``step_time_s`` when
        given, else the time since the previous ``record`` (the whole loop iteration; the first line of a
        process has nothing to measure from and is written without a duration)."""
        now = time.monotonic()
        if step_time_s is None and self._last is not None:
            step_time_s = now - self._last
        self._last = now
        doc = {
            "step": int(step),
            "restart": self.restart,
            "t": time.time() if at is None else float(at),
            "step_s": None if step_time_s is None else round(step_time_s, 6),
            "wait_s": None if wait_s is None else round(max(0.0, float(wait_s)), 6),
        }
        self._file.write(json.dumps(doc) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class StepTimesReader:
    """Follows every rank's ``steps_rank<r>.jsonl`` as it grows (whole lines only, new ranks' files too)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def read_new(self) -> list[dict]:
        """The lines written since the last call, each with its ``rank``, in file order per rank."""
        new: list[dict] = []
        for rank, path in rank_files(self.dir):
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            self._offsets[path] = offset + len(data)
            pieces = (self._partial.get(path, b"") + data).split(b"\n")
            self._partial[path] = pieces.pop()
            for piece in pieces:
                try:
                    doc = json.loads(piece)
                except ValueError:
                    continue  # a line cut by a kill mid-write
                if isinstance(doc, dict) and isinstance(doc.get("step"), int):
                    new.append({**doc, "rank": rank})
        return new
