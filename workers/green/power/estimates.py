"""Labelled estimates, CodeCarbon-style, for the components no meter reads (``data/power_defaults.json``
holds every figure with its source):

- ``cpu`` = TDP x the CPU time of the job's process tree / logical CPUs (CodeCarbon's process mode), the
  TDP from the cluster, else CodeCarbon's own CPU table matched as CodeCarbon matches it, else its default;
- ``memory`` = 3 W per 8 GiB of the tree's resident memory (CodeCarbon v2);
- ``device`` = the device's ``tdp_watts`` x utilisation.

Every estimate describes itself as one (:data:`ESTIMATE_LABEL`).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import platform
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from workers.green.power.sources import PowerIntegrator, PowerSource

DEFAULTS_PATH = Path(__file__).resolve().parent.parent / "data" / "power_defaults.json"
ESTIMATE_LABEL = "estimate (CodeCarbon-style), not measured"


def load_defaults() -> dict[str, Any]:
    """The shipped defaults (``data/power_defaults.json``), every figure with its source."""
    with DEFAULTS_PATH.open() as fh:
        return json.load(fh)


DEFAULTS = load_defaults()
UNKNOWN_CPU_TDP_WATTS = float(DEFAULTS["cpu"]["unknown_tdp_watts"])
"""CodeCarbon's TDP for a CPU it does not know (``POWER_CONSTANT = 85``); source in the data file."""
MEMORY_WATTS_PER_GIB = float(DEFAULTS["memory"]["watts_per_GiB"])
"""CodeCarbon v2's 3 W per 8 GB (GiB: CodeCarbon divides by 1024**3); source in the data file."""


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_model_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU model as ``/proc/cpuinfo`` names it (``model name``; a VM may show a generic name)."""
    text = _read_text(Path(cpuinfo)) or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


CODECARBON_CPU_TABLE = "data/hardware/cpu_power.csv"


@functools.cache
def _codecarbon_cpu_table() -> tuple[str, dict[str, float]] | None:
    """CodeCarbon's version and its CPU TDP table (``Name,TDP``, some 4,900 models), read from the installed
    package's data without importing ``codecarbon`` (:mod:`workers.green.codecarbon_data`); ``None`` when
    the package or the file is absent."""
    from workers.green.codecarbon_data import codecarbon_package

    package = codecarbon_package()
    if package is None:
        return None
    version, root = package
    text = _read_text(root / CODECARBON_CPU_TABLE)
    if not text:
        return None
    table: dict[str, float] = {}
    for row in csv.DictReader(text.splitlines()):
        try:
            tdp = float(row["TDP"])
        except (KeyError, TypeError, ValueError):
            continue
        if row.get("Name") and math.isfinite(tdp) and tdp > 0:
            table[row["Name"]] = tdp
    return version, table


def codecarbon_cpu_tdp(model_raw: str) -> tuple[float, str, str] | None:
    """``(tdp_watts, matched name, codecarbon version)`` of a CPU model in CodeCarbon's table, or ``None``.

    CodeCarbon's own matching (``codecarbon/core/cpu.py``, ``TDP._get_matching_cpu``, non-greedy), with its
    matcher, rapidfuzz: an exact case-insensitive name; else the name without ``(R)``, `` CPU`` and the
    ``@ x.xxGHz`` clock, exactly; else a token-set ratio of 100 (one name's words contain the other's), and
    then only if one model scores best: a generic VM name like ``Intel(R) Xeon(R) Processor`` matches
    nothing rather than some Xeon's TDP."""
    from rapidfuzz import fuzz, process, utils

    loaded = _codecarbon_cpu_table()
    if loaded is None or not model_raw:
        return None
    version, table = loaded
    names = list(table)

    def exact(model: str) -> str | None:
        hit = process.extractOne(model, names, processor=str.lower, scorer=fuzz.ratio, score_cutoff=100)
        return hit[0] if hit else None

    found = exact(model_raw)
    if found is None:
        model = model_raw.replace("(R)", "")
        cut = model.find(" CPU @ ")
        model = (model[:cut] if cut > 0 else model).replace(" CPU", "")
        model = re.sub(r" @\s*\d+\.\d+GHz", "", model)
        found = exact(model)
        if found is None:
            hits = process.extract(
                model, names, processor=utils.default_process, scorer=fuzz.token_set_ratio, score_cutoff=100
            )
            if len(hits) == 1 or (len(hits) > 1 and hits[0][1] != hits[1][1]):
                found = hits[0][0]
    return None if found is None else (table[found], found, version)


