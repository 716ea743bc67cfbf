"""The in-memory snapshot tier (Gemini-style): the newest state of each rank kept in the node's RAM.

A rank killed by a crash loses its process, not the machine's memory: each rank copies its *local* training
state (its own shards, as the live layout holds them) every ``snapshot_memory_every`` steps into shared
memory (``/dev/shm``, tmpfs) that outlives the process, and a restarted rank on the same node and layout
reloads it with a memory copy instead of reading, decompressing and verifying a disk snapshot. Disk
snapshots stay the durable tier (a lost node, another layout, a restore); this one only shortens the
common case, a rank dying on a node that lives on.

Why our own and not DCP: DCP plans global saves (collectives, replicated tensors written once); this is a
per-rank memcpy with nothing to plan, and must work while a peer is dead. Layout per rank::

    /dev/shm/cann-train/<sha of the snapshot dir>/rank<r>/slot0.bin slot1.bin   tensors, back to back
                                                         slot0.json slot1.json  what a slot holds
                                                         current.json           {"slot", "step"}

Two slots alternate: a copy goes into the slot ``current.json`` does not name, then ``current.json`` is
replaced (atomic); a rank killed mid-copy leaves the previous slot intact and named.

The copy can run in the background (:meth:`MemorySnapshots.save_async`): the training loop hands over the
live tensors and goes on with the next step's forward and backward, which do not change parameters or
optimizer state; it waits (:meth:`MemorySnapshots.wait`) before the next ``optimizer.step()``. The copy is
``Tensor.copy_`` (the GIL released), so it overlaps the next step's compute instead of stalling it. A rank offers both
slots' steps; the group restores the newest step every rank holds (all-gather), and only when it is at
least as new as the newest disk snapshot.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

ROOT_ENV = "CANN_TRAIN_MEMORY_SNAPSHOT_ROOT"


def memory_root(snapshot_dir: str | Path) -> Path:
    """Where the in-memory snapshots of a snapshot directory live (``/dev/shm`` when the machine has it)."""
    base = os.environ.get(ROOT_ENV) or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    key = hashlib.sha256(str(Path(snapshot_dir).resolve()).encode()).hexdigest()[:16]
    return Path(base) / "cann-train" / key


def remove(snapshot_dir: str | Path) -> None:
    """Free the memory of a run's in-memory snapshots (the run is over)."""
    shutil.rmtree(memory_root(snapshot_dir), ignore_errors=True)


