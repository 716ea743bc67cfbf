"""The host's CPU, memory, swap, NICs and disks, through psutil.

Counters (CPU times, NIC bytes/errors/drops, disk bytes and busy time, swap traffic) become rates between
consecutive samples; the collector reads them once when it is built, so its first sample already has
rates. What this host cannot tell is reported absent with the reason, e.g. the CPU frequency on a machine
without a cpufreq driver (most VMs: ``/proc/cpuinfo``'s "cpu MHz" is then a static figure, not a
measurement, and psutil would return it all the same).

The metrics are listed in :data:`METRICS` (``<scope>.<device>.<metric>``, see
:mod:`workers.reliability.telemetry`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

from workers.reliability.telemetry.base import Collector, CounterRates, Reading

METRICS = (
    "cpu.util_pct",
    "cpu.iowait_pct",
    "cpu.steal_pct",
    "cpu.load1",
    "cpu.load5",
    "cpu.load15",
    "cpu.freq_MHz",
    "cpu.freq_of_max_pct",
    "mem.total_GiB",
    "mem.available_GiB",
    "mem.used_pct",
    "swap.total_GiB",
    "swap.used_GiB",
    "swap.used_pct",
    "swap.in_Bps",
    "swap.out_Bps",
    "net.{nic}.rx_Bps",
    "net.{nic}.tx_Bps",
    "net.{nic}.rx_errs_per_s",
    "net.{nic}.tx_errs_per_s",
    "net.{nic}.rx_drop_per_s",
    "net.{nic}.tx_drop_per_s",
    "disk.{disk}.read_Bps",
    "disk.{disk}.write_Bps",
    "disk.{disk}.busy_pct",
    "fs.{label}.used_pct",
    "fs.{label}.free_GiB",
)
"""Every metric this collector reports (``{nic}``, ``{disk}``, ``{label}``: the device)."""
GIB = float(1 << 30)
SYS_CPU = Path("/sys/devices/system/cpu")
SYS_BLOCK = Path("/sys/block")
MIN_CPU_WINDOW_S = 0.1
"""The shortest window a CPU utilisation is measured over (ten clock ticks of 10 ms)."""
# block devices that are not disks a job reads or writes through (loop mounts, RAM disks, optical drives)
_NOT_DISKS = ("loop", "ram", "zram", "sr", "fd")
# NIC counters: psutil's snetio field -> our metric
_NIC_COUNTERS = {
    "bytes_recv": "rx_Bps",
    "bytes_sent": "tx_Bps",
    "errin": "rx_errs_per_s",
    "errout": "tx_errs_per_s",
    "dropin": "rx_drop_per_s",
    "dropout": "tx_drop_per_s",
}


def cpufreq_present(sys_cpu: Path = SYS_CPU) -> bool:
    """Whether the kernel exposes a cpufreq driver (``/sys/devices/system/cpu/cpufreq/policy*`` or
    ``cpu*/cpufreq``), the only source of a measured CPU frequency."""
    return any((sys_cpu / "cpufreq").glob("policy*")) or any(sys_cpu.glob("cpu[0-9]*/cpufreq"))


def whole_disks(sys_block: Path = SYS_BLOCK) -> set[str] | None:
    """The whole block devices (``/sys/block`` lists no partitions), without loop/RAM/optical devices;
    None where ``/sys/block`` cannot be read."""
    try:
        names = {p.name for p in sys_block.iterdir()}
    except OSError:
        return None
    return {n for n in names if not n.startswith(_NOT_DISKS)}


class PsutilCollector(Collector):
    """CPU load and utilisation, frequency, memory, swap, NIC error and drop counters, disks.

    ``skip_nics``: interfaces left out (default: the loopback). ``filesystems``: label -> path whose file
    system's usage is reported (default ``{"root": "/"}``; add the checkpoint directory)."""

    name = "psutil"

    def __init__(
        self,
        *,
        skip_nics: tuple[str, ...] = ("lo",),
        filesystems: Mapping[str, str] | None = None,
        sys_cpu: Path = SYS_CPU,
        sys_block: Path = SYS_BLOCK,
    ):
        self.skip_nics = tuple(skip_nics)
        self.filesystems = dict(filesystems) if filesystems is not None else {"root": "/"}
        self.has_cpufreq = cpufreq_present(sys_cpu)
        self.disks = whole_disks(sys_block)
        self._rates = CounterRates()
        self._cpu_last = psutil.cpu_times()
        self._cpu_at = time.monotonic()
        self._prime(self._cpu_at)

    def available(self) -> tuple[bool, str]:
        return True, f"psutil {psutil.__version__}"

    # ------------------------------------------------------------------------------------------ counters

    def _counters(self) -> dict[str, float]:
        counters: dict[str, float] = {}
        for nic, c in psutil.net_io_counters(pernic=True, nowrap=True).items():
            if nic in self.skip_nics:
                continue
            for attr, metric in _NIC_COUNTERS.items():
                counters[f"net.{nic}.{metric}"] = float(getattr(c, attr))
        disks = psutil.disk_io_counters(perdisk=True, nowrap=True) or {}
        for dev, c in disks.items():
            if self.disks is not None and dev not in self.disks:
                continue
            counters[f"disk.{dev}.read_Bps"] = float(c.read_bytes)
            counters[f"disk.{dev}.write_Bps"] = float(c.write_bytes)
            busy_ms = getattr(c, "busy_time", None)  # Linux: ms the device had I/O in flight
            if busy_ms is not None:
                counters[f"disk.{dev}.busy_pct"] = float(busy_ms) / 1000.0 * 100.0
        swap = psutil.swap_memory()
        counters["swap.in_Bps"] = float(swap.sin)
        counters["swap.out_Bps"] = float(swap.sout)
        return counters

    def _prime(self, t: float) -> None:
        for name, value in self._counters().items():
            self._rates.prime(name, t, value)

    # ------------------------------------------------------------------------------------------- sample

    def sample(self) -> Reading:
        r = Reading()
        now = time.monotonic()
        self._cpu(r)
        self._memory(r)
        counters = self._counters()
        for name, value in counters.items():
            rate = self._rates.rate(name, now, value)
            r.put(name, rate, why_absent="first reading of this counter: a rate needs two")
        if not any(k.startswith("net.") for k in counters):
            r.absent["net"] = f"no network interface besides {', '.join(self.skip_nics) or 'none'}"
        if not any(k.startswith("disk.") for k in counters):
            r.absent["disk"] = (
                "psutil reports no disk I/O counters here (no /proc/diskstats, e.g. some containers)"
                if self.disks is None or self.disks
                else "no whole disk in /sys/block (only loop/RAM devices)"
            )
        for label, path in self.filesystems.items():
            try:
                usage = psutil.disk_usage(path)
            except OSError as exc:
                r.absent[f"fs.{label}"] = f"cannot stat {path}: {exc}"
                continue
            r.put(f"fs.{label}.used_pct", usage.percent)
            r.put(f"fs.{label}.free_GiB", usage.free / GIB)
        return r

    def _cpu(self, r: Reading) -> None:
        # a sampler samples once at start, right after building its collectors: a window of a few ms
        # holds no clock tick (10 ms), so the first utilisation is measured over at least MIN_CPU_WINDOW_S
        # (a sleep on the sampler's own thread, once)
        waited = time.monotonic() - self._cpu_at
        if waited < MIN_CPU_WINDOW_S:
            time.sleep(MIN_CPU_WINDOW_S - waited)
        times = psutil.cpu_times()
        self._cpu_at = time.monotonic()
        last, self._cpu_last = self._cpu_last, times
        deltas = {f: max(0.0, getattr(times, f) - getattr(last, f)) for f in times._fields}
        # guest time is already inside user/nice on Linux (psutil's cpu_percent leaves it out too)
        total = sum(v for f, v in deltas.items() if f not in ("guest", "guest_nice"))
        if total > 0:
            idle = deltas.get("idle", 0.0) + deltas.get("iowait", 0.0)
            r.put("cpu.util_pct", 100.0 * (total - idle) / total)
            for f in ("iowait", "steal"):
                if f in deltas:
                    r.put(f"cpu.{f}_pct", 100.0 * deltas[f] / total)
                else:
                    r.absent[f"cpu.{f}_pct"] = f"this OS reports no {f} CPU time"
        else:
            r.absent["cpu.util_pct"] = "no CPU time passed since the last sample"
        try:
            for n, v in zip((1, 5, 15), psutil.getloadavg(), strict=True):
                r.put(f"cpu.load{n}", v)
        except (OSError, AttributeError) as exc:
            r.absent["cpu.load1"] = f"no load average here: {exc}"
        r.info["cpu.logical_count"] = psutil.cpu_count(logical=True) or os.cpu_count()
        if not self.has_cpufreq:
            why = (
                "no cpufreq driver in /sys/devices/system/cpu (usual in VMs): the only figure left is "
                "/proc/cpuinfo's static 'cpu MHz', not a measurement"
            )
            r.absent["cpu.freq_MHz"] = why
            r.absent["cpu.freq_of_max_pct"] = why
            return
        freq = psutil.cpu_freq()
        if freq is None:
            r.absent["cpu.freq_MHz"] = "psutil.cpu_freq() returned nothing although cpufreq is present"
            return
        r.put("cpu.freq_MHz", freq.current)
        if freq.max and freq.max > 0:
            r.put("cpu.freq_of_max_pct", 100.0 * freq.current / freq.max)
        else:
            r.absent["cpu.freq_of_max_pct"] = "cpufreq reports no maximum frequency"

    def _memory(self, r: Reading) -> None:
        vm = psutil.virtual_memory()
        r.put("mem.total_GiB", vm.total / GIB)
        r.put("mem.available_GiB", vm.available / GIB)
        r.put("mem.used_pct", vm.percent)
        swap = psutil.swap_memory()
        r.put("swap.total_GiB", swap.total / GIB)
        r.put("swap.used_GiB", swap.used / GIB)
        if swap.total > 0:
            r.put("swap.used_pct", swap.percent)
        else:
            r.absent["swap.used_pct"] = "no swap configured on this host"
