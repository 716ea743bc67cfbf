"""The fault simulator: deterministic, Llama 3's failure mix, documented precursors, benign noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers.reliability.risk.features import FEATURE_NAMES, node_features
from workers.reliability.risk.simulator import (
    KINDS,
    LLAMA3_RATE_PER_NODE_DAY,
    LLAMA3_TABLE5,
    PRECURSORS,
    SIGNAL_EFFECTS,
    SimConfig,
    failure_mix,
    simulate,
)
from workers.reliability.risk.traces import TraceSet

SMALL = SimConfig(nodes=6, days=0.5, seed=3, failure_rate_per_node_day=4.0)


def test_the_same_config_gives_the_same_traces_and_another_seed_other_ones():
    a, b = simulate(SMALL), simulate(SMALL)
    assert a.failures == b.failures and a.nodes == b.nodes
    for ta, tb in zip(a.traces, b.traces, strict=True):
        np.testing.assert_array_equal(ta.times, tb.times)
        assert ta.metrics.keys() == tb.metrics.keys()
        for name in ta.metrics:
            np.testing.assert_array_equal(ta.metrics[name], tb.metrics[name])
    c = simulate(SimConfig(**{**SMALL.__dict__, "seed": 4}))
    assert c.failures != a.failures
    assert not np.array_equal(c.traces[0].metrics["gpu.0.temp_C"], a.traces[0].metrics["gpu.0.temp_C"])


def test_table5_is_kept_as_published():
    # Dubey et al. 2024, Table 5: 419 unexpected interruptions; each printed % is count / 419 except
    # Faulty GPU's (printed 30.1%, 148 / 419 = 35.3%): the simulator draws by count
    assert sum(k.count for k in LLAMA3_TABLE5) == 419
    assert [k.percent for k in LLAMA3_TABLE5][:3] == [30.1, 17.2, 12.9]
    for k in LLAMA3_TABLE5[1:]:
        assert round(100 * k.count / 419, 1) == k.percent, k.component
    assert sum(failure_mix().values()) == pytest.approx(1.0)
    assert LLAMA3_RATE_PER_NODE_DAY == pytest.approx(419 / (2048 * 54))


def test_the_failure_mix_matches_table5_within_sampling_error():
    # thousands of failures on a coarse, short simulation: each kind's count within 4 standard deviations
    # of its binomial expectation (a wrong mix, e.g. uniform, misses by dozens of sigmas)
    cfg = SimConfig(
        nodes=400, days=1.0, interval_s=600, failure_rate_per_node_day=12.0, downtime_s=1200, seed=11
    )
    failures = simulate(cfg).failures
    n = len(failures)
    assert n > 3000
    observed = {k: 0 for k in KINDS}
    for f in failures:
        observed[f.kind] += 1
    for kind, p in failure_mix().items():
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(observed[kind] - n * p) <= 4 * sigma, (kind, observed[kind], n * p)


def test_every_kind_has_a_documented_precursor_shape():
    assert set(PRECURSORS) == set(KINDS)
    for kind, shape in PRECURSORS.items():
        assert 0 <= shape.share <= 1
        assert set(shape.signals) <= set(SIGNAL_EFFECTS), kind
        assert (shape.share > 0) == bool(shape.signals), kind
        if shape.share:
            assert 0 < shape.lead_min_s <= shape.lead_max_s
    # software bugs mostly come without warning; silent data corruption always does
    assert PRECURSORS["software_bug"].share <= 0.2
    assert PRECURSORS["silent_data_corruption"].share == 0


def test_failures_with_a_precursor_come_at_the_documented_share():
    traces = simulate(
        SimConfig(nodes=300, days=1.0, interval_s=600, failure_rate_per_node_day=8.0, downtime_s=1200)
    )
    n = len(traces.failures)
    expected = sum(failure_mix()[k] * PRECURSORS[k].share for k in KINDS)
    with_precursor = sum(1 for f in traces.failures if f.precursor_s)
    assert abs(with_precursor / n - expected) <= 4 * math.sqrt(expected * (1 - expected) / n)
    for f in traces.failures:
        shape = PRECURSORS[f.kind]
        if f.precursor_s:
            assert shape.lead_min_s <= f.precursor_s <= shape.lead_max_s


def test_a_failed_node_is_down_then_rejoins_with_its_counters_reset():
    cfg = SimConfig(nodes=4, days=1.0, seed=5, failure_rate_per_node_day=3.0, downtime_s=3600)
    traces = simulate(cfg)
    f = traces.failures[0]
    trace = next(t for t in traces.traces if t.node == f.node)
    before = trace.times[trace.times < f.time_unix_s]
    after = trace.times[trace.times >= f.time_unix_s]
    assert after[0] - before[-1] >= cfg.downtime_s
    first_after = int(np.searchsorted(trace.times, f.time_unix_s))
    for g in range(cfg.gpus_per_node):
        assert trace.metrics[f"gpu.{g}.ecc_sbe_volatile_count"][first_after] <= 20  # counting from zero again
    assert len(trace.segments()) >= 2


def test_healthy_nodes_show_benign_spikes_so_false_alarms_are_possible():
    traces = simulate(SimConfig(nodes=16, days=2.0, seed=2, failure_rate_per_node_day=0.0))
    assert traces.failures == []
    feats = np.concatenate([node_features(t) for t in traces.traces])
    col = {name: feats[:, j] for j, name in enumerate(FEATURE_NAMES)}
    for name in ("ecc_sbe_per_min", "xid_per_min", "nvlink_errors_per_min", "nic_errors_per_s"):
        assert np.nanmax(col[name]) > 0, name
    # job-wide checkpoints: step time spikes well above its median on every node
    assert np.nanmax(col["step_time_s"]) > 2 * np.nanmedian(col["step_time_s"])


def test_a_thermal_precursor_heats_the_gpu_before_the_failure():
    cfg = SimConfig(
        nodes=8, days=1.0, seed=1, failure_rate_per_node_day=2.0, kinds={"gpu_thermal": 1.0}, downtime_s=3600
    )
    traces = simulate(cfg)
    f = next(f for f in traces.failures if f.precursor_s and f.precursor_s >= 1800)
    trace = next(t for t in traces.traces if t.node == f.node)
    temp = node_features(trace)[:, FEATURE_NAMES.index("temp_max_C")]
    last = (trace.times < f.time_unix_s) & (trace.times >= f.time_unix_s - 300)
    early = (trace.times < f.time_unix_s - f.precursor_s) & (
        trace.times >= f.time_unix_s - f.precursor_s - 3600
    )
    assert early.any() and last.any()
    assert np.median(temp[last]) > np.median(temp[early]) + 3


def test_traces_round_trip_through_a_file(tmp_path):
    a = simulate(SMALL)
    b = TraceSet.load(a.save(tmp_path / "t.npz"))
    assert b.failures == a.failures and b.description == a.description and b.nodes == a.nodes
    for ta, tb in zip(a.traces, b.traces, strict=True):
        np.testing.assert_array_equal(ta.times, tb.times)
        np.testing.assert_allclose(tb.metrics["gpu.1.power_W"], ta.metrics["gpu.1.power_W"], rtol=1e-6)


def test_invalid_configs_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="nodes"):
        simulate(SimConfig(nodes=0))
    with pytest.raises(ValueError, match="unknown failure kinds"):
        simulate(SimConfig(kinds={"gremlins": 1.0}))
    with pytest.raises(ValueError, match="downtime"):
        simulate(SimConfig(downtime_s=10))
