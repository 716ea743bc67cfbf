"""The psutil collector on this machine: real values, non-negative rates, absent metrics with reasons."""

from __future__ import annotations

import os
import re
import time

import psutil
import pytest

from workers.reliability.telemetry import split_metric
from workers.reliability.telemetry.base import CounterRates, counter_increase
from workers.reliability.telemetry.host import METRICS, PsutilCollector, cpufreq_present, whole_disks

RATE_SUFFIXES = ("_Bps", "_per_s")


def template_of(name: str) -> str:
    """``net.eth0.rx_Bps`` -> ``net.{}.rx_Bps`` (METRICS entries normalised the same way)."""
    scope, device, metric = split_metric(name)
    return f"{scope}.{{}}.{metric}" if device is not None else name


def normalised(templates) -> set[str]:
    return {re.sub(r"\{[a-z]+\}", "{}", t) for t in templates}


def burn_cpu(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def test_a_sample_reports_this_machines_cpu_memory_nics_and_disks():
    collector = PsutilCollector()
    burn_cpu(0.3)  # one core busy between the collector's first reading and the sample
    r = collector.sample()
    ncpu = psutil.cpu_count() or 1
    assert 100.0 / ncpu * 0.5 <= r.values["cpu.util_pct"] <= 100.0
    for name in ("cpu.iowait_pct", "cpu.steal_pct"):
        assert 0.0 <= r.values[name] <= 100.0
    assert r.values["cpu.load1"] == pytest.approx(os.getloadavg()[0], abs=2.0)
    vm = psutil.virtual_memory()
    assert r.values["mem.total_GiB"] == pytest.approx(vm.total / 2**30)
    assert 0 < r.values["mem.available_GiB"] <= r.values["mem.total_GiB"]
    nics = {n for n in psutil.net_io_counters(pernic=True) if n != "lo"}
    seen = {split_metric(k)[1] for k in r.values if k.startswith("net.")}
    assert seen == nics
    assert not any(k.startswith("net.lo.") for k in r.values)
    assert 0 <= r.values["fs.root.used_pct"] <= 100
    # every name is one the collector declares, and nothing is both measured and absent
    assert {template_of(k) for k in r.values} <= normalised(METRICS)
    assert not set(r.values) & set(r.absent)


def test_rates_are_non_negative_and_cover_real_disk_writes(tmp_path):
    collector = PsutilCollector()
    payload = os.urandom(1 << 20)
    with (tmp_path / "blob").open("wb") as fh:
        for _ in range(16):  # 16 MiB, synced, so that it reaches the device
            fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    t0 = time.monotonic()
    time.sleep(0.05)
    r = collector.sample()
    rates = {k: v for k, v in r.values.items() if k.endswith(RATE_SUFFIXES) or k.endswith(".busy_pct")}
    assert rates and all(v >= 0 for v in rates.values())
    writes = {k: v for k, v in r.values.items() if k.endswith(".write_Bps")}
    if not writes:
        pytest.skip(f"no disk I/O counters here: {r.absent.get('disk')}")
    if _fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("the temporary directory is in memory: the write never reaches a disk")
    # the rate covers the time since the collector was built (>= t0 - build time): at least 16 MiB written
    elapsed = time.monotonic() - t0 + 1.0
    assert sum(writes.values()) * elapsed >= 8 * (1 << 20)


def _fs_type(path) -> str:
    best = ("", "")
    for part in psutil.disk_partitions(all=True):
        if str(path).startswith(part.mountpoint) and len(part.mountpoint) > len(best[0]):
            best = (part.mountpoint, part.fstype)
    return best[1]


def test_cpu_frequency_is_absent_with_the_reason_where_there_is_no_cpufreq():
    r = PsutilCollector().sample()
    if cpufreq_present():
        assert r.values["cpu.freq_MHz"] > 0
    else:
        assert "cpu.freq_MHz" not in r.values
        assert "no cpufreq driver" in r.absent["cpu.freq_MHz"]


def test_swap_share_is_absent_without_swap():
    r = PsutilCollector().sample()
    if psutil.swap_memory().total == 0:
        assert r.values["swap.total_GiB"] == 0.0
        assert r.absent["swap.used_pct"] == "no swap configured on this host"
    else:
        assert 0 <= r.values["swap.used_pct"] <= 100


def test_cpufreq_and_disk_detection_read_the_sys_tree(tmp_path):
    cpu = tmp_path / "cpu"
    (cpu / "cpu0").mkdir(parents=True)
    assert not cpufreq_present(cpu)
    (cpu / "cpufreq" / "policy0").mkdir(parents=True)
    assert cpufreq_present(cpu)
    block = tmp_path / "block"
    for name in ("sda", "nvme0n1", "loop0", "ram0", "zram0", "sr0"):
        (block / name).mkdir(parents=True)
    assert whole_disks(block) == {"sda", "nvme0n1"}
    assert whole_disks(tmp_path / "missing") is None


def test_an_unreadable_filesystem_is_absent_with_the_reason(tmp_path):
    r = PsutilCollector(filesystems={"ckpt": str(tmp_path / "not-there")}).sample()
    assert "fs.ckpt.used_pct" not in r.values
    assert "cannot stat" in r.absent["fs.ckpt"]


def test_a_reset_counter_counts_again_from_zero():
    assert counter_increase(100, 130) == 30
    assert counter_increase(100, 7) == 7  # reset: the new value is the increase, never negative
    rates = CounterRates()
    assert rates.rate("x", 10.0, 5) is None
    assert rates.rate("x", 12.0, 9) == 2.0
    assert rates.rate("x", 14.0, 1) == 0.5
    assert rates.rate("x", 14.0, 3) is None  # no time passed
