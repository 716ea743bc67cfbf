"""The LSTM and the baseline, fitted on simulated traces and judged on held-out ones (another seed, other
nodes): the issue's done-when is that the LSTM beats the baseline on F1 and reports lead time."""

from __future__ import annotations

import numpy as np
import pytest

from workers.reliability.risk.baseline import BaselineRiskModel
from workers.reliability.risk.evaluate import (
    LIU_2022_PRECISION,
    evaluate_models,
    fit_models,
    load_model,
    report,
)
from workers.reliability.risk.lstm import LstmConfig, LstmRiskModel
from workers.reliability.risk.simulator import SimConfig, simulate

# small enough for a unit test (a few seconds on one core), large enough for ~100 training failures
TRAIN = SimConfig(nodes=32, days=3.0, seed=0)
HELD_OUT = SimConfig(nodes=24, days=3.0, seed=1, node_prefix="eval")


@pytest.fixture(scope="module")
def fitted():
    train = simulate(TRAIN)
    held_out = simulate(HELD_OUT)
    models = fit_models(train, horizon_s=900, lstm_config=LstmConfig(epochs=6))
    return models, held_out, evaluate_models(models, held_out)


def test_the_lstm_beats_the_baseline_on_f1_on_held_out_traces_and_reports_lead_time(fitted):
    models, held_out, results = fitted
    lstm, baseline = results["lstm"], results["baseline"]
    assert set(held_out.nodes).isdisjoint(simulate(SimConfig(nodes=2, days=0.1, seed=0)).nodes)
    assert lstm.failures == baseline.failures > 30
    assert lstm.f1 > baseline.f1
    assert lstm.caught > 0 and lstm.lead_time_s_median is not None
    assert 0 < lstm.lead_time_s_median <= 900
    # no model can catch a failure without a precursor: recall stays below the share that has one
    with_precursor = sum(1 for f in held_out.failures if f.precursor_s)
    assert lstm.caught <= with_precursor + 1  # +1: a precursor-free failure right after another's alarm


def test_the_report_says_what_the_models_were_trained_and_evaluated_on(fitted):
    models, held_out, results = fitted
    doc = report(models, results, held_out)
    assert set(doc["models"]) == {"lstm", "baseline"}
    for row in doc["models"].values():
        assert {"precision", "recall", "f1", "lead_time_s_median", "false_alarms_per_node_day"} <= set(row)
    assert "seed 0" in doc["data"] and "seed 1" in doc["data"] and "Table 5" in doc["data"]
    assert doc["anchor"]["precision"] == LIU_2022_PRECISION
    beaten = [k for k, m in results.items() if m.precision > LIU_2022_PRECISION]
    assert doc["anchor"]["beaten_by"] == sorted(beaten)


def test_risks_are_probabilities_and_rise_before_failures(fitted):
    models, held_out, _ = fitted
    for model in models.values():
        risks = [model.risk(t) for t in held_out.traces[:6]]
        flat = np.concatenate(risks)
        assert flat.min() >= 0 and flat.max() <= 1
    lstm = models["lstm"]
    warned = [f for f in held_out.failures if f.precursor_s and f.precursor_s >= 900]
    before, elsewhere = [], []
    for t in held_out.traces:
        mine = [f for f in warned if f.node == t.node]
        if not mine:
            continue
        r = lstm.risk(t)
        for f in mine:
            near = (t.times < f.time_unix_s) & (t.times >= f.time_unix_s - 300)
            before.append(r[near].max())
        elsewhere.append(np.median(r))
    assert len(before) >= 5
    assert np.median(before) > 10 * np.median(elsewhere)


def test_saved_models_load_and_score_the_same(fitted, tmp_path):
    models, held_out, _ = fitted
    trace = held_out.traces[0]
    for name, model in models.items():
        loaded = load_model(model.save(tmp_path / name))
        assert type(loaded) is type(model)
        assert loaded.threshold == model.threshold and loaded.horizon_s == model.horizon_s
        assert loaded.trained_on_text == model.trained_on_text
        np.testing.assert_allclose(loaded.risk(trace), model.risk(trace), rtol=1e-6, atol=1e-9)
    assert isinstance(models["lstm"], LstmRiskModel) and isinstance(models["baseline"], BaselineRiskModel)


def test_the_lstm_is_deterministic_for_a_seed():
    train = simulate(SimConfig(nodes=8, days=1.0, seed=4))
    cfg = LstmConfig(epochs=1, hidden=8, window=8)
    a = fit_models(train, which=("lstm",), lstm_config=cfg)["lstm"]
    b = fit_models(train, which=("lstm",), lstm_config=LstmConfig(epochs=1, hidden=8, window=8))["lstm"]
    for pa, pb in zip(a.net.parameters(), b.net.parameters(), strict=True):
        assert np.array_equal(pa.detach().numpy(), pb.detach().numpy())


def test_live_scoring_keeps_one_sample_per_interval_and_matches_the_trace_score(fitted):
    from dataclasses import replace

    from workers.reliability.risk.live import LiveRiskScorer

    models, held_out, _ = fitted
    f = next(f for f in held_out.failures if f.precursor_s and f.precursor_s >= 900)
    trace = next(t for t in held_out.traces if t.node == f.node)
    last = int(np.searchsorted(trace.times, f.time_unix_s)) - 2  # a minute before the failure
    samples = list(trace.samples())[: last + 1]
    for name in ("lstm", "baseline"):
        scorer = LiveRiskScorer(models[name])
        for s in samples[-(scorer.keep + 5) :]:
            assert scorer.add(s)
            assert not scorer.add(replace(s, time_unix_s=s.time_unix_s + 10))  # the sampler's 10 s cadence
        values = scorer.score(trace.node)
        assert values["samples"] == scorer.keep and values["model"] == name
        expected = models[name].risk(trace)[last]
        assert values["risk"] == pytest.approx(expected, abs=1e-4)
        assert values["at_risk"] == (values["risk"] >= models[name].threshold)
    assert scorer.score("no-such-node") is None
