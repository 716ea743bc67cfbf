"""Power meters (workers/green/power/): the best source present per component, every absent source named
with its reason, estimates labelled as estimates; RAPL read from a sysfs-shaped directory the test writes
(a real filesystem read, counter wrap included); npu-smi output parsed from recorded text."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from workers.green.power import (
    RAPL_ROOT,
    UNKNOWN_CPU_TDP_WATTS,
    NpuSmiPower,
    PowerReading,
    RaplEnergy,
    SourceUnavailable,
    codecarbon_cpu_tdp,
    parse_npu_smi_mapping,
    parse_npu_smi_power,
    select_meter,
    sum_readings,
)


def burn_cpu(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += sum(i * i for i in range(2000))


def nvml_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


# ------------------------------------------------------------------------------------ this machine


@pytest.mark.skipif(
    RAPL_ROOT.exists(), reason="this machine exposes powercap RAPL: the estimate path is not taken"
)
def test_estimate_on_this_machine_is_positive_labelled_and_names_rapl_absent():
    with select_meter("cpu") as meter:
        first = meter.read()
        t0 = time.perf_counter()
        burn_cpu(0.3)
        last = meter.read()
        wall = time.perf_counter() - t0
        d = meter.describe()
        per_read_us = 0.0
        for _ in range(200):
            t = time.perf_counter()
            meter.read()
            per_read_us += (time.perf_counter() - t) * 1e6 / 200
    print(f"meter.read() on this machine (estimate path): {per_read_us:.0f} us per call")

    # cumulative since the meter started (a CPU tick may already fall between the start and the first read)
    assert first.joules["device"] == 0.0 and 0.0 <= first.joules["cpu"] < last.joules["cpu"]
    assert last.joules["memory"] > first.joules["memory"] >= 0.0 and last.joules["device"] == 0.0
    # TDP x CPU seconds / logical CPUs can never exceed TDP x wall time
    assert last.joules["cpu"] - first.joules["cpu"] <= d["components"]["cpu"]["tdp_watts"] * wall * 1.05
    assert d["method"] == "estimate" and d["measured"] is False
    assert d["estimated"] == ["cpu", "memory"] and d["missing"] == []
    assert "estimate" in d["label"] and "not measured" in d["label"]
    cpu = d["components"]["cpu"]
    assert cpu["source"] == "estimate" and cpu["measured"] is False and "not measured" in cpu["label"]
    assert cpu["cpu_model"]  # as /proc/cpuinfo names it
    known = codecarbon_cpu_tdp(cpu["cpu_model"])
    if known is None:  # this machine's VM CPU ("Intel(R) Xeon(R) Processor") is in no table row of its own
        assert (
            cpu["tdp_watts"] == UNKNOWN_CPU_TDP_WATTS == 85.0 and "POWER_CONSTANT = 85" in cpu["tdp_source"]
        )
        assert "is not in CodeCarbon's CPU table" in cpu["tdp_source"]
    else:
        assert cpu["tdp_watts"] == known[0] and repr(known[1]) in cpu["tdp_source"]
    assert "3 W per 8 GB" in d["components"]["memory"]["watts_per_GiB_source"]
    assert d["components"]["device"]["source"] == "none"
    rapl = [t for t in d["tried"] if t["source"] == "rapl"]
    assert {t["component"] for t in rapl} == {"cpu", "memory"}
    assert all("/sys/class/powercap does not exist" in t["why"] for t in rapl)


@pytest.mark.skipif(
    nvml_present(), reason="this machine has an NVIDIA driver: NVML is used, not the estimate"
)
def test_cuda_job_without_nvml_says_why_and_estimates_from_the_device_tdp():
    with select_meter("cuda", [0], tdp_watts=700, utilisation=lambda: 0.5) as meter:
        meter.read()
        time.sleep(0.05)
        reading = meter.read()
        d = meter.describe()
    nvml = [t for t in d["tried"] if t["source"] == "nvml"]
    assert len(nvml) == 1 and "NVML" in nvml[0]["why"]
    assert d["components"]["device"]["source"] == "estimate"
    assert "700 W TDP x 1 cuda device(s) x utilisation" in d["components"]["device"]["how"]
    assert d["method"] == "estimate" and "device" in d["estimated"]
    # 700 W x 0.5 over the time since the meter started
    assert 0 < reading.joules["device"] <= 350 * 10


@pytest.mark.skipif(nvml_present(), reason="this machine has an NVIDIA driver")
def test_cuda_job_without_a_meter_or_a_tdp_counts_no_device_energy_and_says_so():
    with select_meter("cuda", [0]) as meter:
        d = meter.describe()
        assert meter.read().joules["device"] == 0.0
    assert d["missing"] == ["device"]
    assert "not counted: device" in d["label"]
    assert "tdp_watts" in d["components"]["device"]["why"]


# -------------------------------------------------------------------------------------------- RAPL


def write_zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int) -> Path:
    path = root / zone
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    """A sysfs-shaped /sys/class/powercap: one package with core and dram sub-zones, and psys."""
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type, not a zone
    (root / "intel-rapl" / "enabled").write_text("1\n")
    write_zone(root, "intel-rapl:0", "package-0", 900_000, 1_000_000)
    write_zone(root, "intel-rapl:0:0", "core", 500_000, 1_000_000)
    write_zone(root, "intel-rapl:0:1", "dram", 10_000_000, 65_532_610_987)
    write_zone(root, "intel-rapl:1", "psys", 1_000_000, 262_143_328_850)
    return root


def set_energy(root: Path, zone: str, energy_uj: int) -> None:
    (root / zone / "energy_uj").write_text(f"{energy_uj}\n")


def test_rapl_reads_package_and_dram_and_handles_a_counter_wrap(powercap):
    rapl = RaplEnergy(powercap, poll_interval_s=None)
    assert rapl.joules(0.0) == {"cpu": 0.0, "memory": 0.0}
    # the package counter wraps at max_energy_range_uj: 900_000 -> 1_000_000 (=0) -> 100_000: 200_000 uJ
    set_energy(powercap, "intel-rapl:0", 100_000)
    set_energy(powercap, "intel-rapl:0:1", 12_500_000)
    set_energy(powercap, "intel-rapl:0:0", 999_999)  # core is inside the package: never added
    set_energy(powercap, "intel-rapl:1", 99_000_000)  # psys includes the package: never added
    assert rapl.joules(1.0) == {"cpu": 0.2, "memory": 2.5}
    set_energy(powercap, "intel-rapl:0", 350_000)
    assert rapl.joules(2.0) == {"cpu": 0.45, "memory": 2.5}
    d = rapl.describe("cpu")
    assert d["measured"] is True and d["zones"] == [{"zone": "intel-rapl:0", "name": "package-0", "wraps": 1}]
    assert sorted(d["skipped"]) == ["intel-rapl:0:0 (core)", "intel-rapl:1 (psys)"]


def test_meter_takes_rapl_for_cpu_and_memory_when_present(powercap):
    with select_meter("cpu", rapl_root=powercap) as meter:
        set_energy(powercap, "intel-rapl:0", 950_000)
        set_energy(powercap, "intel-rapl:0:1", 11_000_000)
        reading = meter.read()
        d = meter.describe()
    assert reading.joules == {"device": 0.0, "cpu": 0.05, "memory": 1.0}
    assert d["method"] == "rapl" and d["measured"] is True and d["estimated"] == []
    assert d["components"]["cpu"]["source"] == d["components"]["memory"]["source"] == "rapl"
    assert d["label"] == "measured: cpu, memory (rapl)"


def test_rapl_without_a_dram_zone_measures_cpu_and_estimates_memory(powercap):
    for f in (powercap / "intel-rapl:0:1").iterdir():
        f.unlink()
    (powercap / "intel-rapl:0:1").rmdir()
    with select_meter("cpu", rapl_root=powercap) as meter:
        d = meter.describe()
    assert d["components"]["cpu"]["source"] == "rapl"
    assert d["components"]["memory"]["source"] == "estimate" and d["estimated"] == ["memory"]
    assert {"source": "rapl", "component": "memory", "why": "RAPL exposes no dram zone here"} in d["tried"]
    assert d["method"] == "rapl" and "estimate: memory" in d["label"]


def test_rapl_absence_reasons(tmp_path, powercap):
    with pytest.raises(SourceUnavailable, match="does not exist"):
        RaplEnergy(tmp_path / "nothing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceUnavailable, match="no intel-rapl"):
        RaplEnergy(empty)
    (powercap / "intel-rapl:0" / "max_energy_range_uj").unlink()
    with pytest.raises(SourceUnavailable, match="max_energy_range_uj"):
        RaplEnergy(powercap)


UNPRIVILEGED = 65534  # nobody: root reads any file, so as root the meter is opened by this user instead


def test_rapl_counter_readable_by_root_only_is_reported(powercap):
    counter = powercap / "intel-rapl:0" / "energy_uj"
    counter.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(SourceUnavailable, match="root only"):
            RaplEnergy(powercap)
        return
    # root reads a mode-000 file all the same (CI runs as root): the meter is opened in a forked child that
    # drops to an unprivileged user (exec'ing a new interpreter would not do: root's Python lives under
    # /root, which that user cannot enter), over a copy of the tree it may walk (tmp_path is root's, 0700)
    shared = Path(tempfile.mkdtemp(prefix="rapl-"))
    try:
        shared.chmod(0o755)
        tree = shutil.copytree(powercap, shared / "powercap")
        (tree / "intel-rapl:0" / "energy_uj").chmod(0)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only file reads and a pipe write, then _exit (no pytest teardown)
            said = "opened"
            try:
                os.setgroups([])
                os.setgid(UNPRIVILEGED)
                os.setuid(UNPRIVILEGED)
                RaplEnergy(tree)
            except SourceUnavailable as exc:
                said = str(exc)
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails on it
                said = f"error: {exc!r}"
            os.write(write_end, said.encode()[:4000])
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            said = pipe.read()
        os.waitpid(pid, 0)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert "root only" in said, said


# ----------------------------------------------------------------------------------------- npu-smi

# Recorded `npu-smi info -t power -i 0` output of an Atlas A2 board (IT21HMDC_Bin5, npu-smi 25.5.1), from the
# test fixtures of the npu_smi input of yunionio/telegraf (plugins/inputs/npu_smi/npu_smi_test.go).
NPU_SMI_POWER_A2 = """
        NPU ID                         : 0
        Chip Count                     : 1

        NPU Real-time Power(W)         : 103.5
        Chip ID                        : 0
