"""The on-disk snapshot format, written and read through DCP's storage interfaces.

``torch.distributed.checkpoint`` plans a save (which rank writes which chunk of which tensor, replicated
tensors written once) and a load (which saved chunks overlap the chunks this rank holds now: resharding
N -> M ranks). Its plans go through a ``StorageWriter`` / ``StorageReader``; ours store each planned item
as one zstd frame (:mod:`.codec`) -- a full snapshot's frames byte-shuffled, a delta's XORed with the same
item of its base first -- so DCP keeps the planning and resharding, and the bytes on disk are our own.

Three kinds: ``full`` (the whole state), ``delta`` (the whole state XORed with a full snapshot's) and ``log``
(the gradients the optimizer consumed at each step since its base, plus the state that is not parameters or
optimizer state: :mod:`.gradlog` replays them on the base). A log's base is the snapshot just before it, full
or log: a chain back to a full one, and a log is usable only when its whole chain verifies.

A snapshot is a directory ``<root>/step-00000020/``::

    rank00000.bin  rank00001.bin ...   the frames each rank wrote (ranks with nothing to write have none)
    metadata.pkl                       DCP's ``Metadata``: tensor shapes/chunks + a FrameRef per item
    manifest.json                      {"body": {...}, "sha256": sha256 of the body}: step, kind,
                                       base, layout, sha256 and size of every file, bytes written

It is written under ``step-00000020.partial/``; every rank fsyncs its file, the coordinator (DCP's rank 0)
writes metadata and manifest, fsyncs them and the directory, then renames it into place (atomic on POSIX)
and fsyncs ``<root>``. Anything without a ``manifest.json`` that verifies is not a snapshot.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import (
    LoadPlan,
    LoadPlanner,
    Metadata,
    SavePlan,
    SavePlanner,
    StorageReader,
    StorageWriter,
)
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from workers.training.checkpoint import codec

FORMAT = "cann-train-snapshot/1"
KINDS = ("full", "delta", "log")
MANIFEST = "manifest.json"
METADATA = "metadata.pkl"
PARTIAL_SUFFIX = ".partial"
CORRUPT_SUFFIX = ".corrupt"
SUPERSEDED_SUFFIX = ".superseded"
"""A good snapshot newer than the one a restore went back to (kept, never listed or counted again)."""
NAME_RE = re.compile(r"^step-(\d{8,})$")
_FILE_DIGEST_KEY = "__file_digest__/"


def snapshot_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    m = NAME_RE.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class FrameRef:
    """Where one saved item lives: DCP's ``storage_data`` for it (pickled inside ``metadata.pkl``)."""

    file: str
    offset: int
    length: int
    """Compressed bytes in ``file``."""
    codec: str
    raw_nbytes: int
    dtype: str | None = None
    """``torch.float32`` etc. for tensors; ``None`` for pickled objects."""
    shape: tuple[int, ...] | None = None
    base: str | None = None
    """A delta frame: the snapshot whose frame of the same item it was XORed with."""


@dataclass(frozen=True)
class FileDigest:
    file: str
    nbytes: int
    sha256: str


class CorruptSnapshot(Exception):
    """A snapshot that must not be loaded; ``str()`` says why (missing manifest, checksum mismatch...).
    ``broken_at``/``cause``: where a chain of bases breaks and why (set when the damage is in a base)."""

    def __init__(self, message: str, *, broken_at: str | None = None, cause: str | None = None):
        super().__init__(message)
        self.broken_at, self.cause = broken_at, cause


def _item_key(index: MetadataIndex) -> tuple:
    return (index.fqn, tuple(index.offset) if index.offset is not None else None)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptSnapshot(f"unknown dtype {name!r}")
    return dtype


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of a CPU tensor as a uint8 array sharing its memory (contiguous tensors only)."""
    return t.reshape(-1).view(torch.uint8).numpy()


class _HashingWriter:
    """A binary file that counts and sha256-hashes what is written to it."""

    def __init__(self, f):
        self.f, self.count, self._sha = f, 0, hashlib.sha256()

    def write(self, data) -> None:
        self.f.write(data)
        self._sha.update(data)
        self.count += len(data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path, block: int = 8 << 20) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            sha.update(chunk)
    return sha.hexdigest()


def canonical_sha256(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------- writer


@dataclass
class DeltaBase:
    """The snapshot a delta is taken against, as the writer of this process holds it: its name, its
    manifest's sha256 (known to the coordinator) and, per item this rank wrote, the raw bytes."""

    name: str
    manifest_sha256: str | None
    items: dict[tuple, np.ndarray]


