"""The snapshot engine a training loop talks to: :class:`SnapshotManager`.

``save(step, state)`` stages the state into CPU buffers (the only part the training loop waits for) and
hands it to ``torch.distributed.checkpoint.async_save``, whose background thread plans the write over the
manager's own gloo process group and writes it with :class:`~.storage.SnapshotWriter`. Every
``full_every``-th snapshot is a full one; in between, with ``delta="xor"``, deltas against the last full one
(its staged CPU buffers are kept as the base, so a delta never reads the disk; two buffer sets alternate:
the base, and the one being staged into; after warm-up nothing is allocated per snapshot), or with
``delta="log"``, logs of the gradients the optimizer consumed since the previous snapshot
(:mod:`.gradlog`: the trainer hands each step's gradients to ``record_gradients`` while ``wants_gradients``,
and the restore replays them on the chain's full snapshot).

``restore(target, ...)`` finds the newest snapshot that verifies (rank 0 checks, then tells the others),
and loads it into ``target`` through :class:`~.storage.SnapshotReader` -- DCP reshards when the layout
changed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._state_dict_utils import (
    CompanionMismatch,
    _copy_state_dict,
    _create_cpu_state_dict,
)
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.staging import AsyncStager

from workers.training.checkpoint import storage
from workers.training.checkpoint.gradlog import GradientLog
from workers.training.checkpoint.storage import (
    CorruptSnapshot,
    DeltaBase,
    LogBase,
    Skipped,
    SnapshotInfo,
    SnapshotReader,
    SnapshotWriter,
    snapshot_name,
)

DELTA_KINDS = ("xor", "log")
"""How the snapshots between two full ones are taken: XOR deltas of the whole state against the last full
one, or logs of the optimizer's inputs replayed on the previous snapshot (docs/elastic.md)."""