"""

# A board whose MCU answers (Ascend 310 cards), in the npu-smi sources' own format ("\t%-30s : %.1f\n").
NPU_SMI_POWER_MCU = "\tNPU ID                         : 4\n\tPower Dissipation(W)           : 12.8\n"

# Recorded `npu-smi info -m` outputs, from gpustack (gpustack/detectors/npu_smi/npu_smi.py docstrings).
NPU_SMI_MAP_910 = """
NPU ID                         Chip ID                        Chip Logic ID                  Chip Name
0                              0                              0                              Ascend xxx
1                              0                              1                              Ascend xxx
2                              0                              2                              Ascend xxx
3                              0                              3                              Ascend xxx
"""
NPU_SMI_MAP_310P = """
NPU ID                         Chip ID                        Chip Logic ID                  Chip Name
4                              0                              0                              Ascend xxx
4                              1                              -                              Mcu
"""


def test_npu_smi_power_parser_on_recorded_output():
    p = parse_npu_smi_power(NPU_SMI_POWER_A2)
    assert (p.watts, p.label, p.npu_id, p.chip_id) == (103.5, "NPU Real-time Power(W)", 0, 0)
    q = parse_npu_smi_power(NPU_SMI_POWER_MCU)
    assert (q.watts, q.label, q.npu_id, q.chip_id) == (12.8, "Power Dissipation(W)", 4, None)


def test_npu_smi_parser_refuses_what_is_not_a_measured_power():
    with pytest.raises(ValueError, match="'NA'"):
        parse_npu_smi_power(NPU_SMI_POWER_A2.replace("103.5", "NA"))
    with pytest.raises(ValueError, match="a rating"):
        parse_npu_smi_power("\tRated Power Dissipation(W)     : 8.0\n")
    with pytest.raises(ValueError, match="no power line"):
        parse_npu_smi_power("Error parameter of -t\n")


def test_npu_smi_mapping_parser_on_recorded_output():
    assert parse_npu_smi_mapping(NPU_SMI_MAP_910) == {0: (0, 0), 1: (1, 0), 2: (2, 0), 3: (3, 0)}
    assert parse_npu_smi_mapping(NPU_SMI_MAP_310P) == {0: (4, 0)}  # the MCU row has no logic id


def test_npu_smi_source_samples_and_integrates_the_tool_output(tmp_path):
    """npu-smi is Huawei's tool, not ours: a stand-in executable replays its recorded output."""
    (tmp_path / "power.txt").write_text(NPU_SMI_POWER_A2)
    (tmp_path / "map.txt").write_text(NPU_SMI_MAP_910)
    tool = tmp_path / "npu-smi"
    tool.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = "-m" ]; then cat {tmp_path}/map.txt; exit 0; fi\n'
        f'if [ "$3" = "power" ] && [ "$5" = "2" ] && [ "$7" = "0" ]; then cat {tmp_path}/power.txt; exit 0; fi\n'
        'echo "Error parameter" >&2; exit 1\n'
    )
    tool.chmod(0o755)
    before = time.monotonic()
    source = NpuSmiPower(
        [0], executable=str(tool), sample_interval_s=0.05, env={"ASCEND_RT_VISIBLE_DEVICES": "2"}
    )
    after = time.monotonic()  # the first sample was taken in between (running the tool: slow under load)
    try:
        time.sleep(0.3)
        now = time.monotonic()
        joules = source.joules(now)["device"]
        d = source.describe("device")
    finally:
        source.close()
    # every sample reads 103.5 W: the integral is 103.5 W x the time since the first sample
    assert 103.5 * (now - after) * 0.999 <= joules <= 103.5 * (now - before) * 1.001
    assert d["npus"] == [
        {
            "npu": 0,
            "npu_id": 2,
            "label": "NPU Real-time Power(W)",
            "command": ["info", "-t", "power", "-i", "2", "-c", "0"],
        }
    ]