@dataclass(frozen=True)
class LogBase:
    """The snapshot a log continues (the one just before it): its name and manifest sha256 (known to the
    coordinator, which writes the manifest), and the optimizer steps the log holds (``base step + 1`` to
    the log's step)."""

    name: str
    manifest_sha256: str | None
    steps: tuple[int, ...]


class SnapshotWriter(StorageWriter):
    """Writes one snapshot (see the module docstring). ``base`` given: tensor items this rank also wrote
    into the base (same tensor, same chunk, same size) become delta frames, the others full frames.
    ``record_items``: a dict to fill with the raw bytes of every tensor item written (the next delta's
    base; the arrays alias the staged tensors, which the caller keeps alive). ``log`` given: the snapshot
    is a log (every frame full; the manifest names its base and the steps it holds)."""

    def __init__(
        self,
        root: str | Path,
        name: str,
        *,
        step: int,
        base: DeltaBase | None = None,
        record_items: dict | None = None,
        log: LogBase | None = None,
        layout: dict | None = None,
        info: dict | None = None,
        zstd_level: int = 1,
        retention: int | None = None,
    ):
        super().__init__()
        self.root, self.name, self.step = Path(root), name, step
        self.base, self.record_items = base, record_items
        if log is not None and base is not None:
            raise ValueError("a snapshot is a delta or a log, not both")
        self.log = log
        self.layout, self.info = layout or {}, info or {}
        self.zstd_level = zstd_level
        self.retention = retention
        self.is_coordinator = False
        self.manifest: dict | None = None
        """The published manifest (coordinator only, after ``finish``)."""
        self.manifest_sha256: str | None = None
        self.removed: list[str] = []
        """Snapshots the retention policy deleted after this one was published (coordinator only)."""

    @property
    def partial_dir(self) -> Path:
        return self.root / (self.name + PARTIAL_SUFFIX)

    def reset(self, checkpoint_id=None) -> None:
        return None

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(p, storage_data=f"rank{i:05d}.bin") for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> torch.futures.Future:
        results: list[WriteResult] = []
        fut: torch.futures.Future = torch.futures.Future()
        if not plan.items:
            fut.set_result(results)
            return fut
        file = plan.storage_data
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        encoder = codec.FrameEncoder(self.zstd_level)
        with open(self.partial_dir / file, "wb") as f:
            out = _HashingWriter(f)
            for item in plan.items:
                data = planner.resolve_data(item)
                offset = out.count
                if item.type == WriteItemType.BYTE_IO:
                    blob = data.getvalue()
                    out.write(encoder.encode_bytes(blob))
                    ref = FrameRef(file, offset, out.count - offset, codec.BYTES, len(blob))
                else:
                    tensor = data.detach()
                    if tensor.device.type != "cpu":
                        tensor = tensor.cpu()
                    tensor = tensor.contiguous()
                    raw = tensor_bytes(tensor)
                    key = _item_key(item.index)
                    base_raw = self.base.items.get(key) if self.base is not None else None
                    if base_raw is not None and base_raw.size != raw.size:
                        base_raw = None
                    for piece in encoder.encode(raw, tensor.element_size(), base_raw):
                        out.write(piece)
                    ref = FrameRef(
                        file,
                        offset,
                        out.count - offset,
                        codec.DELTA if base_raw is not None else codec.FULL,
                        raw.size,
                        str(tensor.dtype),
                        tuple(tensor.shape),
                        self.base.name if base_raw is not None else None,
                    )
                    if self.record_items is not None:
                        self.record_items[key] = raw
                results.append(WriteResult(index=item.index, size_in_bytes=ref.length, storage_data=ref))
            f.flush()
            os.fsync(f.fileno())
        digest = FileDigest(file, out.count, out.hexdigest())
        results.append(
            WriteResult(index=MetadataIndex(_FILE_DIGEST_KEY + file), size_in_bytes=0, storage_data=digest)
        )
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        frames: dict[MetadataIndex, FrameRef] = {}
        files: dict[str, dict] = {}
        for rank_results in results:
            for r in rank_results:
                if isinstance(r.storage_data, FileDigest):
                    d = r.storage_data
                    files[d.file] = {"bytes": d.nbytes, "sha256": d.sha256}
                else:
                    frames[r.index] = r.storage_data
        metadata.storage_data = frames
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        blob = pickle.dumps(metadata)
        _write_durably(self.partial_dir / METADATA, blob)
        files[METADATA] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        refs = list(frames.values())
        if self.log is not None:
            kind, base = "log", {"name": self.log.name, "manifest_sha256": self.log.manifest_sha256}
        elif self.base is not None and any(f.base for f in refs):
            kind, base = "delta", {"name": self.base.name, "manifest_sha256": self.base.manifest_sha256}
        else:
            kind, base = "full", None
        body = {
            "format": FORMAT,
            "name": self.name,
            "step": self.step,
            "kind": kind,
            "base": base,
            "files": files,
            "bytes_written": sum(f["bytes"] for f in files.values()),
            "raw_bytes": sum(f.raw_nbytes for f in refs),
            "frames": {c: sum(1 for f in refs if f.codec == c) for c in codec.CODECS},
            "layout": self.layout,
            "info": self.info,
            "created_unix": round(time.time(), 3),
        }
        if self.log is not None:
            body["log_steps"] = list(self.log.steps)
        manifest = {"body": body, "sha256": canonical_sha256(body)}
        _write_durably(self.partial_dir / MANIFEST, json.dumps(manifest, indent=1).encode())
        _fsync_dir(self.partial_dir)
        publish(self.root, self.name)
        self.manifest, self.manifest_sha256 = body, manifest["sha256"]
        if self.retention:
            self.removed = apply_retention(self.root, self.retention)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False  # chosen explicitly, never inferred from a path


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def publish(root: Path, name: str) -> None:
    """Rename ``name.partial`` to ``name`` (replacing an older snapshot of that name) and fsync ``root``."""
    final = root / name
    if final.exists():  # e.g. a resumed run passing the step again: the new one replaces it
        trash = root / f"{name}.replaced-{os.getpid()}-{time.monotonic_ns()}{PARTIAL_SUFFIX}"
        os.rename(final, trash)
        os.rename(root / (name + PARTIAL_SUFFIX), final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(root / (name + PARTIAL_SUFFIX), final)
    _fsync_dir(root)


# ------------------------------------------------------------------------------------ listing, checking


@dataclass(frozen=True)
class SnapshotInfo:
    name: str
    step: int
    kind: str
    base: str | None
    manifest: dict
    """The manifest's body."""
    manifest_sha256: str


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


def list_snapshots(root: str | Path) -> list[str]:
    """Names of the published snapshots under ``root``, newest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    names = [p.name for p in root.iterdir() if p.is_dir() and step_of(p.name) is not None]
    return sorted(names, key=lambda n: step_of(n), reverse=True)


def read_manifest(root: str | Path, name: str) -> SnapshotInfo:
    """The manifest of ``name``, its self-checksum checked (not the files: see :func:`verify`)."""
    path = Path(root) / name / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CorruptSnapshot("no manifest.json (an incomplete write)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptSnapshot(f"manifest.json unreadable ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("body"), dict):
        raise CorruptSnapshot("manifest.json has no body")
    body = doc["body"]
    if canonical_sha256(body) != doc.get("sha256"):
        raise CorruptSnapshot("manifest.json checksum mismatch")
    if body.get("format") != FORMAT:
        raise CorruptSnapshot(f"format {body.get('format')!r}, this reader knows {FORMAT!r}")
    if body.get("name") != name or body.get("step") != step_of(name):
        raise CorruptSnapshot(f"manifest names {body.get('name')!r} step {body.get('step')!r}")
    if body.get("kind") not in KINDS:
        raise CorruptSnapshot(f"kind {body.get('kind')!r}, this reader knows {', '.join(KINDS)}")
    base = body.get("base")
    if body["kind"] != "full" and not base:
        raise CorruptSnapshot(f"a {body['kind']} snapshot without a base")
    return SnapshotInfo(name, body["step"], body["kind"], base["name"] if base else None, body, doc["sha256"])


def verify(root: str | Path, name: str, _checked: dict | None = None) -> SnapshotInfo:
    """Check ``name`` end to end: manifest checksum, every file's size and sha256, and for a delta or a log
    its base (verified the same way -- for a log, its whole chain back to a full snapshot -- and the very
    manifest it was written against; a log must hold exactly the steps after its base's). Raises
    :class:`CorruptSnapshot` saying what is wrong (where a chain breaks: ``broken_at``, ``cause``)."""
    checked = {} if _checked is None else _checked
    if name in checked:
        result = checked[name]
        if isinstance(result, CorruptSnapshot):
            raise result
        return result
    try:
        info = read_manifest(root, name)
        for file, meta in info.manifest["files"].items():
            path = Path(root) / name / file
            if not path.is_file():
                raise CorruptSnapshot(f"{file} is missing")
            size = path.stat().st_size
            if size != meta["bytes"]:
                raise CorruptSnapshot(f"{file} has {size} bytes, the manifest says {meta['bytes']}")
            if sha256_file(path) != meta["sha256"]:
                raise CorruptSnapshot(f"{file}: sha256 mismatch")
        if info.base is not None:
            base_step = step_of(info.base)
            if base_step is None or base_step >= info.step:
                raise CorruptSnapshot(f"its base {info.base!r} is not an older snapshot")
            try:
                base = verify(root, info.base, checked)
            except CorruptSnapshot as exc:
                at, cause = exc.broken_at or info.base, exc.cause or str(exc)
                where = "" if at == info.base else f"its chain breaks at {at}: "
                raise CorruptSnapshot(
                    f"its base {info.base} is unusable: {where}{cause}", broken_at=at, cause=cause
                ) from None
            if base.manifest_sha256 != info.manifest["base"]["manifest_sha256"]:
                raise CorruptSnapshot(f"its base {info.base} was replaced after the {info.kind} was written")
            if info.kind == "log":
                if base.kind not in ("full", "log"):
                    raise CorruptSnapshot(f"a log's base must be full or a log, {info.base} is a {base.kind}")
                expected = list(range(base.step + 1, info.step + 1))
                if info.manifest.get("log_steps") != expected:
                    raise CorruptSnapshot(
                        f"it logs steps {info.manifest.get('log_steps')}, its base {info.base} is at step "
                        f"{base.step}: steps {expected} are needed"
                    )
    except CorruptSnapshot as exc:
        checked[name] = exc
        raise
    checked[name] = info
    return info


def find_latest_good(root: str | Path) -> tuple[SnapshotInfo | None, list[Skipped]]:
    """The newest snapshot under ``root`` that verifies, and the newer ones skipped with the reason."""
    skipped: list[Skipped] = []
    checked: dict = {}
    for name in list_snapshots(root):
        try:
            return verify(root, name, checked), skipped
        except CorruptSnapshot as exc:
            skipped.append(Skipped(name, str(exc)))
    return None, skipped


def find_exactly(root: str | Path, name: str) -> tuple[SnapshotInfo, list[str]]:
    """Snapshot ``name`` verified (a restore to a chosen snapshot) and the names of the newer ones, which a
    run continuing from it must set aside (:func:`quarantine` with ``SUPERSEDED_SUFFIX``). Raises
    :class:`CorruptSnapshot` when it is not there or does not verify (a restore never silently falls back
    to another step)."""
    names = list_snapshots(root)
    if name not in names:
        known = ", ".join(names) or "none"
        raise CorruptSnapshot(f"there is no snapshot {name} (published ones: {known})")
    info = verify(root, name)
    return info, [n for n in names if step_of(n) > info.step]


def quarantine(root: str | Path, name: str, suffix: str = CORRUPT_SUFFIX) -> str:
    """Rename an unusable snapshot to ``<name>.corrupt`` (kept for inspection, never listed, never counted by
    retention: a newer corrupt snapshot must not push the good ones out), or with ``suffix`` for another
    reason to set it aside. Returns the new name."""
    root = Path(root)
    new = f"{name}{suffix}"
    n = 1
    while (root / new).exists():
        n += 1
        new = f"{name}{suffix}.{n}"
    os.rename(root / name, root / new)
    return new


def chain(root: str | Path, info: SnapshotInfo) -> list[SnapshotInfo]:
    """The snapshots a log is rebuilt from, in order: its first base that is not a log (the full snapshot),
    then every log up to ``info``. ``[info]`` for a full snapshot or a delta. Reads manifests only: call
    :func:`verify` first."""
    links = [info]
    while links[0].kind == "log":
        base = read_manifest(root, links[0].base)
        if base.step >= links[0].step:
            raise CorruptSnapshot(f"{links[0].name}'s base {base.name} is not older than it")
        links.insert(0, base)
    return links


def apply_retention(root: str | Path, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` snapshots, keeping every snapshot a kept one is rebuilt from (a
    delta's base; a log's whole chain back to its full snapshot); unreadable snapshots older than the newest
    kept one go too. Returns the names removed."""
    root = Path(root)
    names = list_snapshots(root)
    kept = set(names[:keep])
    for name in names[:keep]:
        seen: set[str] = set()
        while name and name not in seen:  # a manifest naming itself (or a loop) must not hang retention
            seen.add(name)
            try:
                name = read_manifest(root, name).base
            except CorruptSnapshot:
                break
            if name:
                kept.add(name)
    removed = []
    for name in names[keep:]:
        if name not in kept:
            shutil.rmtree(root / name, ignore_errors=True)
            removed.append(name)
    return removed


def clean_partial(root: str | Path) -> list[str]:
    """Remove leftovers of interrupted writes (``*.partial``); call before this job's first save."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for p in root.iterdir():
        if p.is_dir() and p.name.endswith(PARTIAL_SUFFIX):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return removed


# ----------------------------------------------------------------------------------------------- reader


class SnapshotReader(StorageReader):
    """Reads a snapshot written by :class:`SnapshotWriter` (a delta's frames with its base's). DCP's load
    planner decides which saved chunk each of this rank's tensors needs, so a snapshot of N ranks loads on
    M. Checksums are :func:`verify`'s job, before loading."""

    def __init__(self, root: str | Path, name: str):
        super().__init__()
        self.root, self.name = Path(root), name
        self.metadata: Metadata | None = None
        self._base: SnapshotReader | None = None
        self._files: dict[str, Any] = {}
        self._last: tuple[tuple, np.ndarray] | None = None

    def reset(self, checkpoint_id=None) -> None:
        return None

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if self.metadata is None:
            with open(self.root / self.name / METADATA, "rb") as f:
                self.metadata = pickle.load(f)
        return self.metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args, **kwargs) -> None:
        self.metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _frame(self, ref: FrameRef) -> bytes:
        f = self._files.get(ref.file)
        if f is None:
            f = self._files[ref.file] = open(self.root / self.name / ref.file, "rb")
        f.seek(ref.offset)
        data = f.read(ref.length)
        if len(data) != ref.length:
            raise CorruptSnapshot(f"{self.name}/{ref.file} is truncated")
        return data

    def raw(self, index: MetadataIndex) -> tuple[FrameRef, np.ndarray]:
        """The saved bytes of one item (decoded, a delta applied to its base); the last one is cached."""
        key = _item_key(index)
        ref: FrameRef = self.read_metadata().storage_data[index]
        if self._last is not None and self._last[0] == key:
            return ref, self._last[1]
        width = _dtype(ref.dtype).itemsize if ref.dtype else 1
        base = None
        if ref.codec == codec.DELTA:
            if self._base is None or self._base.name != ref.base:
                self.close_files()
                self._base = SnapshotReader(self.root, ref.base)
            _, base = self._base.raw(index)
        data = codec.decode(self._frame(ref), ref.raw_nbytes, width, ref.codec, base)
        self._last = (key, data)
        return ref, data

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future:
        storage = self.read_metadata().storage_data
        items = sorted(
            plan.items, key=lambda r: (storage[r.storage_index].file, storage[r.storage_index].offset)
        )
        try:
            for req in items:
                ref, data = self.raw(req.storage_index)
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(data.tobytes()))
                    continue
                saved = torch.from_numpy(data).view(_dtype(ref.dtype)).reshape(ref.shape)
                for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                    saved = saved.narrow(dim, start, length)
                target = planner.resolve_tensor(req).detach()
                if target.size() != saved.size():
                    raise CorruptSnapshot(f"{req.storage_index.fqn}: saved {saved.size()} vs {target.size()}")
                target.copy_(saved)
                planner.commit_tensor(req, target)
        finally:
            self.close_files()
            self._last = None
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)
        return fut

    def close_files(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._base is not None:
            self._base.close_files()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False


def iter_frames(root: str | Path, name: str) -> Iterator[tuple[MetadataIndex, FrameRef]]:
    """Every saved item of a snapshot with its frame (the bench and tests count bytes per kind)."""
    reader = SnapshotReader(root, name)
    yield from reader.read_metadata().storage_data.items()
