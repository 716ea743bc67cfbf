"""Log snapshots: the optimizer's inputs since the previous snapshot, replayed on it to rebuild the state.

An AdamW step changes nearly every bit of the weights and both moments, so no lossless encoding of the
state itself gets much below a full snapshot (XOR deltas measured 1.13x, docs/elastic.md). What is new at
each step is the gradient the optimizer consumed: one tensor per parameter, against three of state. A log
snapshot at step ``s`` holds, for every optimizer step ``t`` since its base (the snapshot just before it):

- ``grads.<t:08d>/<fqn>``: the gradient exactly as ``optimizer.step()`` consumed it (after clipping), in the
  layout the rank holds it (DTensor shards for FSDP2/TP, plain tensors for DDP: DCP writes replicas once);
- ``grad_meta.<fqn>``: per step, whether the parameter had a gradient (``None`` ones are skipped by the
  optimizer, and must be on replay) and its param group's hyper-parameters (``lr``, ``weight_decay``,
  ``betas``...: what a schedule may change between steps);

plus everything else the trainer snapshots that is not a parameter or optimizer state (step, data position,
RNG streams, comm-hook residuals, model buffers such as MoE balancing biases), in full. :func:`replay` loads
one step's gradients into the parameters' ``.grad`` of the current layout (DCP reshards them like any
tensor), sets the logged hyper-parameters and calls the same ``optimizer.step()``: the same kernel on the
same inputs gives the same bits.

:class:`GradientLog` keeps the copies a rank makes between two snapshots (the only training-thread cost:
one copy of the gradients per step, into reused CPU buffers); the manager hands them to the background
writer as they are, without staging them again.
"""

from __future__ import annotations

import pickle
import time
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from workers.training.checkpoint.storage import CorruptSnapshot, SnapshotInfo, SnapshotReader

if TYPE_CHECKING:
    from workers.training.checkpoint.manager import SnapshotManager

GRADS = "grads"
GRAD_META = "grad_meta"


def grad_key(step: int, key: str) -> str:
    """The name of one step's gradient of parameter ``key`` inside ``state[GRADS]``."""
    return f"{step:08d}/{key}"


def group_hyper(group: dict) -> dict[str, Any]:
    """The hyper-parameters of an optimizer param group that a schedule may change between steps: its
    numbers and tuples of numbers (``lr``, ``weight_decay``, ``betas``, ``eps``, ``momentum``...). Flags
    (``fused``, ``foreach``, ``maximize``...) are left out: they are how this layout runs the step, and a
    replay on another layout may run it differently."""

    def number(v) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    return {
        k: v
        for k, v in group.items()
        if k != "params" and (number(v) or (isinstance(v, tuple) and v and all(number(x) for x in v)))
    }


class GradientLog:
    """The gradients one rank recorded since the previous snapshot: per step, a CPU copy of each
    parameter's gradient and what :func:`replay` needs besides (see the module docstring). Buffer sets are
    reused once a write that held them is done (``release``)."""

    def __init__(self) -> None:
        self._steps: list[tuple[int, dict[str, torch.Tensor], dict[str, dict]]] = []
        self._free: list[dict[str, torch.Tensor]] = []
        self.record_s = 0.0
        """Training-thread seconds of the copies recorded since the last ``take``/``discard``."""

    @property
    def steps(self) -> list[int]:
        return [step for step, _, _ in self._steps]

    def prepare(self, like: dict[str, torch.Tensor], sets: int = 2) -> None:
        """Allocate and touch ``sets`` buffer sets for gradients shaped like ``like`` (the parameters) now,
        at start-up, rather than in the first steps (a copy into fresh pages runs ~4x slower)."""
        while len(self._free) < sets:
            buffers = {key: _cpu_like(t) for key, t in like.items()}
            for t in buffers.values():
                _local(t).zero_()
            self._free.append(buffers)

    def record(self, step: int, grads: dict[str, torch.Tensor], meta: dict[str, dict]) -> float:
        """Copy ``grads`` (``{key: p.grad}`` of the parameters that have one) of optimizer step ``step``;
        ``meta``: ``{key: {"grad": bool, "hyper": {...}}}`` for every parameter of this rank. Seconds taken."""
        t0 = time.perf_counter()
        copy = None
        while self._free and copy is None:
            buffers = self._free.pop()
            if _fits(grads, buffers):  # else another set of parameters had a gradient: drop that set
                copy = buffers
        if copy is None:
            copy = {key: _cpu_like(g) for key, g in grads.items()}
        with torch.no_grad():
            for key, g in grads.items():
                _local(copy[key]).copy_(_local(g))
        self._steps.append((step, copy, meta))
        seconds = time.perf_counter() - t0
        self.record_s += seconds
        return seconds

    def take(self) -> tuple[dict, list[dict], float]:
        """The log's part of a snapshot state (``{GRADS: ..., GRAD_META: ...}``), the buffer sets it holds
        (give them back with ``release`` once written) and the seconds the copies took; the log starts over."""
        grads = {grad_key(step, key): t for step, copy, _ in self._steps for key, t in copy.items()}
        keys = {key for _, _, meta in self._steps for key in meta}
        meta = {key: pickle.dumps({step: m[key] for step, _, m in self._steps if key in m}) for key in keys}
        held = [copy for _, copy, _ in self._steps]
        seconds = self.record_s
        self._steps, self.record_s = [], 0.0
        return {GRADS: grads, GRAD_META: meta}, held, seconds

    def release(self, held: list[dict]) -> None:
        self._free.extend(held)

    def discard(self) -> float:
        """Drop what was recorded (the next snapshot is a full one); the seconds it had cost."""
        _, held, seconds = self.take()
        self.release(held)
        return seconds

    def clear(self) -> None:
        self._steps, self._free, self.record_s = [], [], 0.0


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _cpu_like(g: torch.Tensor) -> torch.Tensor:
    """An empty CPU tensor for a copy of ``g`` (pinned beside an accelerator); for a DTensor gradient, its
    local shard's size wrapped in a DTensor of the same mesh and placements, so that DCP writes the shard
    where it belongs. Not ``_create_cpu_state_dict``: FSDP2's sharded gradients are views into its
    reduce-scatter buffers, which that function's deepcopy refuses."""
    local = _local(g)
    cpu = torch.empty(local.shape, dtype=local.dtype, pin_memory=torch.cuda.is_available())
    if not isinstance(g, DTensor):
        return cpu
    return DTensor.from_local(
        cpu, g.device_mesh, g.placements, run_check=False, shape=g.shape, stride=g.stride()
    )


