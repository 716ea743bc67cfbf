"""npu-smi parsers on recorded outputs (tests/data/telemetry, provenance in its README), and the collector
running a stand-in npu-smi that replays them (npu-smi is Huawei's tool, not ours)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workers.reliability.telemetry.npu_smi import (
    METRICS,
    NpuSmiCollector,
    parse_npu_smi_ecc,
    parse_npu_smi_health,
    parse_npu_smi_info,
    parse_npu_smi_key_values,
    parse_npu_smi_temperature,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "telemetry"


def recorded(name: str) -> str:
    """A recorded output without its provenance header (the leading '#' lines)."""
    lines = (DATA / name).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def test_the_910b_table_gives_each_chips_health_power_temperature_and_hbm():
    info = parse_npu_smi_info(recorded("npu_smi_info_910b.txt"))
    assert info.version == "23.0.7"
    assert [(c.npu_id, c.chip_id) for c in info.chips] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    busy = info.chips[1]
    assert (busy.name, busy.health, busy.power_W, busy.temp_C, busy.aicore_pct) == (
        "910B2",
        "OK",
        311.2,
        52,
        87,
    )
    assert busy.bus_id == "0000:01:00.0"
    assert busy.usage_MB == {"Memory-Usage": (0, 0), "HBM-Usage": (58211, 65536)}
    assert info.chips[2].health == "Warning"


def test_the_310b_table_has_a_device_column_no_bus_id_and_ddr_only():
    (chip,) = parse_npu_smi_info(recorded("npu_smi_info_310b.txt")).chips
    assert (chip.npu_id, chip.chip_id, chip.name, chip.bus_id) == (0, 0, "310B4", "NA")
    assert (chip.power_W, chip.temp_C, chip.aicore_pct) == (7.6, 41, 12)
    assert chip.usage_MB == {"Memory-Usage": (1797, 3513)}


def test_a_table_without_npus_is_refused():
    with pytest.raises(ValueError, match="no NPU"):
        parse_npu_smi_info("dcmi module initialize failed. ret is -8005\n")


def test_health_ok_and_warning_with_codes_and_continued_descriptions():
    ok = parse_npu_smi_health(recorded("npu_smi_health_ok.txt"))
    assert (ok.status, ok.healthy, ok.error_codes, ok.error_information) == ("OK", True, [], "")
    bad = parse_npu_smi_health(recorded("npu_smi_health_warning.txt"))
    assert bad.status == "Warning" and bad.healthy is False
    assert bad.error_codes == ["80E01801", "80CB8009"]
    first, second = bad.error_information.split("; ")
    assert "sensor type=Temperature" in first and "sensor type=Memory" in second
    assert parse_npu_smi_health("\tHealth Status                  : NA\n").healthy is None
    with pytest.raises(ValueError, match="Health Status"):
        parse_npu_smi_health("Error: device 9 does not exist\n")


def test_temperature_and_ecc_queries():
    assert parse_npu_smi_temperature(recorded("npu_smi_temp.txt")) == 39.0
    assert parse_npu_smi_temperature("\tTemperature (C)                : 48\n") == 48.0
    with pytest.raises(ValueError, match="no temperature available"):
        parse_npu_smi_temperature("\tNPU Temperature (C)            : NA\n")
    ecc = parse_npu_smi_ecc(recorded("npu_smi_ecc.txt"))
    assert ecc["hbm_ecc_sbe_count"] == 14
    assert ecc["hbm_ecc_sbe_aggregate_count"] == 37
    assert ecc["hbm_ecc_sbe_isolated_pages_count"] == 2
    assert ecc["hbm_ecc_dbe_count"] == 0 and ecc["ddr_ecc_dbe_count"] == 0
    assert len(ecc) == 12
    with pytest.raises(ValueError, match="no ECC counter"):
        parse_npu_smi_ecc("\tNPU ID                         : 1\n")


def test_key_value_lines_keep_their_order_and_skip_prose():
    fields = parse_npu_smi_key_values("header without colon\n\tNPU ID : 4\n\tChip ID : 0\n")
    assert fields == [("NPU ID", "4"), ("Chip ID", "0")]


@pytest.fixture
def stand_in_npu_smi(tmp_path):
    """An executable named npu-smi that prints the recorded outputs for the queries the collector makes,
    and logs each call."""
    for name in (
        "npu_smi_info_910b.txt",
        "npu_smi_map_910b.txt",
        "npu_smi_health_warning.txt",
        "npu_smi_ecc.txt",
    ):
        (tmp_path / name).write_text(recorded(name))
    tool = tmp_path / "npu-smi"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls\n'
        f'if [ "$#" = "1" ]; then cat {tmp_path}/npu_smi_info_910b.txt; exit 0; fi\n'
        f'if [ "$2" = "-m" ]; then cat {tmp_path}/npu_smi_map_910b.txt; exit 0; fi\n'
        f'if [ "$3" = "health" ] && [ "$5" = "2" ]; then cat {tmp_path}/npu_smi_health_warning.txt; exit 0; fi\n'
        f'if [ "$3" = "ecc" ]; then cat {tmp_path}/npu_smi_ecc.txt; exit 0; fi\n'
        'echo "Error parameter" >&2; exit 1\n'
    )
    tool.chmod(0o755)
    return tool


def test_the_collector_reads_every_chip_and_ecc_every_nth_sample(stand_in_npu_smi):
    collector = NpuSmiCollector(executable=str(stand_in_npu_smi), ecc_every=2)
    ok, how = collector.available()
    assert ok and "logic ids" in how
    first = collector.sample()
    assert first.values["npu.1.power_W"] == 311.2
    assert first.values["npu.1.hbm_used_GiB"] == pytest.approx(58211 / 1024)
    assert first.values["npu.1.aicore_util_pct"] == 87
    assert first.values["npu.2.health"] == 0 and first.values["npu.0.health"] == 1
    assert first.info["npu.2.error_codes"] == ["80E01801", "80CB8009"]
    assert first.values["npu.3.hbm_ecc_sbe_count"] == 14  # every chip answers with the recorded counters
    assert "npu.0.mem_used_GiB" not in first.values  # "0 / 0": the 910B has no separate DDR in the table
    second = collector.sample()
    assert "npu.3.hbm_ecc_sbe_count" not in second.values
    assert "every 2 samples" in second.absent["npu.3.hbm_ecc"]
    third = collector.sample()
    assert third.values["npu.3.hbm_ecc_sbe_count"] == 14
    calls = (stand_in_npu_smi.parent / "calls").read_text().splitlines()
    assert calls.count("info -t ecc -i 0 -c 0") == 2  # samples 1 and 3
    # every name the collector produced is one it declares
    templates = {re.sub(r"\{id\}", "{}", m) for m in METRICS}
    assert {re.sub(r"^npu\.\d+\.", "npu.{}.", k) for k in first.values} <= templates


def test_without_npu_smi_the_source_is_absent_with_the_reason(tmp_path):
    ok, why = NpuSmiCollector(executable=str(tmp_path / "npu-smi")).available()
    assert not ok and "not on PATH" in why


def test_an_npu_smi_that_fails_is_not_used(tmp_path):
    tool = tmp_path / "npu-smi"
    tool.write_text("#!/bin/sh\necho 'dcmi module initialize failed. ret is -8005' >&2\nexit 2\n")
    tool.chmod(0o755)
    ok, why = NpuSmiCollector(executable=str(tool)).available()
    assert not ok and "exited 2" in why and "-8005" in why
