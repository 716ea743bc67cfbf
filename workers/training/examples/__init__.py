"""Tiny example models and strategies (JSON, contract format) that train in seconds on CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DIR = Path(__file__).resolve().parent


def example(name: str) -> dict[str, Any]:
    """An example document by file name, e.g. ``example("tiny-dense.json")``."""
    return json.loads((DIR / name).read_text())
