"""Pieces of a training state that DCP does not know how to hold by itself.

- :func:`capture_rng` / :func:`restore_rng`: every random-number stream of a process.
- :func:`pack_tensors` / :func:`unpack_tensors`: an arbitrary object holding tensors (a comm hook's state:
  error-feedback residuals, momentum, PowerSGD's P/Q memories) as flat ``{key: tensor}`` entries DCP can
  save and reshape-check, plus a pickled skeleton for the rest.
- :class:`ModelView`: several pipeline stages of one rank seen as one module with the unsplit model's
  parameter names, for ``get_state_dict``/``set_state_dict``.
- :func:`suffix_keys`: gives the chunks of a tensor that differ per rank but that DCP would see as
  replicas (expert-parallel weights are plain local tensors) a per-rank name.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import torch
from torch import nn

_TENSOR = "__snapshot_tensor__"


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """torch (CPU and the accelerator of ``device``), Python ``random`` and numpy's global streams."""
    state: dict[str, Any] = {
        "torch_cpu": torch.get_rng_state(),
        "python": pickle.dumps(random.getstate()),
        "numpy": pickle.dumps(np.random.get_state()),
    }
    if device is not None and device.type != "cpu":
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "get_rng_state"):
            state["accelerator"] = module.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    torch.set_rng_state(state["torch_cpu"])
    random.setstate(pickle.loads(state["python"]))
    np.random.set_state(pickle.loads(state["numpy"]))
    if "accelerator" in state and device is not None and device.type != "cpu":
        getattr(torch, device.type).set_rng_state(state["accelerator"], device)


def pack_tensors(obj: Any, prefix: str) -> dict[str, Any]:
    """``{prefix + "skeleton": pickled obj with tensors replaced, prefix + "t<i>": tensor_i}``. Keys hold
    no dots: DCP's flattened names stay exactly these."""
    tensors: list[torch.Tensor] = []

    def strip(x):
        if isinstance(x, torch.Tensor):
            tensors.append(x.detach())
            return (_TENSOR, len(tensors) - 1)
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(strip(v) for v in x)
        return x

    skeleton = strip(obj)
    out: dict[str, Any] = {prefix + "skeleton": pickle.dumps(skeleton)}
    out.update({f"{prefix}t{i}": t for i, t in enumerate(tensors)})
    return out


def unpack_tensors(entries: dict[str, Any], prefix: str) -> Any:
    """Inverse of :func:`pack_tensors` (``entries`` may hold other keys too)."""

    def fill(x):
        if isinstance(x, tuple) and len(x) == 2 and x[0] == _TENSOR:
            return entries[f"{prefix}t{x[1]}"]
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(fill(v) for v in x)
        return x

    return fill(pickle.loads(entries[prefix + "skeleton"]))


class ModelView(nn.Module):
    """The model parts one rank holds (interleaved pipeline stages) as one module whose parameter names are
    the unsplit model's: ``layers.<id>`` from every part, ``tok_embeddings``/``norm``/``output`` from the part
    that has them. It registers the parts' own submodules, so state dicts read and write the live
    parameters."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleDict()
        for part in parts:
            for layer_id, block in part.layers.items():
                self.layers[layer_id] = block
            for name in ("tok_embeddings", "norm", "output"):
                module = getattr(part, name, None)
                if module is not None:
                    setattr(self, name, module)


def state_module(parts: list[nn.Module]) -> nn.Module:
    """The module to take state dicts of: the part itself when there is one, else a :class:`ModelView`."""
    return parts[0] if len(parts) == 1 else ModelView(parts)


def suffix_keys(state: dict[str, Any], fqns: set[str], suffix: str) -> dict[str, Any]:
    """``state`` with every key naming one of ``fqns`` -- ``fqn`` itself, or ``state.<fqn>.<x>`` /
    ``param_groups.<fqn>.<x>`` in a flattened optimizer state dict -- renamed to carry ``suffix``."""
    if not fqns:
        return state
    out = {}
    for key, value in state.items():
        out[_rename(key, fqns, suffix)] = value
    return out


def unsuffix_keys(state: dict[str, Any], fqns: set[str], suffix: str) -> dict[str, Any]:
    if not fqns:
        return state
    back = {_rename(f, fqns, suffix): f for f in fqns}
    out = {}
    for key, value in state.items():
        out[_unrename(key, back)] = value
    return out


def _rename(key: str, fqns: set[str], suffix: str) -> str:
    if key in fqns:
        return key + suffix
    for head in ("state.", "param_groups."):
        if key.startswith(head):
            rest = key[len(head) :]
            fqn, dot, leaf = rest.rpartition(".")
            if fqn in fqns:
                return f"{head}{fqn}{suffix}{dot}{leaf}"
    return key


def _unrename(key: str, back: dict[str, str]) -> str:
    if key in back:
        return back[key]
    for head in ("state.", "param_groups."):
        if key.startswith(head):
            rest = key[len(head) :]
            fqn, dot, leaf = rest.rpartition(".")
            if fqn in back:
                return f"{head}{back[fqn]}{dot}{leaf}"
    return key
