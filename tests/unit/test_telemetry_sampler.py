"""The telemetry sampler: real collectors on a background thread, each sample's measured cost, the callback,
absent sources with reasons, the CPU budget, and the telemetry event the trainer would publish."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time

import pytest

from workers.events import build_event
from workers.reliability.telemetry import (
    Collector,
    JobSignals,
    PsutilCollector,
    Reading,
    TelemetrySampler,
    collectors_for_node,
)
from workers.reliability.telemetry.sampler import MAX_STRETCH


class HashingCollector(Collector):
    """A source whose reading costs a known amount of CPU (it hashes ``mib`` MiB per sample)."""

    name = "hashing"

    def __init__(self, mib: int):
        self.block = b"x" * (1 << 20)
        self.mib = mib

    def available(self) -> tuple[bool, str]:
        return True, "test source"

    def sample(self) -> Reading:
        h = hashlib.sha256()
        for _ in range(self.mib):
            h.update(self.block)
        r = Reading()
        r.put("test.digest_byte", h.digest()[0])
        return r


class BrokenCollector(Collector):
    name = "broken"

    def available(self) -> tuple[bool, str]:
        return True, "present, but its reads fail"

    def sample(self) -> Reading:
        raise OSError("device went away")


def test_the_sampler_calls_back_every_interval_with_measured_cost():
    got: list = []
    arrived = threading.Event()

    def keep(sample):
        got.append(sample)
        if len(got) >= 3:
            arrived.set()

    signals = JobSignals()
    signals.record_step(rank=0, step=1, step_time_s=0.4, collective_wait_s=0.1)
    sampler = TelemetrySampler(
        [PsutilCollector(), signals], callback=keep, interval_s=0.2, node="node-a", max_cpu_fraction=1.0
    )
    sampler.start()
    try:
        assert arrived.wait(10), "no three samples within 10 s"
    finally:
        sampler.stop()
    first, second, third = got[:3]
    assert first.node == "node-a"
    assert first.time_unix_s < second.time_unix_s < third.time_unix_s
    assert 0.15 <= second.time_unix_s - first.time_unix_s < 5
    for s in got:
        assert s.cost["cpu_s"] > 0 and s.cost["wall_s"] > 0
        assert s.cost["psutil.wall_s"] <= s.cost["wall_s"]
        assert s.values["job.rank0.step_time_last_s"] == 0.4
    # the first sample comes right after the collector's first reading: less than a clock tick of CPU time
    # may have passed, which it says rather than dividing by zero
    assert "cpu.util_pct" in first.values or first.absent["cpu.util_pct"].startswith("no CPU time passed")
    assert all("cpu.util_pct" in s.values for s in got[1:])
    d = sampler.describe()
    assert d["samples"] >= 3 and d["mean_cpu_s_per_sample"] > 0
    assert d["sources"]["psutil"]["available"] is True


def test_absent_sources_and_failing_reads_are_reported_not_fatal(tmp_path):
    collectors = collectors_for_node(npu_smi=str(tmp_path / "npu-smi"))
    sampler = TelemetrySampler([*collectors, BrokenCollector()], node="node-b")
    s = sampler.sample_once()
    assert "not on PATH" in s.absent["npu-smi"]
    if not sampler.availability["nvml"][0]:
        assert "NVML" in s.absent["nvml"]
    assert s.absent["broken"] == "sample failed: OSError: device went away"
    assert s.values["mem.total_GiB"] > 0  # the other sources still report


def test_a_costly_source_stretches_the_interval_to_keep_the_cpu_budget():
    sampler = TelemetrySampler([HashingCollector(mib=64)], interval_s=0.5, node="n", max_cpu_fraction=0.01)
    s = sampler.sample_once()
    assert s.cost["hashing.cpu_s"] > 0.01  # hashing 64 MiB takes well over 10 ms of CPU
    # stretched to the budget, at most MAX_STRETCH intervals
    assert s.cost["interval_s"] == pytest.approx(min(s.cost["cpu_s"] / 0.01, MAX_STRETCH * 0.5))
    assert sampler.next_interval_s > 0.5
    cheap = TelemetrySampler([HashingCollector(mib=0)], interval_s=0.5, node="n", max_cpu_fraction=0.01)
    assert cheap.sample_once().cost["interval_s"] == 0.5


class ReapingCollector(Collector):
    """A cheap source during whose read the process reaps a child that burned CPU before it (what a
    Celery worker does when another job's torchrun agent ends while this job's sampler reads)."""

    name = "reaping"

    def __init__(self, child):
        self.child = child

    def available(self) -> tuple[bool, str]:
        return True, "test source"

    def sample(self) -> Reading:
        self.child.wait()
        r = Reading()
        r.put("test.reaped", 1)
        return r


def test_another_processs_cpu_reaped_during_a_sample_does_not_stretch_the_interval():
    import subprocess
    import sys

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # it has burned its CPU and exited (a zombie until reaped)
        try:
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.05)
    sampler = TelemetrySampler([ReapingCollector(child)], interval_s=5.0, node="n", max_cpu_fraction=0.01)
    s = sampler.sample_once()
    # 0.6 s of someone else's CPU counted as this sample's cost would have made the next wait 60 s (the
    # risk watch silenced); counted for at most the read's own wall time, it stays 5 s
    assert s.cost["cpu_s"] < 0.1 and s.cost["interval_s"] == 5.0, s.cost


def test_a_failing_callback_is_counted_and_sampling_goes_on():
    calls = []

    def flaky(sample):
        calls.append(sample)
        raise RuntimeError("redis is down")

    sampler = TelemetrySampler([HashingCollector(mib=0)], callback=flaky, interval_s=0.05, node="n")
    sampler.start()
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    assert len(calls) >= 3
    assert sampler.errors >= 3 and "redis is down" in sampler.last_error


def test_a_sample_is_a_valid_telemetry_event():
    sampler = TelemetrySampler(collectors_for_node(), node="node-c")
    values = sampler.sample_once().to_event_values()
    event = json.loads(build_event("job/7", "telemetry", None, values))  # refuses NaN, checks the kind
    assert event["kind"] == "telemetry"
    body = event["values"]
    assert body["node"] == "node-c" and body["sampled_at"].endswith("Z")
    assert body["metrics"]["mem.total_GiB"] > 0
    assert body["cost"]["cpu_s"] > 0
    assert "npu-smi" in body["absent"] or shutil.which("npu-smi")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler([], interval_s=0, node="n")
    with pytest.raises(ValueError, match="max_cpu_fraction"):
        TelemetrySampler([], max_cpu_fraction=0, node="n")
    with pytest.raises(ValueError, match="share a name"):
        TelemetrySampler([HashingCollector(0), HashingCollector(0)], node="n")
