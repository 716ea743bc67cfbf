"""Gradient communication: DDP hooks (:mod:`.hooks`), compression (:mod:`.compression`), hierarchical
all-reduce (:mod:`.hierarchical`), bucketing, the emulated network (:mod:`.netem`) and the method
comparison (:mod:`.compare`).

The hook registry is imported lazily (PEP 562), so that torch-free parts (``netem``, ``bucketing``) can be
imported by the web process without pulling in torch.
"""

from __future__ import annotations

import importlib

_HOOK_NAMES = {
    "HOOKS",
    "build_hook",
    "choose_bucket_cap_mb",
    "get_hook",
    "parse_hook_spec",
    "register_comm_hook",
}


def __getattr__(name: str):
    if name in _HOOK_NAMES:
        return getattr(importlib.import_module("workers.training.comm.hooks"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_HOOK_NAMES)