def test_npu_job_without_npu_smi_says_why(tmp_path):
    with select_meter("npu", [0], tdp_watts=400, npu_smi=str(tmp_path / "npu-smi")) as meter:
        d = meter.describe()
    (tried,) = [t for t in d["tried"] if t["source"] == "npu-smi"]
    assert "not on PATH" in tried["why"]
    assert d["components"]["device"]["source"] == "estimate"
    assert "fully busy" in d["components"]["device"]["utilisation"]


# ---------------------------------------------------------------------------------- readings, input


def test_readings_of_several_nodes_add_up():
    t = datetime(2026, 1, 1, tzinfo=UTC)
    a = PowerReading(t, {"device": 10.0, "cpu": 2.0, "memory": 1.0})
    b = PowerReading(t + timedelta(seconds=1), {"device": 5.0, "cpu": 1.0})
    total = sum_readings([a, b])
    assert total.joules == {"device": 15.0, "cpu": 3.0, "memory": 1.0}
    assert total.time == b.time and total.total_joules == 19.0
    assert total.to_floats() == [15.0, 3.0, 1.0]


@pytest.mark.parametrize(
    "time_, joules, message",
    [
        (datetime(2026, 1, 1), {"cpu": 1.0}, "timezone-aware"),
        (datetime(2026, 1, 1, tzinfo=UTC), {"gpu": 1.0}, "unknown component"),
        (datetime(2026, 1, 1, tzinfo=UTC), {"cpu": -1.0}, "finite and >= 0"),
        (datetime(2026, 1, 1, tzinfo=UTC), {"cpu": float("nan")}, "finite and >= 0"),
    ],
)
def test_a_reading_refuses_what_is_not_a_cumulative_energy(time_, joules, message):
    with pytest.raises(ValueError, match=message):
        PowerReading(time_, joules)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (("gpu",), {}, "device_kind must be one of cpu|cuda|npu"),
        (("cuda",), {}, "needs the device_indices"),
        (("cuda", [0, 0]), {}, "repeats"),
        (("cuda", [-1]), {}, "integers >= 0"),
        (("cuda", [True]), {}, "integers >= 0"),
        (("cuda", [0]), {"tdp_watts": 0}, "tdp_watts must be a number of watts > 0"),
        (("cpu",), {"cpu_tdp_watts": float("inf")}, "cpu_tdp_watts must be"),
        (("cpu",), {"sample_interval_s": 0}, "sample_interval_s must be > 0"),
    ],
)
def test_select_meter_validates_its_inputs(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_meter(*args, **kwargs)


def test_a_given_cpu_tdp_replaces_the_default_and_says_so(powercap):
    with select_meter("cpu", cpu_tdp_watts=120, rapl_root=powercap / "absent") as meter:
        cpu = meter.describe()["components"]["cpu"]
    assert cpu["tdp_watts"] == 120.0 and cpu["tdp_source"] == "given (the cluster's CPU TDP)"


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # /proc/cpuinfo names -> CodeCarbon's table rows, as CodeCarbon's own matcher pairs them
        ("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", ("Intel Xeon Gold 6248", 150.0)),
        ("AMD EPYC 7763 64-Core Processor", ("AMD EPYC 7763", 280.0)),
        ("Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz", ("Intel Core i7-8700K", 95.0)),
        ("AMD Ryzen 9 5950X 16-Core Processor", ("AMD Ryzen 9 5950X", 105.0)),
        # a VM's generic name fits many rows equally: no guess, the unknown-CPU default instead
        ("Intel(R) Xeon(R) Processor", None),
        ("Kunpeng 920", None),
        ("", None),
    ],
)
def test_a_known_cpu_takes_its_tdp_from_codecarbons_table_and_a_generic_name_none(model, expected):
    found = codecarbon_cpu_tdp(model)
    if expected is None:
        assert found is None
    else:
        tdp, name, version = found
        assert (name, tdp) == expected and version.startswith("3.")
