"""What the SDK snapshots and restores: a user's ``state`` dict as DCP saves it, and a local run's events.

``state`` maps names to modules, optimizers, anything with ``state_dict``/``load_state_dict`` (a scheduler, a
stateful data loader) or plain values. Modules and optimizers go through torch's own
``get_model_state_dict`` / ``get_optimizer_state_dict`` (and their ``set_`` inverses): DDP's ``module.``
prefix gone, FSDP2 and TP parameters left as sharded DTensors, optimizer state keyed by parameter name
(flattened), so a snapshot of N ranks loads on M (DCP reshards). Each rank's RNG streams are kept under a
key of its own (``sdk_rank<r>_``) and put back only on the same world size.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from workers.events import now_iso, unix_iso
from workers.training.checkpoint.state import capture_rng, pack_tensors, restore_rng, unpack_tensors

OPTIMIZER_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
"""Optimizer state keyed ``state.<fqn>.<name>``: it loads on another layout by parameter name."""


def rank_prefix(rank: int) -> str:
    return f"sdk_rank{rank}_"  # no dots: DCP's flattened names stay exactly these


def _model_of(optimizer: Optimizer, modules: list[nn.Module]) -> nn.Module | None:
    """The module among ``modules`` that holds every parameter ``optimizer`` steps (None: no such module;
    its plain ``state_dict`` is kept then)."""
    mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules:
        if mine <= {id(p) for p in module.parameters()}:
            return module
    return None


def gather(state: dict) -> dict:
    """``state`` as DCP saves it (the tensors are the live ones: a load writes straight into them)."""
    if not isinstance(state, dict):
        raise TypeError(
            f"state must be a dict of name -> module / optimizer / stateful / value, got {type(state).__name__}"
        )
    modules = [v for v in state.values() if isinstance(v, nn.Module)]
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, nn.Module):
            out[key] = get_model_state_dict(value)
        elif isinstance(value, Optimizer):
            model = _model_of(value, modules)
            out[key] = (
                get_optimizer_state_dict(model, value, options=OPTIMIZER_OPTIONS)
                if model is not None
                else value.state_dict()
            )
        elif callable(getattr(value, "state_dict", None)) and callable(
            getattr(value, "load_state_dict", None)
        ):
            out[key] = value.state_dict()
        else:
            out[key] = value
    return out


def scatter(state: dict, loaded: dict) -> None:
    """Put ``loaded`` (a :func:`gather` of ``state`` that a snapshot was loaded into) back into ``state``:
    modules and optimizers through torch's setters, stateful objects through ``load_state_dict``, plain
    values replaced in ``state``."""
    modules = [v for v in state.values() if isinstance(v, nn.Module)]
    for key, value in list(state.items()):
        if isinstance(value, nn.Module):
            set_model_state_dict(value, loaded[key])
        elif isinstance(value, Optimizer):
            model = _model_of(value, modules)
            if model is not None:
                set_optimizer_state_dict(model, value, loaded[key], options=OPTIMIZER_OPTIONS)
            else:
                value.load_state_dict(loaded[key])
        elif callable(getattr(value, "state_dict", None)) and callable(
            getattr(value, "load_state_dict", None)
        ):
            value.load_state_dict(loaded[key])
        else:
            state[key] = loaded[key]


def rank_entries(prefix: str, device: torch.device) -> dict[str, Any]:
    """This rank's own entries of a snapshot: its RNG streams (torch CPU and accelerator, Python, numpy)."""
    return pack_tensors({"rng": capture_rng(device)}, prefix)


def restore_rank_entries(loaded: dict, prefix: str, device: torch.device) -> None:
    if prefix + "skeleton" in loaded:
        restore_rng(unpack_tensors(loaded, prefix)["rng"], device)


class FilePublisher:
    """A local run's events: one JSON line each in ``path`` (the live event's shape, stream ``local``),
    stamped when submitted and written on ``calls``' thread (``workers.training.supervision.background``)."""

    def __init__(self, path: Path, calls):
        self.path = Path(path)
        self._file = self.path.open("a")
        self._calls = calls

    def submit(self, kind: str, values: dict, step: int | None = None) -> None:
        if self._file.closed:
            return
        doc = {"stream": "local", "time": now_iso(), "kind": kind, "step": step, "values": values}
        self._calls.call(self._write, doc)

    def submit_later(self, kind: str, step: int | None, build, *args) -> None:
        """:meth:`submit` of the values ``build(*args)`` makes on ``calls``' thread, stamped now."""
        if self._file.closed:
            return
        self._calls.call(self._write_built, kind, step, time.time(), build, args)

    def _write_built(self, kind: str, step: int | None, t: float, build, args: tuple) -> None:
        self._write(
            {"stream": "local", "time": unix_iso(t), "kind": kind, "step": step, "values": build(*args)}
        )

    def _write(self, doc: dict) -> None:
        if self._file.closed:
            return
        self._file.write(json.dumps(doc, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._calls.call(self._file.close)