def _fits(grads: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> bool:
    if grads.keys() != buffers.keys():
        return False
    for key, g in grads.items():
        b = buffers[key]
        if isinstance(g, DTensor) != isinstance(b, DTensor) or _local(g).shape != _local(b).shape:
            return False
        if _local(g).dtype != _local(b).dtype:
            return False
        if isinstance(g, DTensor) and (g.placements != b.placements or g.device_mesh != b.device_mesh):
            return False
    return True


def replay(
    manager: SnapshotManager,
    info: SnapshotInfo,
    params: list[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
) -> int:
    """Apply log snapshot ``info`` to ``params`` (``(key, parameter)`` of this rank, keys as logged) and
    ``optimizer``, which must hold the state of the log's base: for each logged step, load the gradients
    into ``.grad`` (``None`` where the step had none), set each param group's logged hyper-parameters and run
    ``optimizer.step()``. Collective over the manager's group (every rank calls it for the same log).
    Returns the steps replayed."""
    steps = info.manifest.get("log_steps")
    if info.kind != "log" or not isinstance(steps, list):
        raise ValueError(f"{info.name} is a {info.kind} snapshot, not a log")
    saved = SnapshotReader(manager.root, info.name).read_metadata().state_dict_metadata
    target: dict = {GRAD_META: {key: None for key, _ in params}}
    manager.load(info, target)
    meta = {key: pickle.loads(blob) for key, blob in target[GRAD_META].items()}
    group_of = {id(p): i for i, group in enumerate(optimizer.param_groups) for p in group["params"]}
    for step in steps:
        grads: dict[str, torch.Tensor] = {}
        for key, p in params:
            logged = meta[key].get(step)
            if logged is None:
                raise CorruptSnapshot(f"{info.name} logs nothing for {key} at step {step}")
            if logged["grad"]:
                entry = saved.get(f"{GRADS}.{grad_key(step, key)}")
                if entry is None:
                    raise CorruptSnapshot(f"{info.name} has no gradient of {key} at step {step}")
                grads[grad_key(step, key)] = torch.empty_like(p, dtype=entry.properties.dtype)
        manager.load(info, {GRADS: grads})  # every rank loads once per step, with or without gradients
        hyper: dict[int, dict] = {}
        for key, p in params:
            p.grad = grads.get(grad_key(step, key))
            group = group_of[id(p)]
            logged = meta[key][step]["hyper"]
            if hyper.setdefault(group, logged) != logged:
                raise CorruptSnapshot(
                    f"{info.name}: parameters of one param group logged different hyper-parameters at step "
                    f"{step} ({hyper[group]} vs {logged} for {key})"
                )
        for i, values in hyper.items():
            group = optimizer.param_groups[i]
            group.update({k: v for k, v in values.items() if k in group})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return len(steps)
