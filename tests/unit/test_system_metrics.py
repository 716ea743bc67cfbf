"""Per-rank system figures (workers/training/system_metrics.py) in one process: a sample every N steps,
this process's real memory and CPU use. The two-rank gather is tests/integration/test_rank_metrics.py."""

from __future__ import annotations

import time

import psutil
import torch

from workers.training import system_metrics


def test_figures_come_every_nth_step_and_describe_this_process(monkeypatch):
    monkeypatch.setattr(system_metrics, "_clock", None)
    cpu = torch.device("cpu")
    out = {}
    for step in range(1, 11):
        deadline = time.perf_counter() + 0.05
        while time.perf_counter() < deadline:  # a step's worth of work on this thread
            pass
        out[step] = system_metrics.rank_values(step, cpu, every=5)
    assert [s for s, v in out.items() if v] == [5, 10]
    (rank0,) = out[10]["ranks"]
    assert rank0["rank"] == 0
    rss = psutil.Process().memory_info().rss / 2**30
    assert abs(rank0["rss_GiB"] - rss) < 0.25 * rss
    assert rank0["mem_peak_GiB"] >= rank0["rss_GiB"] * 0.99  # peak RSS on cpu: never below the RSS now
    assert 5 < rank0["cpu_pct"] < 100 * (psutil.cpu_count() or 1) + 20  # busy between two samples


def test_a_sample_right_at_the_first_call_has_no_cpu_figure(monkeypatch):
    monkeypatch.setattr(system_metrics, "_clock", None)
    (rank0,) = system_metrics.rank_values(5, torch.device("cpu"), every=5)["ranks"]
    assert rank0["cpu_pct"] is None and rank0["rss_GiB"] > 0
