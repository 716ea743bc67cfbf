"""The torchft Lighthouse (the quorum service) of a hot-swap run, in a process of its own."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from workers.reliability.hotswap.limits import JOIN_TIMEOUT_MS, QUORUM_TICK_MS, HotSwapError


def _torchft_extension():
    """torchft's Rust extension without the ``torchft`` package's ``__init__`` (which imports torch, seconds
    of start-up the Lighthouse does not need)."""
    import importlib.machinery
    import importlib.util

    spec = importlib.util.find_spec("torchft")
    if spec is None or not spec.submodule_search_locations:
        raise HotSwapError("torchft is not installed (pip install torchft==0.2.0)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = next(folder.glob("_torchft*.so"), None)
    if path is None:
        raise HotSwapError(f"torchft's extension _torchft*.so is missing from {folder}")
    loader = importlib.machinery.ExtensionFileLoader("torchft._torchft", str(path))
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location("torchft._torchft", path, loader=loader)
    )
    loader.exec_module(module)
    return module


def lighthouse_main(bind: str, heartbeat_timeout_ms: int, out: Path) -> int:
    """The Lighthouse in a process of its own (its Rust logger writes a line per quorum tick to stderr:
    into ``lighthouse.log``, not the caller's terminal). Writes its port to ``out``, serves until killed."""
    server = _torchft_extension().LighthouseServer(
        bind=bind,
        min_replicas=1,
        join_timeout_ms=JOIN_TIMEOUT_MS,
        quorum_tick_ms=QUORUM_TICK_MS,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )
    port = int(server.address().rsplit(":", 1)[1])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": port, "pid": os.getpid()}))
    os.replace(tmp, out)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()
