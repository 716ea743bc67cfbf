"""The gathered validation runs (``workers/planner/data/validation_runs.json``): each parses like a
reference run, cites its source and derives its step time from the throughput it quotes, and the set
covers what the planner must be checked on outside its tuning set — ZeRO-3, an uneven pipeline, devices
other than the A100 — without any of the held-out publications."""

from __future__ import annotations

import json

import pytest

from workers.planner.calibration import ReferenceRun
from workers.planner.examples import DATA

DOCS = json.loads((DATA / "validation_runs.json").read_text())["runs"]
# kept out of data/ and out of every fit, so that they stay an honest test
HELD_OUT = ("sc'21", "narayanan", "herd of models", "megascale", "megatron-lm readme", "korthikanti")


@pytest.mark.parametrize("doc", DOCS, ids=[d["id"] for d in DOCS])
def test_each_run_parses_and_cites_its_source(doc):
    run = ReferenceRun.from_dict(doc)
    assert run.paper and len(doc["source"]) > 40 and doc.get("notes")
    assert not any(name in doc["source"].lower() for name in HELD_OUT), doc["source"]
    measured = doc["measured"]
    tokens = doc["training"]["global_batch_size"] * doc["model"]["seq_length"]
    devices = run.cluster.num_devices
    if "tokens_per_s" in measured:
        assert measured["step_time_s"] == pytest.approx(tokens / measured["tokens_per_s"], rel=2e-3)
    elif "tokens_per_s_per_device" in measured:
        expected = tokens / (measured["tokens_per_s_per_device"] * devices)
        assert measured["step_time_s"] == pytest.approx(expected, rel=2e-3)


def test_the_set_covers_zero3_uneven_stages_and_other_devices():
    runs = [ReferenceRun.from_dict(d) for d in DOCS]
    assert len({r.id for r in runs}) == len(runs)
    assert sum(r.fixed.zero_stage == 3 for r in runs) >= 5
    assert any(r.fixed.layers_per_stage and len(set(r.fixed.layers_per_stage)) > 1 for r in runs), (
        "no uneven-pipeline run"
    )
    assert {r.device for r in runs} - {"A100-SXM4-80GB"}, "only A100 runs"
    assert len({r.paper for r in runs}) >= 3