def flatten(state: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a.b": x}`` (keys of the nested state dict joined with dots)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class MemorySnapshots:
    """One rank's two slots of shared memory."""

    def __init__(self, snapshot_dir: str | Path, rank: int, layout: dict):
        self.dir = memory_root(snapshot_dir) / f"rank{rank}"
        self.layout = layout
        self._mapped: dict[int, torch.Tensor] = {}  # slot -> uint8 view of its file
        self._copying: threading.Thread | None = None
        self._error: BaseException | None = None

    # --------------------------------------------------------------------------------------------- saving

    def clear(self) -> None:
        self.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _current(self) -> dict | None:
        try:
            return json.loads((self.dir / "current.json").read_text())
        except (OSError, ValueError):
            return None

    def _slot(self, slot: int, nbytes: int) -> torch.Tensor:
        view = self._mapped.get(slot)
        if view is None or view.numel() != nbytes:
            self.dir.mkdir(parents=True, exist_ok=True)
            path = self.dir / f"slot{slot}.bin"
            with path.open("wb") as f:
                f.truncate(nbytes)
            view = torch.from_file(str(path), shared=True, size=max(nbytes, 1), dtype=torch.uint8)
            view.zero_()  # touch every page once now, not during a save
            self._mapped[slot] = view
        return view

    def save_async(self, step: int, state: dict) -> None:
        """Start :meth:`save` of the live ``state`` in a background thread (one at a time: waits for the
        previous one). Its tensors must not change until :meth:`wait` returns; everything else in ``state``
        (RNG streams, data position: objects replaced, not changed in place) is taken now."""
        self.wait()
        flat = flatten(state)
        frozen = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
        frozen.update(pickle.loads(pickle.dumps({k: v for k, v in flat.items() if k not in frozen})))

        def copy() -> None:
            try:
                self._save_flat(step, frozen)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the training thread by wait()
                self._error = exc

        self._copying = threading.Thread(target=copy, name="memory-snapshot", daemon=True)
        self._copying.start()

    def wait(self) -> float:
        """Block until the background copy (if any) is done; seconds waited. Raises what the copy raised."""
        if self._copying is None:
            return 0.0
        t0 = time.perf_counter()
        self._copying.join()
        self._copying = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("the in-memory snapshot copy failed") from error
        return time.perf_counter() - t0

    def save(self, step: int, state: dict) -> int:
        """Copy this rank's local state into the free slot and name it current. Returns bytes copied."""
        self.wait()
        return self._save_flat(step, flatten(state))

    def _save_flat(self, step: int, flat: dict[str, Any]) -> int:
        tensors = {k: _local(v).detach() for k, v in flat.items() if isinstance(v, torch.Tensor)}
        others = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
        entries, offset = [], 0
        for key, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            entries.append({"key": key, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                            "offset": offset, "nbytes": nbytes})  # fmt: skip
            offset += -(-nbytes // 64) * 64  # 64-byte aligned
        current = self._current()
        slot = 1 - current["slot"] if current else 0
        view = self._slot(slot, offset)
        for entry, t in zip(entries, tensors.values(), strict=True):
            dst = view[entry["offset"] : entry["offset"] + entry["nbytes"]]
            dst.view(t.dtype).view(t.shape).copy_(t.contiguous() if t.device.type == "cpu" else t)
        header = {
            "step": step,
            "layout": self.layout,
            "entries": entries,
            "others": pickle.dumps(others).hex(),
        }
        _replace(self.dir / f"slot{slot}.json", json.dumps(header))
        _replace(self.dir / "current.json", json.dumps({"slot": slot, "step": step}))
        return offset

    # -------------------------------------------------------------------------------------------- loading

    def steps(self) -> dict[int, int]:
        """``{step: slot}`` of the complete slots that fit this run's layout."""
        out = {}
        current = self._current()
        for slot in (0, 1):
            try:
                header = json.loads((self.dir / f"slot{slot}.json").read_text())
            except (OSError, ValueError):
                continue
            if header.get("layout") != self.layout:
                continue
            if current and current["slot"] != slot and header["step"] > current["step"]:
                continue  # a copy into this slot was cut: its header is older than its bytes
            out[header["step"]] = slot
        return out

    def load(self, step: int, target: dict, rank_prefix: str) -> dict:
        """Fill ``target`` (a state of the live tensors, nested) with slot ``step`` in place; this rank's
        own flat entries (``rank_prefix``...) are added. Returns ``target``."""
        slot = self.steps()[step]
        header = json.loads((self.dir / f"slot{slot}.json").read_text())
        path = self.dir / f"slot{slot}.bin"
        size = path.stat().st_size
        view = torch.from_file(str(path), shared=False, size=max(size, 1), dtype=torch.uint8)
        saved = {e["key"]: e for e in header["entries"]}
        others = pickle.loads(bytes.fromhex(header["others"]))

        def stored(key: str) -> torch.Tensor:
            e = saved[key]
            dtype = getattr(torch, e["dtype"])
            return view[e["offset"] : e["offset"] + e["nbytes"]].view(dtype).view(e["shape"])

        def fill(node: dict, prefix: str) -> None:
            for key, value in list(node.items()):
                name = f"{prefix}{key}"
                if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
                    fill(value, name + ".")
                elif isinstance(value, torch.Tensor):
                    _local(value).copy_(stored(name))
                elif name in others:
                    node[key] = others[name]
                else:
                    raise KeyError(f"the in-memory snapshot of step {step} has no {name}")

        fill(target, "")
        for key in saved:
            if key.startswith(rank_prefix):
                target[key] = stored(key).clone()
        for key, value in others.items():
            if key.startswith(rank_prefix):
                target[key] = value
        return target


def _replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
