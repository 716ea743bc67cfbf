"""Training on a cluster's own history: a Prometheus text dump plus an incident list (tests/data/risk)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workers.reliability.risk.evaluate import NodeRisk, event_metrics
from workers.reliability.risk.features import FEATURE_NAMES, node_features
from workers.reliability.risk.history import load_incidents, traces_from_prometheus, write_incidents
from workers.reliability.risk.lstm import LstmConfig, train_lstm

DATA = Path(__file__).resolve().parents[1] / "data" / "risk"
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the dump's first scrape


@pytest.fixture(scope="module")
def history():
    return traces_from_prometheus(DATA / "history.prom", DATA / "incidents.csv")


def test_the_dump_becomes_per_node_traces_in_our_metric_names(history):
    assert history.nodes == ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
    lengths = {t.node: len(t) for t in history.traces}
    assert lengths == {"gpu-node-01": 56, "gpu-node-02": 60, "gpu-node-03": 50}  # scrapes stop at a failure
    t = history.traces[0]
    assert t.interval_s == 30 and t.times[0] == T0
    assert {"gpu.0.temp_C", "gpu.0.ecc_sbe_volatile_count", "gpu.0.xid_last", "net.ib0.rx_errs_per_s"} <= set(
        t.metrics
    )


def test_the_incident_list_names_nodes_kinds_and_times_in_either_form(history):
    assert [(f.node, f.kind, f.time_unix_s) for f in history.failures] == [
        ("gpu-node-01", "gpu_hbm3", T0 + 28 * 60),
        ("gpu-node-03", "nic", T0 + 25 * 60),
    ]
    assert all(f.precursor_s is None for f in history.failures)  # nobody knows for real incidents


def test_features_read_counters_as_rates_and_the_last_xid_gauge_as_events(history):
    by_node = {t.node: (t, node_features(t)) for t in history.traces}
    t, f = by_node["gpu-node-02"]
    sbe = f[:, FEATURE_NAMES.index("ecc_sbe_per_min")]
    assert sbe[16] == pytest.approx(12 / 0.5)  # the benign burst: 12 errors in one 30 s scrape
    assert np.count_nonzero(sbe) == 1
    nic = f[:, FEATURE_NAMES.index("nic_errors_per_s")]
    assert np.isnan(nic[0])  # a rate needs two scrapes
    assert nic[40] == pytest.approx(90 / 30)
    t, f = by_node["gpu-node-01"]
    xid = f[:, FEATURE_NAMES.index("xid_per_min")]
    assert xid[50] == pytest.approx(2.0) and np.count_nonzero(xid) == 1  # XID 94 once, per minute
    assert np.all(np.isnan(f[:, FEATURE_NAMES.index("step_time_s")]))  # no job signals in this dump


def test_an_lstm_trained_on_the_history_learns_its_labelled_precursors(history):
    # a path test, not a benchmark: 166 samples and two failures; threshold chosen on the same traces
    cfg = LstmConfig(horizon_s=300, window=6, hidden=8, epochs=60, batch_size=32, negatives_per_positive=50)
    model = train_lstm(history, cfg, validation=history)
    assert model.trained_on["description"]["incidents"] == "incidents.csv"
    assert "2 incidents" in model.trained_on_text
    nodes = [NodeRisk(t.node, t.times, model.risk(t), history.failure_times(t.node)) for t in history.traces]
    m = event_metrics(nodes, threshold=model.threshold, horizon_s=300)
    assert m.caught == 2 and m.false_alarms == 0
    healthy = next(n for n in nodes if n.node == "gpu-node-02")
    assert healthy.risk.max() < model.threshold


def test_incident_lists_with_errors_are_refused_with_the_line(tmp_path):
    bad = tmp_path / "incidents.csv"
    bad.write_text("node,when\nx,2026-01-01T00:00:00Z\n")
    with pytest.raises(ValueError, match="line 1: the header must name node, time, kind; missing time, kind"):
        load_incidents(bad)
    bad.write_text("node,time,kind\ngpu-node-01,yesterday,gpu_hbm3\n")
    with pytest.raises(ValueError, match="line 2: time 'yesterday' is neither ISO 8601"):
        load_incidents(bad)
    bad.write_text("node,time,kind\ngpu-node-01,2026-01-01T00:28:00,gpu_hbm3\n")
    with pytest.raises(ValueError, match="line 2: .*no time zone"):
        load_incidents(bad)
    bad.write_text("node,time,kind\ngpu-node-99,2026-01-01T00:28:00Z,nic\n")
    with pytest.raises(ValueError, match="nodes the dump has no samples of: gpu-node-99"):
        traces_from_prometheus(DATA / "history.prom", bad)


def test_written_incidents_read_back(history, tmp_path):
    back = load_incidents(write_incidents(history.failures, tmp_path / "out.csv"))
    assert sorted(back, key=lambda f: f.node) == sorted(history.failures, key=lambda f: f.node)
