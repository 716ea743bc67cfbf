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
    for name in ("reference_runs.json", "hardware.json"):
        assert json.loads((SHARED / "data" / name).read_text()) == json.loads((DATA / name).read_text()), name


def test_examples_load():
    assert contract("model-moe.json")["moe"]["num_experts"] == 128
    assert len(reference_runs()) == 18
