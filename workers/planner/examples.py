"""The example documents and published runs the planner ships with.

``data/contracts/`` and ``data/reference_runs.json`` / ``data/hardware.json`` are copies of the project's
shared contracts and data (``shared/contracts``, ``shared/data`` beside the repository, the public
interface), vendored so that a clean clone is self-contained; ``tests/unit/test_planner_examples.py``
checks that the copies still equal the originals wherever those are present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
CONTRACTS = DATA / "contracts"
REFERENCE_RUNS = DATA / "reference_runs.json"
# the originals, when the repository sits beside the shared folder
SHARED = Path(__file__).resolve().parents[3] / "shared"


def contract(name: str) -> dict[str, Any]:
    """An example contract document by file name, e.g. ``contract("model-moe.json")``."""
    return json.loads((CONTRACTS / name).read_text())


def reference_runs() -> list[dict[str, Any]]:
    return json.loads(REFERENCE_RUNS.read_text())["runs"]
