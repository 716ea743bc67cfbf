"""Per-rank system figures: every rank's memory and CPU use, gathered to rank 0 every few steps.

Every rank calls :func:`rank_values` once after each step (it is a collective on the sampling steps, so
all ranks must call it at the same steps: the step counter decides, never a clock). On every
``RANK_METRICS_EVERY``-th step the ranks all-gather four floats; rank 0 gets::

    {"ranks": [{"rank": 0, "rss_GiB": 0.61, "cpu_pct": 97.5, "mem_peak_GiB": 0.64}, ...]}

to put into that step's ``train`` event, and ``{}`` otherwise (other ranks, other steps).

- ``rss_GiB``: the process's resident memory now (``psutil``).
- ``cpu_pct``: the process's CPU time over the wall time since its previous sample, in percent of one
  core (``top``'s convention: 200 means two cores busy). The first sample of a process covers the steps
  since its first call, not the model set-up before it (none when that is under 10 ms).
- ``mem_peak_GiB``: the peak memory of the device the rank trains on (``device.max_memory_GiB``: reserved
  device memory on cuda/npu, peak RSS on cpu).
"""

from __future__ import annotations

import math
import time

import psutil
import torch
import torch.distributed as dist

from workers.devices import backend as device_mod
from workers.training.supervision.step_times import blocking_wait

RANK_METRICS_EVERY = 5
"""Steps between two gathers (a gather is one all_gather of 4 floats per rank)."""

FIELDS = ("rank", "rss_GiB", "cpu_pct", "mem_peak_GiB")


class _CpuClock:
    """Process CPU time against wall time since the previous reading."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.cpu, self.wall = self._now()

    def _now(self) -> tuple[float, float]:
        t = self.process.cpu_times()
        return t.user + t.system, time.monotonic()

    def percent(self) -> float:
        """NaN when less than 10 ms passed (the CPU-time tick): too short to say."""
        cpu, wall = self._now()
        pct = 100.0 * (cpu - self.cpu) / (wall - self.wall) if wall - self.wall >= 0.01 else math.nan
        self.cpu, self.wall = cpu, wall
        return pct


_clock: _CpuClock | None = None


def local_sample(device: torch.device) -> list[float]:
    """This rank's ``[rank, rss_GiB, cpu_pct, mem_peak_GiB]``."""
    global _clock
    if _clock is None:
        _clock = _CpuClock()
    rank = dist.get_rank() if dist.is_initialized() else 0
    rss = psutil.Process().memory_info().rss / 2**30
    return [float(rank), rss, _clock.percent(), device_mod.max_memory_GiB(device.type)]


def gather_rank_metrics(device: torch.device) -> list[dict]:
    """A collective: every rank's sample, in rank order (on every rank)."""
    mine = torch.tensor(local_sample(device), dtype=torch.float32, device=device)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        everyone = [torch.empty_like(mine) for _ in range(world)]
        with blocking_wait.timed():  # the straggler watch's collective wait (step_times)
            dist.all_gather(everyone, mine)
    else:
        everyone = [mine]
    rows = []
    for t in everyone:
        rank, rss, cpu, peak = t.tolist()
        rows.append(
            {
                "rank": int(rank),
                "rss_GiB": round(rss, 4),
                "cpu_pct": None if math.isnan(cpu) else round(cpu, 1),
                "mem_peak_GiB": round(peak, 4),
            }
        )
    return rows


def rank_values(step: int, device: torch.device, *, every: int = RANK_METRICS_EVERY) -> dict:
    """Call on every rank after every step: ``{"ranks": [...]}`` on rank 0 on every ``every``-th step,
    else ``{}``. The first call only starts this process's CPU clock."""
    global _clock
    if _clock is None:
        _clock = _CpuClock()
    if every < 1 or step % every:
        return {}
    rows = gather_rank_metrics(device)
    is_rank0 = not dist.is_initialized() or dist.get_rank() == 0
    return {"ranks": rows} if is_rank0 else {}