class ProcessTree:
    """CPU seconds and resident memory of a process and its descendants, sampled once per meter read.

    CPU time is kept per process: a process that ends keeps what it used, one that started after the
    meter counts all of its CPU time, the root counts from the meter's start. A child that starts and
    ends between two refreshes of the tree (``refresh_s``) is not seen."""

    def __init__(self, root_pid: int | None = None, *, refresh_s: float = 5.0):
        self.root_pid = os.getpid() if root_pid is None else int(root_pid)
        try:
            self.root = psutil.Process(self.root_pid)
        except psutil.NoSuchProcess as exc:
            raise ValueError(f"no process with pid {self.root_pid} to meter") from exc
        self.started = time.time()
        self.refresh_s = refresh_s
        self._procs: dict[int, psutil.Process] = {}
        self._baseline: dict[int, float] = {}
        self._cpu: dict[int, float] = {}
        self._refreshed = -math.inf
        self._sample_at: float | None = None
        self._sample: tuple[float, float] = (0.0, 0.0)
        self._lock = threading.Lock()
        self._refresh(time.monotonic(), first=True)

    def _refresh(self, now: float, first: bool = False) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            procs = [self.root]
        for p in procs:
            if p.pid in self._procs:
                continue
            try:
                t = p.cpu_times()
                cpu = t.user + t.system
                born_after = p.create_time() >= self.started
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self._procs[p.pid] = p
            # present when the meter started: count from now; started later: all of its CPU time
            self._baseline[p.pid] = 0.0 if (born_after and not first) else cpu
            self._cpu[p.pid] = cpu
        self._refreshed = now

    def sample(self, now: float) -> tuple[float, float]:
        """``(CPU seconds since the meter started, resident GiB now)`` of the tree, cached per ``now``."""
        with self._lock:
            if self._sample_at == now:
                return self._sample
            if now - self._refreshed >= self.refresh_s:
                self._refresh(now)
            rss = 0
            for pid, p in list(self._procs.items()):
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        self._cpu[pid] = t.user + t.system
                        rss += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    del self._procs[pid]  # ended: its last CPU time stays counted
            cpu_s = sum(max(0.0, self._cpu[pid] - self._baseline[pid]) for pid in self._cpu)
            self._sample_at, self._sample = now, (cpu_s, rss / 2**30)
            return self._sample

    @property
    def pids(self) -> list[int]:
        return sorted(self._procs)


