"""One node's telemetry loop: the available collectors sampled every few seconds on a background thread,
each sample handed to a callback (the trainer publishes it as a ``telemetry`` event), at a bounded cost.

Cost: every sample measures what it cost, ``cpu_s`` (this thread's CPU time plus that of the child
processes it ran, e.g. ``npu-smi``) and ``wall_s``, in total and per collector. The loop keeps its CPU share
under ``max_cpu_fraction`` of one core (default 1%, the budget issue 14 sets for telemetry against step
time): when a sample costs more than ``max_cpu_fraction x interval_s``, the next wait is stretched to
``cpu_s / max_cpu_fraction``, and the stretched interval is reported (``cost.interval_s``), never beyond
:data:`MAX_STRETCH` intervals.

The children's CPU time is ``RUSAGE_CHILDREN``, the process's: in a Celery worker that supervises several jobs
it also grows when another job's torchrun agent is reaped, by everything that tree ran. So a collector's
children are counted for at most its own wall time (a tool it waits for cannot use more of one core), else
one sample that coincided with another job's end (80 s of rank CPU) stretched the next wait to hours: a job's
risk watch published its first sample and then nothing (CI, twice: one risk event in 60 s; in the other run
the next came 127 s later).

    sampler = TelemetrySampler(collectors_for_node(job=signals), interval_s=5.0,
                               callback=lambda s: publisher.submit("telemetry", s.to_event_values()))
    sampler.start() ... sampler.stop()
"""

from __future__ import annotations

import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from workers.reliability.telemetry.base import Collector, Reading, TelemetrySample
from workers.reliability.telemetry.host import PsutilCollector
from workers.reliability.telemetry.npu_smi import NpuSmiCollector
from workers.reliability.telemetry.nvml import NvmlCollector

DEFAULT_INTERVAL_S = 5.0
DEFAULT_MAX_CPU_FRACTION = 0.01


def node_name() -> str:
    """This node's name as the job's workers know it (``CANN_TRAIN_NODE`` or the host name)."""
    from workers.training.supervision.supervisor import node_name as supervisor_node_name

    return supervisor_node_name()


def collectors_for_node(
    *,
    job: Collector | None = None,
    filesystems: Mapping[str, str] | None = None,
    npu_smi: str = "npu-smi",
    gpu_indices: list[int] | None = None,
) -> list[Collector]:
    """Every source this project knows, for this node: psutil, NVML, npu-smi, and the job's signals when
    given. Sources absent here stay in the list and say why in each sample's ``absent``."""
    collectors: list[Collector] = [
        PsutilCollector(filesystems=filesystems),
        NvmlCollector(gpu_indices),
        NpuSmiCollector(executable=npu_smi),
    ]
    if job is not None:
        collectors.append(job)
    return collectors


MAX_STRETCH = 6
"""The most intervals the CPU budget stretches one wait to (30 s at the default 5 s): a mismeasured cost must
not silence the telemetry and the risk watch that reads it."""


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class TelemetrySampler:
    """Samples ``collectors`` every ``interval_s`` seconds (stretched to respect ``max_cpu_fraction``) and
    calls ``callback(sample)`` with each :class:`TelemetrySample`."""

    def __init__(
        self,
        collectors: Iterable[Collector],
        *,
        callback: Callable[[TelemetrySample], None] | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        node: str | None = None,
        max_cpu_fraction: float = DEFAULT_MAX_CPU_FRACTION,
    ):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if not 0 < max_cpu_fraction <= 1:
            raise ValueError(f"max_cpu_fraction must be in (0, 1], got {max_cpu_fraction!r}")
        self.collectors = list(collectors)
        names = [c.name for c in self.collectors]
        if len(set(names)) != len(names):
            raise ValueError(f"two collectors share a name: {names}")
        self.callback = callback
        self.interval_s = float(interval_s)
        self.max_cpu_fraction = float(max_cpu_fraction)
        self.node = node or node_name()
        self.availability: dict[str, tuple[bool, str]] = {}
        for c in self.collectors:
            try:
                self.availability[c.name] = c.available()
            except Exception as exc:  # a source that cannot even say whether it is there is absent
                self.availability[c.name] = (False, f"{type(exc).__name__}: {exc}")
        self.samples = 0
        self.errors = 0
        self.last_error = ""
        self.cpu_s_total = 0.0
        self.wall_s_total = 0.0
        self.next_interval_s = self.interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> list[str]:
        return [name for name, (ok, _) in self.availability.items() if ok]

    def describe(self) -> dict:
        """Which sources feed this node's telemetry, which are absent and why, and what it costs so far."""
        return {
            "node": self.node,
            "interval_s": self.interval_s,
            "max_cpu_fraction": self.max_cpu_fraction,
            "sources": {
                n: {"available": ok, "how" if ok else "why": why}
                for n, (ok, why) in self.availability.items()
            },
            "samples": self.samples,
            "errors": self.errors,
            "mean_cpu_s_per_sample": self.cpu_s_total / self.samples if self.samples else None,
            "mean_wall_s_per_sample": self.wall_s_total / self.samples if self.samples else None,
        }

    def sample_once(self) -> TelemetrySample:
        """Read every available collector now (on the calling thread) and return the merged sample."""
        t0_wall, t0_cpu = time.perf_counter(), time.thread_time()
        children_total = 0.0
        when = time.time()
        merged = Reading()
        cost: dict[str, float] = {}
        for c in self.collectors:
            ok, why = self.availability[c.name]
            if not ok:
                merged.absent[c.name] = why
                continue
            c_wall, c_cpu, c_children = time.perf_counter(), time.thread_time(), _children_cpu_s()
            try:
                merged.merge(c.sample())
            except Exception as exc:  # one failing source must not stop the others
                merged.absent[c.name] = f"sample failed: {type(exc).__name__}: {exc}"
            wall = time.perf_counter() - c_wall
            children = min(max(0.0, _children_cpu_s() - c_children), wall)  # not another job's (above)
            children_total += children
            cost[f"{c.name}.cpu_s"] = time.thread_time() - c_cpu + children
            cost[f"{c.name}.wall_s"] = wall
        cost["cpu_s"] = time.thread_time() - t0_cpu + children_total
        cost["wall_s"] = time.perf_counter() - t0_wall
        self.samples += 1
        self.cpu_s_total += cost["cpu_s"]
        self.wall_s_total += cost["wall_s"]
        self.next_interval_s = min(
            max(self.interval_s, cost["cpu_s"] / self.max_cpu_fraction), MAX_STRETCH * self.interval_s
        )
        cost["interval_s"] = self.next_interval_s
        return TelemetrySample(
            node=self.node,
            time_unix_s=when,
            values=merged.values,
            absent=merged.absent,
            info=merged.info,
            cost=cost,
        )

    def _deliver(self, sample: TelemetrySample) -> None:
        if self.callback is None:
            return
        try:
            self.callback(sample)
        except Exception as exc:  # the consumer's failure is counted; telemetry goes on
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            if self.errors == 1:
                print(f"cann-train: telemetry callback failed ({self.last_error})", file=sys.stderr)

    def _run(self) -> None:
        while True:
            self._deliver(self.sample_once())
            if self._stop.wait(self.next_interval_s):
                return

    def start(self) -> TelemetrySampler:
        """Sample now and then every interval on a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("the sampler is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="telemetry-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop (after the sample in progress) and close the collectors."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for c in self.collectors:
            try:
                c.close()
            except Exception:  # closing is best effort: the process may be exiting
                pass

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