@dataclass
class SnapshotRecord:
    """One snapshot as this process saw it. ``bytes_written``/``raw_bytes`` are the whole snapshot's (all
    ranks), known on the coordinator (rank 0) once the write finished."""

    name: str
    step: int
    kind: str
    """``full``, ``delta`` or ``log`` (as planned; the manifest says ``full`` if no item of a delta found its
    base)."""
    stall_s: float
    """Training-thread time: waiting for the previous write (``wait_s``) + building the state dict + staging,
    and for a log the gradient copies of its steps (``record_s``)."""
    wait_s: float = 0.0
    record_s: float = 0.0
    """A log: the part of ``stall_s`` spent copying each logged step's gradients (paid during those steps)."""
    log_steps: list[int] | None = None
    """A log: the optimizer steps whose gradients it holds."""
    base: str | None = None
    write_s: float | None = None
    """Background time from hand-over to published (planning, encoding, fsync, rename, retention)."""
    bytes_written: int | None = None
    raw_bytes: int | None = None
    error: str | None = None
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _touch(obj) -> None:
    """Zero every tensor of a nested state dict (fault its pages in now)."""
    if isinstance(obj, torch.Tensor):
        obj.zero_()
    elif isinstance(obj, dict):
        for value in obj.values():
            _touch(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            _touch(value)


class _Prestaged(AsyncStager):
    """A log's state is staged before ``async_save`` (its gradients were copied step by step): pass it on."""

    _synchronize_after_execute = False

    def stage(self, state_dict: dict) -> dict:
        return state_dict

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        return None


class BufferStager(AsyncStager):
    """DCP stager that copies a state dict into CPU buffers it is given (``target``), or allocates them
    (``_create_cpu_state_dict``, what DCP's own stagers use). Blocking: when ``stage`` returns, training
    may change the live tensors."""

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self.target: dict | None = None
        self.staged: dict | None = None

    def stage(self, state_dict: dict) -> dict:
        if self.target is not None:
            try:
                self.staged = _copy_state_dict(state_dict, self.target)
                return self.staged
            except (CompanionMismatch, RuntimeError):  # the state's structure or a shape changed
                pass
        self.target = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
        self.staged = _copy_state_dict(state_dict, self.target)
        return self.staged

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        self.target = self.staged = None


@dataclass
class _Base:
    name: str
    manifest_sha256: str | None
    buffers: dict
    items: dict


@dataclass
class _Link:
    """The last snapshot published (``delta="log"``): the next log's base."""

    name: str
    step: int
    manifest_sha256: str | None
    """Known on the coordinator only (it writes the manifests)."""


@dataclass
class _Write:
    future: Future
    record: SnapshotRecord
    writer: SnapshotWriter
    staged: dict
    handed_over: float
    gradients: list = field(default_factory=list)
    """A log: the gradient buffer sets it holds (back to the log once written)."""


class SnapshotManager:
    """Asynchronous, incremental, verified snapshots of one rank's training state under ``root``.

    Every rank of the job makes one with the same arguments and calls ``save`` at the same steps (the
    writes are collective over ``process_group``: give it a group of its own, e.g.
    ``dist.new_group(backend="gloo")``, so snapshot traffic never queues behind training collectives).
    ``fresh``: this run starts from scratch, so ``root`` must hold no snapshots (of another run, whose
    newer steps retention would keep in place of this run's). ``delta``: ``"xor"`` or ``"log"`` (see the
    module docstring).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        process_group: dist.ProcessGroup | None = None,
        full_every: int = 4,
        keep: int = 3,
        zstd_level: int = 1,
        layout: dict | None = None,
        log: Callable[[str], None] | None = None,
        fresh: bool = False,
        delta: str = "xor",
    ):
        if full_every < 1 or keep < 1:
            raise ValueError(f"full_every and keep must be >= 1, got {full_every}, {keep}")
        if delta not in DELTA_KINDS:
            raise ValueError(f"delta must be one of {', '.join(DELTA_KINDS)}, got {delta!r}")
        self.delta = delta
        self.root = Path(root)
        self.rank, self.world_size, self.group = rank, world_size, process_group
        self.full_every, self.keep, self.zstd_level = full_every, keep, zstd_level
        self.layout = layout or {}
        self.log = log or (lambda line: None)
        self.records: list[SnapshotRecord] = []
        self._stager = BufferStager()
        self._base: _Base | None = None
        self._free: list[dict] = []
        """Staging buffer sets not in use (the base's set is held by ``_base``)."""
        self._count = 0
        self._pending: _Write | None = None
        self.gradients: GradientLog | None = GradientLog() if delta == "log" else None
        """``delta="log"``: the gradients recorded since the previous snapshot."""
        self._last: _Link | None = None
        self._log_stager = BufferStager()
        self._preparing: threading.Thread | None = None
        self._prepare_error: BaseException | None = None
        self.prepare_s = 0.0
        """Seconds :meth:`prepare_async` took in the background."""
        """Stages a log's state besides its gradients (step, data position, RNG, buffers: small)."""
        existing: list[Any] = [None]
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            for name in storage.clean_partial(self.root):
                self.log(f"snapshot: removed {name} (an interrupted write)")
            existing[0] = storage.list_snapshots(self.root)
        if self.distributed:
            dist.broadcast_object_list(existing, src=0, group=self.group)
        if fresh and existing[0]:
            raise FileExistsError(
                f"snapshot_dir {self.root} already holds snapshots ({', '.join(existing[0][:3])}"
                f"{', ...' if len(existing[0]) > 3 else ''}) of another run: resume from them, or use an "
                "empty directory"
            )

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and self.world_size > 1

    # ------------------------------------------------------------------------------------------ saving

    def prepare(self, state_dict: dict, gradients: dict | None = None) -> float:
        """Allocate and touch both CPU buffer sets now (start-up time) instead of at the first two
        snapshots (a first copy into fresh memory runs ~4x slower than into touched pages). ``gradients``
        (``delta="log"``): tensors shaped like the gradients to log (the parameters): two sets for their
        copies too (a log being written, and the next one being recorded). Seconds taken. Waits for a
        :meth:`prepare_async` in flight first (and then has nothing left to do)."""
        self.wait_prepared()
        t0 = time.perf_counter()
        if self.gradients is not None and gradients is not None:
            self.gradients.prepare(gradients)
        # XOR deltas need the last full snapshot's buffers beside the ones staged into; logs do not
        while len(self._free) < (2 if self.full_every > 1 and self.delta == "xor" else 1):
            buffers = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            _touch(buffers)  # zeros, not the live values: the training thread may be changing them
            self._free.append(buffers)
        return time.perf_counter() - t0

    def prepare_async(self, state_dict: dict, gradients: dict | None = None) -> None:
        """:meth:`prepare` in a background thread, beside training: a restarted rank (every fault) does not
        stall on allocating a gigabyte per model-and-moments copy before its first snapshot. Only the
        shapes of ``state_dict`` / ``gradients`` are read. :meth:`wait_prepared` (called by :meth:`save`)
        joins it; ``prepare_s`` holds the seconds it took."""
        if self._preparing is not None:
            return

        def run() -> None:
            try:
                self.prepare_s = self.prepare(state_dict, gradients)
            except BaseException as exc:  # noqa: BLE001 - re-raised by wait_prepared in the training thread
                self._prepare_error = exc

        self._preparing = threading.Thread(target=run, name="snapshot-prepare", daemon=True)
        self._preparing.start()

    def wait_prepared(self) -> float:
        """Join :meth:`prepare_async` if it is in flight; seconds waited."""
        thread = self._preparing
        if thread is None or thread is threading.current_thread() or not thread.is_alive():
            self._raise_prepare_error()
            return 0.0
        t0 = time.perf_counter()
        thread.join()
        self._raise_prepare_error()
        return time.perf_counter() - t0

    def _raise_prepare_error(self) -> None:
        if self._prepare_error is not None:
            error, self._prepare_error = self._prepare_error, None
            raise RuntimeError("allocating the snapshot buffers failed") from error

    def next_kind(self) -> str:
        if self.delta == "log":
            return "full" if self._last is None or self._count % self.full_every == 0 else "log"
        return "full" if self._base is None or self._count % self.full_every == 0 else "delta"

    @property
    def wants_gradients(self) -> bool:
        """``delta="log"`` and the next snapshot is planned as a log: hand every optimizer step's gradients
        to :meth:`record_gradients` until then (a write that fails makes it a full one, and they are dropped)."""
        return self.delta == "log" and self._count % self.full_every != 0

    def record_gradients(self, step: int, grads: dict, meta: dict) -> float:
        """Copy the gradients optimizer step ``step`` is about to consume (see :class:`GradientLog`);
        seconds taken. Call between clipping and ``optimizer.step()``, while :attr:`wants_gradients`."""
        assert self.gradients is not None, "record_gradients needs delta='log'"
        return self.gradients.record(step, grads, meta)

    def save(
        self,
        step: int,
        state_dict: dict | Callable[[], dict],
        *,
        info: dict | None = None,
        log_state: dict | Callable[[], dict] | None = None,
    ) -> SnapshotRecord:
        """Snapshot ``state_dict`` (or what the callable returns, timed as part of the stall) at ``step``.
        Returns once the state is staged; the write goes on in the background. ``log_state``
        (``delta="log"``): the state of a log besides its gradients -- everything of ``state_dict`` that is
        not parameters or optimizer state -- built only when this snapshot is a log."""
        t0 = time.perf_counter()
        self.wait_prepared()  # (in the stall: the training thread waits for it)
        self._finish_pending()
        waited = time.perf_counter() - t0
        kind = self.next_kind()
        name = snapshot_name(step)
        if kind == "log":
            assert self._last is not None and self.gradients is not None
            if log_state is None:
                raise ValueError(f"snapshot {name} is a log: save() needs log_state")
            needed = list(range(self._last.step + 1, step + 1))
            if self.gradients.steps != needed:
                self.log(
                    f"snapshot {name}: full instead of a log: gradients recorded for steps "
                    f"{self.gradients.steps}, a log on {self._last.name} needs {needed}"
                )
                kind, self._count = "full", 0
            else:
                return self._save_log(step, name, log_state, info, t0, waited)
        recorded_s = self.gradients.discard() if self.gradients is not None else 0.0
        state = state_dict() if callable(state_dict) else state_dict
        base = None
        if kind == "delta":
            assert self._base is not None
            base = DeltaBase(self._base.name, self._base.manifest_sha256, self._base.items)
        # a full snapshot's raw bytes are the next XOR deltas' base (logs need no base in memory)
        record_items: dict | None = {} if kind == "full" and self.delta == "xor" else None
        writer = SnapshotWriter(
            self.root,
            name,
            step=step,
            base=base,
            record_items=record_items,
            layout=self.layout,
            info=info,
            zstd_level=self.zstd_level,
            retention=self.keep,
        )
        self._stager.target = self._free.pop() if self._free else None
        future = dcp.async_save(
            state, storage_writer=writer, process_group=self.group, async_stager=self._stager
        )
        staged = self._stager.staged
        record = SnapshotRecord(
            name,
            step,
            kind,
            stall_s=time.perf_counter() - t0 + recorded_s,
            wait_s=waited,
            base=base.name if base else None,
            record_s=recorded_s,
        )
        self.records.append(record)
        self._pending = _Write(future, record, writer, staged, time.perf_counter())
        self._count += 1
        return record

    def _save_log(self, step, name, log_state, info, t0, waited) -> SnapshotRecord:
        assert self._last is not None and self.gradients is not None
        state = log_state() if callable(log_state) else log_state
        steps = tuple(self.gradients.steps)
        part, held, recorded_s = self.gradients.take()
        staged = {**self._log_stager.stage(state), **part}  # the gradients are copies already
        writer = SnapshotWriter(
            self.root,
            name,
            step=step,
            log=LogBase(self._last.name, self._last.manifest_sha256, steps),
            layout=self.layout,
            info=info,
            zstd_level=self.zstd_level,
            retention=self.keep,
        )
        future = dcp.async_save(
            staged, storage_writer=writer, process_group=self.group, async_stager=_Prestaged()
        )
        record = SnapshotRecord(
            name,
            step,
            "log",
            stall_s=time.perf_counter() - t0 + recorded_s,
            wait_s=waited,
            base=self._last.name,
            record_s=recorded_s,
            log_steps=list(steps),
        )
        self.records.append(record)
        self._pending = _Write(future, record, writer, staged, time.perf_counter(), held)
        self._count += 1
        return record

    @property
    def in_flight(self) -> bool:
        """A background write has not finished (a process exiting now would wait for its thread)."""
        return self._pending is not None and not self._pending.future.done()

    def poll(self) -> SnapshotRecord | None:
        """Complete the bookkeeping of a finished background write, if there is one (never blocks)."""
        if self._pending is not None and self._pending.future.done():
            return self._finish_pending()
        return None

    def _finish_pending(self) -> SnapshotRecord | None:
        if self._pending is None:
            return None
        w, self._pending = self._pending, None
        record, writer = w.record, w.writer
        if self.gradients is not None:
            self.gradients.release(w.gradients)
        try:
            w.future.result()
        except (Exception, CheckpointException) as exc:  # a failed snapshot must not stop training
            record.error = f"{type(exc).__name__}: {exc}"[:2000]
            if record.kind != "log":
                self._free.append(w.staged)
            if record.kind == "full" or self.delta == "log":
                # a log continues the snapshot just before it: after a failed one, start over with a full
                self._count, self._last = 0, None
            self.log(f"snapshot {record.name} failed: {record.error}")
            return record
        record.write_s = time.perf_counter() - w.handed_over
        if writer.manifest is not None:
            record.bytes_written = writer.manifest["bytes_written"]
            record.raw_bytes = writer.manifest["raw_bytes"]
            record.removed = writer.removed
        if self.delta == "log":
            self._last = _Link(record.name, record.step, writer.manifest_sha256)
            if record.kind == "full":
                self._free.append(w.staged)
        elif record.kind == "full":
            if self._base is not None:
                self._free.append(self._base.buffers)
            self._base = _Base(record.name, writer.manifest_sha256, w.staged, writer.record_items or {})
        else:
            self._free.append(w.staged)
        if self.rank == 0:
            self.log(self.describe(record))
        return record

    @staticmethod
    def describe(r: SnapshotRecord) -> str:
        size = f"{r.bytes_written / 1e6:.2f} MB" if r.bytes_written is not None else "?"
        ratio = f" ({r.raw_bytes / r.bytes_written:.2f}x)" if r.bytes_written and r.raw_bytes else ""
        base = f" against {r.base}" if r.base else ""
        what = f"log of {len(r.log_steps)} step(s) on {r.base}" if r.log_steps else f"{r.kind}{base}"
        return (
            f"snapshot {r.name}: {what}, {size}{ratio}, training stalled {r.stall_s * 1000:.1f} ms, "
            f"written in {r.write_s or 0:.2f} s in the background"
        )

    def wait(self) -> list[SnapshotRecord]:
        """Block until the write in flight (if any) is published; the records of this process."""
        self._finish_pending()
        return self.records

    def close(self) -> None:
        """Wait for the write in flight, free the buffers and drop the process group (so that it is
        destroyed with the others at teardown, not later during interpreter shutdown)."""
        self.wait()
        self._stager.close()
        self._log_stager.close()
        if self.gradients is not None:
            self.gradients.clear()
        self._base = self._last = None
        self._free.clear()
        self.group = None

    # ----------------------------------------------------------------------------------------- loading

    def latest_good(self, exactly: str | None = None) -> tuple[SnapshotInfo | None, list[Skipped]]:
        """The newest snapshot that verifies (checked on rank 0, the answer broadcast) and those skipped.
        The skipped ones are set aside as ``<name>.corrupt``: the run continues from an older step, and
        retention must count the snapshots it writes from there, not the unusable newer ones.

        ``exactly``: that snapshot (a restore chosen by a person), which must verify (``CorruptSnapshot``
        otherwise, on every rank); the good newer ones are set aside as ``<name>.superseded``."""
        found: list[Any] = [None]
        if self.rank == 0:
            try:
                if exactly is None:
                    info, skipped = storage.find_latest_good(self.root)
                    for s in skipped:
                        self.log(f"snapshot {s.name} set aside as {storage.quarantine(self.root, s.name)}")
                else:
                    info, newer = storage.find_exactly(self.root, exactly)
                    skipped = []
                    for name in newer:
                        moved = storage.quarantine(self.root, name, storage.SUPERSEDED_SUFFIX)
                        skipped.append(Skipped(name, f"newer than {exactly}, the snapshot asked for"))
                        self.log(f"snapshot {name} set aside as {moved} (restoring {exactly})")
                found[0] = (info, skipped)
            except CorruptSnapshot as exc:
                found[0] = exc
        if self.distributed:
            dist.broadcast_object_list(found, src=0, group=self.group)
        if isinstance(found[0], CorruptSnapshot):
            raise CorruptSnapshot(f"snapshot {exactly}: {found[0]}")
        return found[0]

    def chain(self, info: SnapshotInfo) -> list[SnapshotInfo]:
        """What ``info`` is rebuilt from, oldest first: ``[info]``, or for a log its full snapshot then every
        log up to it (:func:`~.storage.chain`; ``info`` came from :meth:`latest_good`, which verified it)."""
        return storage.chain(self.root, info)

    def load(self, info: SnapshotInfo, target: dict, *, extra_prefixes: tuple[str, ...] = ()) -> dict:
        """Load snapshot ``info`` into ``target`` in place (DCP: tensors copied into the target's tensors,
        other values replaced). Keys starting with one of ``extra_prefixes`` are added to ``target`` from
        the snapshot's own metadata (entries whose shapes the caller cannot know, e.g. this rank's
        comm-hook residuals). Returns ``target``."""
        reader = SnapshotReader(self.root, info.name)
        metadata = reader.read_metadata()
        for key, meta in metadata.state_dict_metadata.items():
            if any(key.startswith(p) for p in extra_prefixes):
                if isinstance(meta, TensorStorageMetadata):
                    target[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
                elif isinstance(meta, BytesStorageMetadata):
                    target[key] = None
        missing = _missing_keys(target, metadata)
        if missing:
            raise KeyError(
                f"snapshot {info.name} does not hold {len(missing)} entries this run needs "
                f"(e.g. {', '.join(sorted(missing)[:3])}); it was taken with layout {info.manifest.get('layout')}"
            )
        dcp.load(target, storage_reader=reader, process_group=self.group)
        return target


def _missing_keys(target: dict, metadata) -> set[str]:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(target)
    return set(flat) - set(metadata.state_dict_metadata)