class CpuEstimate(PowerSource):
    """CodeCarbon's process mode: energy = TDP x CPU seconds of the process tree / logical CPUs."""

    def __init__(self, tree: ProcessTree, *, tdp_watts: float | None = None, cpu_count: int | None = None):
        super().__init__(["cpu"])
        self.tree = tree
        self.model = cpu_model_name()
        known = None if tdp_watts is not None else codecarbon_cpu_tdp(self.model)
        if tdp_watts is not None:
            self.tdp_watts, self.tdp_source = float(tdp_watts), "given (the cluster's CPU TDP)"
        elif known is not None:
            self.tdp_watts = known[0]
            self.tdp_source = (
                f"CodeCarbon {known[2]}'s CPU table ({CODECARBON_CPU_TABLE}): {known[1]!r}, matched to "
                f"{self.model!r} as CodeCarbon matches it"
            )
        else:
            self.tdp_watts = UNKNOWN_CPU_TDP_WATTS
            self.tdp_source = (
                f"{self.model!r} is not in CodeCarbon's CPU table (or matches several models), so "
                f"CodeCarbon's default for a CPU it does not know: {DEFAULTS['cpu']['unknown_tdp_source']}"
            )
        self.cpu_count = cpu_count or psutil.cpu_count(logical=True) or os.cpu_count() or 1

    def joules(self, now: float) -> dict[str, float]:
        cpu_s, _ = self.tree.sample(now)
        return {"cpu": self.tdp_watts * cpu_s / self.cpu_count}

    def describe(self, component: str) -> dict[str, Any]:
        return {
            "source": "estimate",
            "measured": False,
            "label": ESTIMATE_LABEL,
            "how": f"{self.tdp_watts:g} W TDP x CPU seconds of the job's process tree / {self.cpu_count} logical "
            "CPUs (CodeCarbon process tracking mode)",
            "cpu_model": self.model,
            "tdp_watts": self.tdp_watts,
            "tdp_source": self.tdp_source,
            "method_source": DEFAULTS["cpu"]["method_source"],
            "scope": f"process tree of pid {self.tree.root_pid}",
        }


class MemoryEstimate(PowerSource):
    """CodeCarbon v2: 3 W per 8 GiB of resident memory of the process tree, integrated over time."""

    def __init__(self, tree: ProcessTree, *, watts_per_gib: float = MEMORY_WATTS_PER_GIB):
        super().__init__(["memory"])
        self.tree, self.watts_per_gib = tree, float(watts_per_gib)
        self._integrator = PowerIntegrator()

    def joules(self, now: float) -> dict[str, float]:
        _, gib = self.tree.sample(now)
        self._integrator.add(now, self.watts_per_gib * gib)
        return {"memory": self._integrator.total_at(now)}

    def describe(self, component: str) -> dict[str, Any]:
        return {
            "source": "estimate",
            "measured": False,
            "label": ESTIMATE_LABEL,
            "how": f"{self.watts_per_gib:g} W per GiB of resident memory (RSS) of the job's process tree, "
            "sampled at every read and integrated",
            "watts_per_GiB_source": DEFAULTS["memory"]["source"],
            "scope": f"process tree of pid {self.tree.root_pid}",
        }


class DeviceEstimate(PowerSource):
    """``tdp_watts`` x device count x utilisation, when no meter reads the accelerators."""

    def __init__(
        self,
        kind: str,
        count: int,
        tdp_watts: float,
        *,
        utilisation: Callable[[], float] | None = None,
        start: float | None = None,
    ):
        super().__init__(["device"])
        self.kind, self.count, self.tdp_watts = kind, int(count), float(tdp_watts)
        self.utilisation = utilisation
        self._last = time.monotonic() if start is None else start
        self._joules = 0.0
        self.last_utilisation: float | None = None

    def joules(self, now: float) -> dict[str, float]:
        if self.utilisation is None:
            u = 1.0
        else:
            u = float(self.utilisation())
            if not math.isfinite(u) or not 0.0 <= u <= 1.0:
                raise ValueError(f"device utilisation must be a fraction in [0, 1], got {u!r}")
        self.last_utilisation = u
        if now > self._last:
            self._joules += self.tdp_watts * self.count * u * (now - self._last)
            self._last = now
        return {"device": self._joules}

    def describe(self, component: str) -> dict[str, Any]:
        return {
            "source": "estimate",
            "measured": False,
            "label": ESTIMATE_LABEL,
            "how": f"{self.tdp_watts:g} W TDP x {self.count} {self.kind} device(s) x utilisation",
            "utilisation": "from the given utilisation callable"
            if self.utilisation is not None
            else "unknown: every device taken as fully busy (an upper bound)",
            "tdp_watts": self.tdp_watts,
            "tdp_source": "the cluster's device tdp_watts (cluster.json / shared/data/hardware.json)",
            "method_source": DEFAULTS["accelerator"]["method_source"],
        }
