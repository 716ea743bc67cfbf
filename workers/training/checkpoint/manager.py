"""The snapshot engine a training loop talks to: :class:`SnapshotManager`.

``save(step, state)`` stages the state into CPU buffers (the only part the training loop waits for) and
hands it to ``torch.distributed.checkpoint.async_save``, whose background thread plans the write over the
manager's own gloo process group and writes it with :class:`~.storage.SnapshotWriter`. Every
``full_every``-th snapshot is a full one; in between, deltas against the last full one (its staged CPU
buffers are kept as the base, so a delta never reads the disk). Two buffer sets alternate: the base, and
the one being staged into; after warm-up nothing is allocated per snapshot.

``restore(target, ...)`` finds the newest snapshot that verifies (rank 0 checks, then tells the others),
and loads it into ``target`` through :class:`~.storage.SnapshotReader` -- DCP reshards when the layout
changed.
"""

from __future__ import annotations

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
from workers.training.checkpoint.storage import (
    CorruptSnapshot,
    DeltaBase,
    Skipped,
    SnapshotInfo,
    SnapshotReader,
    SnapshotWriter,
    snapshot_name,
)


@dataclass
class SnapshotRecord:
    """One snapshot as this process saw it. ``bytes_written``/``raw_bytes`` are the whole snapshot's (all
    ranks), known on the coordinator (rank 0) once the write finished."""

    name: str
    step: int
    kind: str
    """``full`` or ``delta`` (as planned; the manifest says ``full`` if no item found its base)."""
    stall_s: float
    """Training-thread time: waiting for the previous write (``wait_s``) + building the state dict + staging."""
    wait_s: float = 0.0
    base: str | None = None
    write_s: float | None = None
    """Background time from hand-over to published (planning, encoding, fsync, rename, retention)."""
    bytes_written: int | None = None
    raw_bytes: int | None = None
    error: str | None = None
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


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


class SnapshotManager:
    """Asynchronous, incremental, verified snapshots of one rank's training state under ``root``.

    Every rank of the job makes one with the same arguments and calls ``save`` at the same steps (the
    writes are collective over ``process_group``: give it a group of its own, e.g.
    ``dist.new_group(backend="gloo")``, so snapshot traffic never queues behind training collectives).
    ``fresh``: this run starts from scratch, so ``root`` must hold no snapshots (of another run, whose
    newer steps retention would keep in place of this run's).
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
    ):
        if full_every < 1 or keep < 1:
            raise ValueError(f"full_every and keep must be >= 1, got {full_every}, {keep}")
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
        self._pending: tuple[Future, SnapshotRecord, SnapshotWriter, dict, float] | None = None
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

    def prepare(self, state_dict: dict) -> float:
        """Allocate and touch both CPU buffer sets now (start-up time) instead of at the first two
        snapshots (a first copy into fresh memory runs ~4x slower than into touched pages). Seconds taken."""
        t0 = time.perf_counter()
        while len(self._free) < (2 if self.full_every > 1 else 1):
            buffers = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            self._free.append(_copy_state_dict(state_dict, buffers))
        return time.perf_counter() - t0

    def next_kind(self) -> str:
        return "full" if self._base is None or self._count % self.full_every == 0 else "delta"

    def save(
        self, step: int, state_dict: dict | Callable[[], dict], *, info: dict | None = None
    ) -> SnapshotRecord:
        """Snapshot ``state_dict`` (or what the callable returns, timed as part of the stall) at ``step``.
        Returns once the state is staged; the write goes on in the background."""
        t0 = time.perf_counter()
        self._finish_pending()
        waited = time.perf_counter() - t0
        state = state_dict() if callable(state_dict) else state_dict
        kind = self.next_kind()
        name = snapshot_name(step)
        base = None
        if kind == "delta":
            assert self._base is not None
            base = DeltaBase(self._base.name, self._base.manifest_sha256, self._base.items)
        record_items: dict | None = {} if kind == "full" else None
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
            stall_s=time.perf_counter() - t0,
            wait_s=waited,
            base=base.name if base else None,
        )
        self.records.append(record)
        self._pending = (future, record, writer, staged, time.perf_counter())
        self._count += 1
        return record

    @property
    def in_flight(self) -> bool:
        """A background write has not finished (a process exiting now would wait for its thread)."""
        return self._pending is not None and not self._pending[0].done()

    def poll(self) -> SnapshotRecord | None:
        """Complete the bookkeeping of a finished background write, if there is one (never blocks)."""
        if self._pending is not None and self._pending[0].done():
            return self._finish_pending()
        return None

    def _finish_pending(self) -> SnapshotRecord | None:
        if self._pending is None:
            return None
        future, record, writer, staged, handed_over = self._pending
        self._pending = None
        try:
            future.result()
        except (Exception, CheckpointException) as exc:  # a failed snapshot must not stop training
            record.error = f"{type(exc).__name__}: {exc}"[:2000]
            self._free.append(staged)
            if record.kind == "full":
                self._count = 0
            self.log(f"snapshot {record.name} failed: {record.error}")
            return record
        record.write_s = time.perf_counter() - handed_over
        if writer.manifest is not None:
            record.bytes_written = writer.manifest["bytes_written"]
            record.raw_bytes = writer.manifest["raw_bytes"]
            record.removed = writer.removed
        if record.kind == "full":
            if self._base is not None:
                self._free.append(self._base.buffers)
            self._base = _Base(record.name, writer.manifest_sha256, staged, writer.record_items or {})
        else:
            self._free.append(staged)
        if self.rank == 0:
            self.log(self.describe(record))
        return record

    @staticmethod
    def describe(r: SnapshotRecord) -> str:
        size = f"{r.bytes_written / 1e6:.2f} MB" if r.bytes_written is not None else "?"
        ratio = f" ({r.raw_bytes / r.bytes_written:.2f}x)" if r.bytes_written and r.raw_bytes else ""
        base = f" against {r.base}" if r.base else ""
        return (
            f"snapshot {r.name}: {r.kind}{base}, {size}{ratio}, training stalled {r.stall_s * 1000:.1f} ms, "
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
        self._base = None
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
