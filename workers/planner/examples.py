"""The example documents and published runs the planner ships with.

``data/contracts/`` and ``data/reference_runs.json`` / ``data/hardware.json`` are copies of the project's
shared contracts and data (``shared/contracts``, ``shared/data`` beside the repository, the public
interface), vendored so that a clean clone is self-contained; ``tests/unit/test_planner_examples.py``
checks that the copies still equal the originals wherever those are present.

``data/examples/`` holds the small example that runs *here*: the ``this-machine-cpu`` cluster (one node,
two CPU ranks, the ``cpu`` device profile), the ``tiny-gpt`` model and its training config. A search on
them gives a plan the job API accepts and this machine trains in seconds (``make run`` loads them into the
demo team).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
CONTRACTS = DATA / "contracts"
REFERENCE_RUNS = DATA / "reference_runs.json"
SMALL_EXAMPLE = DATA / "examples"
# the originals, when the repository sits beside the shared folder
SHARED = Path(__file__).resolve().parents[3] / "shared"


def contract(name: str) -> dict[str, Any]:
    """An example contract document by file name, e.g. ``contract("model-moe.json")``."""
    return json.loads((CONTRACTS / name).read_text())


def reference_runs() -> list[dict[str, Any]]:
    return json.loads(REFERENCE_RUNS.read_text())["runs"]


def small_example() -> dict[str, dict[str, Any]]:
    """The example that runs on this machine: ``{"model", "cluster", "training"}`` documents. The cluster
    is :func:`this_machine_cluster`."""
    return {
        "model": json.loads((SMALL_EXAMPLE / "tiny-gpt.json").read_text()),
        "cluster": this_machine_cluster()[0],
        "training": json.loads((SMALL_EXAMPLE / "training-tiny.json").read_text()),
    }


def this_machine_cluster() -> tuple[dict[str, Any], str]:
    """This machine as the ``this-machine-cpu`` cluster, and where its figures come from: the device and
    link figures ``cann-train calibrate`` measured when it ran, else the shipped file (the default,
    unmeasured ``cpu`` profile)."""
    from .hardware import calibration_dir

    doc = json.loads((SMALL_EXAMPLE / "cluster-this-machine-cpu.json").read_text())
    measured = calibration_dir() / "cluster-cpu.json"
    if measured.exists():
        calibrated = json.loads(measured.read_text())
        doc.update({k: calibrated[k] for k in ("device", "intra_node", "inter_node") if k in calibrated})
        return doc, f"measured by cann-train calibrate ({measured})"
    return doc, "default cpu profile (not measured: run `cann-train calibrate`)"
