"""Import of Prometheus text-format scrapes (recorded dcgm-exporter, npu-exporter and node_exporter output,
and a multi-scrape history; tests/data/telemetry/README.md says where each format comes from)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workers.reliability.telemetry import host, job, npu_smi, nvml
from workers.reliability.telemetry.prometheus import (
    IMPORT_ONLY,
    MAP_PATH,
    import_prometheus_file,
    import_prometheus_text,
    load_metric_map,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "telemetry"
SCRAPE_TIME = 1767261600.0  # 2026-01-01T10:00:00Z


def normalised(template: str) -> str:
    return re.sub(r"\{[a-z]+\}", "{}", template)


def test_one_table_maps_every_name_to_one_a_live_collector_reports_or_says_why_not():
    table = load_metric_map()
    live = {normalised(m) for mod in (host, nvml, npu_smi, job) for m in mod.METRICS}
    import_only = {normalised(m) for m in IMPORT_ONLY}
    ours = {normalised(m.ours) for m in table.mappings}
    assert ours <= live | import_only, ours - live - import_only
    assert import_only <= ours  # no stale excuses
    assert not import_only & live
    assert all(m.source for m in table.mappings)
    names = [m.name for m in table.mappings if m.name]
    assert len(names) == len(set(names))
    assert {m.exporter for m in table.mappings} == {"dcgm-exporter", "npu-exporter", "node_exporter"}


def test_the_table_is_checked_when_loaded(tmp_path):
    raw = json.loads(MAP_PATH.read_text())
    del raw["metrics"][0]["source"]
    (tmp_path / "map.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="cites its source"):
        load_metric_map(tmp_path / "map.json")


def test_a_dcgm_exporter_scrape_becomes_one_sample_of_its_node():
    result = import_prometheus_file(DATA / "dcgm_exporter.prom", default_time=SCRAPE_TIME)
    (sample,) = result.samples["gpu-node-07"]  # Hostname label: no instance in a raw scrape
    v = sample.values
    assert sample.time_unix_s == SCRAPE_TIME
    assert (v["gpu.0.temp_C"], v["gpu.1.temp_C"]) == (41, 67)
    assert v["gpu.1.power_W"] == pytest.approx(611.902)
    assert v["gpu.1.mem_used_GiB"] == pytest.approx(72059 / 1024)
    assert (v["gpu.1.xid_last"], v["gpu.1.ecc_dbe_volatile_count"]) == (48, 1)
    assert v["gpu.1.clocks_event_reasons"] == 36
    assert v["gpu.1.remapped_rows_uncorrectable_count"] == 1
    assert v["gpu.1.nvlink_replay_errors_count"] == 2
    assert v["gpu.1.pcie_replay_count"] == 3
    assert "gpu.0.retired_pages_sbe_count" not in v  # DCGM's not-supported blank is not a count
    (blank_reason,) = [k for k in result.skipped if "blank" in k]
    assert result.skipped[blank_reason] == 4
    # what the table leaves out is counted by name, not silently dropped
    assert result.unmapped["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 2
    assert result.unmapped["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 2


def test_an_npu_exporter_dump_needs_its_node_and_maps_every_hccs_lane():
    text = (DATA / "npu_exporter.prom").read_text()
    with pytest.raises(ValueError, match=r"line \d+: no node label .* pass node="):
        import_prometheus_text(text, default_time=SCRAPE_TIME)
    result = import_prometheus_text(text, default_time=SCRAPE_TIME, node="npu-node-03")
    (sample,) = result.samples["npu-node-03"]
    v = sample.values
    assert (v["npu.0.health"], v["npu.1.health"]) == (1, 0)
    assert v["npu.1.temp_C"] == 74 and v["npu.1.power_W"] == pytest.approx(
        288.4, abs=1e-5
    )  # a float32 widened, as the exporter prints it
    assert v["npu.1.hbm_used_GiB"] == pytest.approx(58211 / 1024)
    assert v["npu.1.hbm_ecc_sbe_count"] == 14 and v["npu.1.hbm_ecc_sbe_isolated_pages_count"] == 2
    assert v["npu.1.hccs3_crc_errors_count"] == 57
    assert {k for k in v if k.startswith("npu.0.hccs")} == {
        f"npu.0.hccs{i}_crc_errors_count" for i in range(1, 8)
    }
    # -1 is npu-exporter's "collection failed", not a value
    assert "npu.1.hccs6_crc_errors_count" not in v and "npu.1.network_healthy" not in v
    assert result.skipped["npu-exporter reports -1 when its DCMI / hccn_tool call failed"] == 2
    assert result.unmapped == {"machine_npu_nums": 1, "npu_exporter_version_info": 1}


def test_a_single_node_exporter_scrape_has_gauges_but_no_rates_yet():
    result = import_prometheus_file(DATA / "node_exporter.prom", default_time=SCRAPE_TIME, node="gpu-node-07")
    (sample,) = result.samples["gpu-node-07"]
    assert sample.values["cpu.load1"] == 11.42
    assert sample.values["mem.total_GiB"] == pytest.approx(2.164222795776e12 / 2**30)
    assert sample.absent["net.ib0.rx_errs_per_s"] == "first scrape of this counter: a rate needs two"
    assert not any(k.startswith("net.ib0") for k in sample.values)
    assert not any(".lo." in k for k in [*sample.values, *sample.absent])  # loopback left out, as live


def test_a_history_gives_time_ordered_samples_per_node_with_rates_between_scrapes():
    result = import_prometheus_file(DATA / "history.prom")
    assert result.nodes == ["10.0.0.7", "10.0.0.8"]  # instance with the port dropped: both exporters merge
    seven = result.samples["10.0.0.7"]
    assert [s.time_unix_s for s in seven] == [SCRAPE_TIME, SCRAPE_TIME + 15, SCRAPE_TIME + 30]
    assert [s.values["gpu.1.temp_C"] for s in seven] == [67, 76, 84]
    assert "net.ib0.rx_errs_per_s" in seven[0].absent
    assert [s.values["net.ib0.rx_errs_per_s"] for s in seven[1:]] == [2.0, 4.0]  # 30 / 15 s, 60 / 15 s
    eight = result.samples["10.0.0.8"]
    # 5 -> 5 -> 2: the counter was reset, so the increase is the new value (as Prometheus's rate())
    assert [s.values["net.eth0.rx_errs_per_s"] for s in eight[1:]] == [0.0, pytest.approx(2 / 15)]
    by_host = import_prometheus_file(DATA / "history.prom", node_labels=("Hostname",), node="unnamed")
    assert by_host.nodes == ["gpu-node-07", "gpu-node-08", "unnamed"]  # node_exporter has no Hostname
    event = seven[-1].to_event_values()
    assert event["node"] == "10.0.0.7" and event["sampled_at"] == "2026-01-01T10:00:30.000Z"
    assert event["source"].startswith("prometheus:")


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("<html><body>502 Bad Gateway</body></html>\n", 1, "not Prometheus text format"),
        ("node_load1 1.5\nthis is not a metric line\n", 2, "not Prometheus text format"),
        ('node_load1{a="b" 2\n', 1, "not Prometheus text format"),
        ("node_load1 1 2 3\n", 1, "not Prometheus text format"),
        ("node_load1 1 1767261600.5\n", 1, "integer milliseconds"),
        ("# HELP\n", 1, "without a metric name"),
        ("node_load1 1.5\n# TYPE node_load5\n", 2, "without a type"),
    ],
)
def test_garbage_is_refused_with_the_line_it_is_on(text, line, why):
    with pytest.raises(ValueError, match=rf"line {line}: .*{why}"):
        import_prometheus_text(text, default_time=SCRAPE_TIME, node="n")


def test_a_scrape_without_timestamps_needs_its_time():
    with pytest.raises(ValueError, match=r"line 1: the sample has no timestamp; pass default_time"):
        import_prometheus_text("node_load1 1.5\n", node="n")
