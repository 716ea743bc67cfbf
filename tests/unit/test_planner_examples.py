"""The vendored contract examples and published runs match the shared originals (when present)."""

import json

import pytest

from workers.planner.examples import CONTRACTS, DATA, SHARED, contract, reference_runs


@pytest.mark.skipif(not SHARED.exists(), reason="the shared folder is not beside this checkout")
def test_vendored_copies_equal_the_shared_originals():
    for original in sorted((SHARED / "contracts").glob("*.json")):
        assert json.loads(original.read_text()) == json.loads((CONTRACTS / original.name).read_text()), (
            original.name
        )
    assert json.loads((SHARED / "data" / "hardware.json").read_text()) == json.loads(
        (DATA / "hardware.json").read_text()
    )
    shared = json.loads((SHARED / "data" / "reference_runs.json").read_text())["runs"]
    assert [_without_published_settings(r) for r in reference_runs()] == shared


def _without_published_settings(run: dict) -> dict:
    """A vendored reference run less what the copy adds (issue 37): the training settings its publication
    used, stated explicitly so that the framework defaults never change how it is predicted, and why."""
    run = {k: v for k, v in run.items() if k != "settings_source"}
    added = ("framework", "flash_attention", "overlap_grad_reduce")
    return {**run, "training": {k: v for k, v in run["training"].items() if k not in added}}


def test_every_reference_run_states_the_settings_its_publication_used():
    for run in reference_runs():
        assert {"framework", "flash_attention", "overlap_grad_reduce"} <= set(run["training"]), run["id"]
        assert len(run["settings_source"]) > 80, run["id"]


def test_examples_load():
    assert contract("model-moe.json")["moe"]["num_experts"] == 128
    assert len(reference_runs()) == 18
