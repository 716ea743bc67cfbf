"""The power meter of a job's node: :func:`select_meter` picks the best source present for each component
(``device``, ``cpu``, ``memory``), and the :class:`PowerMeter` reads them together and says which source
feeds each component, whether it is measured, and what was tried and why it was not used."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workers.devices.rapl import RAPL_ROOT
from workers.green.power.estimates import CpuEstimate, DeviceEstimate, MemoryEstimate, ProcessTree
from workers.green.power.measured import NpuSmiPower, NvmlEnergy, RaplEnergy
from workers.green.power.readings import COMPONENTS, DEVICE_KINDS, PowerReading
from workers.green.power.sources import NoSource, PowerSource, SourceUnavailable


@dataclass
class PowerMeter:
    """Cumulative energy per component from the sources :func:`select_meter` chose."""

    device_kind: str
    sources: dict[str, PowerSource]
    """Component -> the source feeding it (one source may feed several, e.g. RAPL cpu and memory)."""
    tried: list[dict[str, str]] = field(default_factory=list)
    """Every source tried and not used: ``{"source", "component", "why"}``."""

    def __post_init__(self) -> None:
        if set(self.sources) != set(COMPONENTS):
            raise ValueError(f"a meter needs a source for each of {', '.join(COMPONENTS)}")
        self.started = datetime.now(UTC)
        self.read_seconds = 0.0
        """Time spent in :meth:`read` so far (its cost on the training thread)."""
        self.reads = 0

    def _unique_sources(self) -> list[PowerSource]:
        seen: dict[int, PowerSource] = {}
        for s in self.sources.values():
            seen.setdefault(id(s), s)
        return list(seen.values())

    def read(self) -> PowerReading:
        """Cumulative joules per component since the meter started, now."""
        t0 = time.perf_counter()
        now = time.monotonic()
        wall = datetime.now(UTC)
        values: dict[str, float] = {}
        for source in self._unique_sources():
            got = source.joules(now)
            for component in source.components:
                if self.sources[component] is source:
                    values[component] = got[component]
        reading = PowerReading(wall, values)
        self.read_seconds += time.perf_counter() - t0
        self.reads += 1
        return reading

    @property
    def method(self) -> str:
        """``nvml`` | ``npu-smi`` when a meter reads the devices, else ``rapl`` when RAPL reads the CPU,
        else ``estimate``."""
        device = self.sources["device"]
        if device.measured:
            return device.name
        if self.sources["cpu"].measured:
            return self.sources["cpu"].name
        return "estimate"

    @property
    def estimated(self) -> list[str]:
        """Components whose energy is estimated, not measured."""
        return [c for c in COMPONENTS if self.sources[c].name == "estimate"]

    @property
    def missing(self) -> list[str]:
        """Components that should draw energy but that nothing meters or estimates (counted as zero)."""
        return [c for c in COMPONENTS if isinstance(self.sources[c], NoSource) and self.sources[c].missing]

    @property
    def label(self) -> str:
        """One line for pages and reports: what is measured, what is estimated, what is missing."""
        measured = [c for c in COMPONENTS if self.sources[c].measured]
        parts = []
        if measured:
            by: dict[str, list[str]] = {}
            for c in measured:
                by.setdefault(self.sources[c].name, []).append(c)
            parts.append("measured: " + ", ".join(f"{', '.join(cs)} ({src})" for src, cs in by.items()))
        if self.estimated:
            parts.append(f"estimate: {', '.join(self.estimated)} (CodeCarbon-style, not measured)")
        if self.missing:
            parts.append(f"not counted: {', '.join(self.missing)}")
        return "; ".join(parts)

    def describe(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "measured": not self.estimated and not self.missing,
            "estimated": self.estimated,
            "missing": self.missing,
            "label": self.label,
            "device_kind": self.device_kind,
            "components": {c: self.sources[c].describe(c) for c in COMPONENTS},
            "tried": list(self.tried),
            "started": self.started.isoformat(),
        }

    def close(self) -> None:
        for source in self._unique_sources():
            source.close()

    def __enter__(self) -> PowerMeter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def select_meter(
    device_kind: str,
    device_indices: Sequence[int] = (),
    *,
    tdp_watts: float | None = None,
    cpu_tdp_watts: float | None = None,
    root_pid: int | None = None,
    rapl_root: str | Path = RAPL_ROOT,
    npu_smi: str = "npu-smi",
    utilisation: Callable[[], float] | None = None,
    sample_interval_s: float | None = None,
    env: dict[str, str] | None = None,
) -> PowerMeter:
    """The best power meter for a job's node: ``device_kind`` (``cpu|cuda|npu``), the node's devices the
    job uses (``device_indices``: ordinals as this process sees them), the device's ``tdp_watts`` (for an
    estimate when no meter reads the devices), the CPU's TDP if known (else CodeCarbon's default), the pid
    whose process tree the CPU/memory estimates cover (default: this process; under torchrun, local rank 0
    passes ``os.getppid()``, the agent, so that every local rank counts), ``utilisation`` (a callable giving
    the devices' busy fraction for the estimate)."""
    kind = str(device_kind).strip().lower()
    if kind not in DEVICE_KINDS:
        raise ValueError(f"device_kind must be one of {'|'.join(DEVICE_KINDS)}, got {device_kind!r}")
    indices = list(device_indices)
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in indices):
        raise ValueError(f"device_indices must be device ordinals (integers >= 0), got {device_indices!r}")
    if len(set(indices)) != len(indices):
        raise ValueError(f"device_indices has repeats: {device_indices!r}")
    if kind != "cpu" and not indices:
        raise ValueError(f"a {kind} job needs the device_indices this node's meter should read (e.g. [0, 1])")
    for name, value in (("tdp_watts", tdp_watts), ("cpu_tdp_watts", cpu_tdp_watts)):
        if value is not None and (isinstance(value, bool) or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name} must be a number of watts > 0, got {value!r}")
    if sample_interval_s is not None and not sample_interval_s > 0:
        raise ValueError(f"sample_interval_s must be > 0, got {sample_interval_s!r}")

    tried: list[dict[str, str]] = []
    sources: dict[str, PowerSource] = {}

    # device: NVML / npu-smi, else an estimate from the TDP, else nothing (said so)
    if kind == "cpu":
        sources["device"] = NoSource(
            "device", "the job trains on the CPU: its compute energy is the cpu component", missing=False
        )
        for src in ("nvml", "npu-smi"):
            tried.append(
                {"source": src, "component": "device", "why": "not tried: the job trains on the CPU"}
            )
    else:
        try:
            if kind == "cuda":
                sources["device"] = NvmlEnergy(indices, sample_interval_s=sample_interval_s or 0.1, env=env)
            else:
                sources["device"] = NpuSmiPower(
                    indices, executable=npu_smi, sample_interval_s=sample_interval_s or 1.0, env=env
                )
        except SourceUnavailable as exc:
            tried.append(
                {"source": "nvml" if kind == "cuda" else "npu-smi", "component": "device", "why": str(exc)}
            )
            if tdp_watts is not None:
                sources["device"] = DeviceEstimate(kind, len(indices), tdp_watts, utilisation=utilisation)
            else:
                sources["device"] = NoSource(
                    "device",
                    f"no meter reads the {kind} devices and no tdp_watts was given to estimate from: device energy "
                    "is not counted (set the cluster's device tdp_watts)",
                    missing=True,
                )

    # cpu and memory: RAPL (package -> cpu, dram -> memory), else CodeCarbon-style estimates
    tree: ProcessTree | None = None
    try:
        rapl = RaplEnergy(rapl_root)
        sources["cpu"] = rapl
        if "memory" in rapl.components:
            sources["memory"] = rapl
        else:
            tried.append({"source": "rapl", "component": "memory", "why": "RAPL exposes no dram zone here"})
    except SourceUnavailable as exc:
        tried.append({"source": "rapl", "component": "cpu", "why": str(exc)})
        tried.append({"source": "rapl", "component": "memory", "why": str(exc)})
        tree = ProcessTree(root_pid)
        sources["cpu"] = CpuEstimate(tree, tdp_watts=cpu_tdp_watts)
    if "memory" not in sources:
        tree = tree or ProcessTree(root_pid)
        sources["memory"] = MemoryEstimate(tree)
    return PowerMeter(kind, sources, tried)
