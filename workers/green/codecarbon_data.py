"""Where CodeCarbon's bundled data files are (country energy mix, CPU TDP table), found without importing
``codecarbon``: its import is slow and starts logging and hardware probes.
``importlib.resources.files("codecarbon")`` would import it; ``find_spec`` only locates it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path


def codecarbon_package() -> tuple[str, Path] | None:
    """``(codecarbon version, package directory)`` of the installed package, or ``None`` without one."""
    spec = importlib.util.find_spec("codecarbon")
    if spec is None or not spec.submodule_search_locations:
        return None
    return importlib.metadata.version("codecarbon"), Path(next(iter(spec.submodule_search_locations)))
