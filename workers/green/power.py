"""Power meters: the energy a training job draws, per component (``device``, ``cpu``, ``memory``), from the
best source present, and a labelled estimate only where no meter exists.

Best source first, each used where present and otherwise reported as absent with the reason:

- **NVML** (``nvidia-ml-py``, ``pynvml``) for CUDA devices: the board's total-energy counter
  (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded, Volta and newer), else power
  samples (``nvmlDeviceGetPowerUsage``, mW, board and memory) integrated on a background thread.
- **npu-smi** for Ascend NPUs: ``npu-smi info -t power -i <npu id> [-c <chip id>]`` sampled on a background
  thread and integrated (:func:`parse_npu_smi_power` documents the format).
- **RAPL** (``/sys/class/powercap/intel-rapl:*``, Intel, and AMD since Linux 5.8): the package counters
  give ``cpu``, a ``dram`` zone gives ``memory``; counters wrap at ``max_energy_range_uj``.
- **estimate**, CodeCarbon-style (``data/power_defaults.json`` holds every figure with its source):
  ``cpu`` = TDP x the CPU time of the job's process tree / logical CPUs (CodeCarbon's process mode);
  ``memory`` = 3 W per 8 GiB of the tree's resident memory (CodeCarbon v2); ``device`` = the device's
  ``tdp_watts`` x utilisation. :meth:`PowerMeter.describe` labels every estimated component as one.

``meter = select_meter("cuda", [0, 1], tdp_watts=700)``; ``meter.read()`` returns the cumulative joules per
component since the meter started (cheap: call it every step); ``meter.describe()`` says which source
feeds each component, whether it is measured, and what was tried and why it was not used.

Scope: NVML and npu-smi measure whole boards; RAPL measures whole CPU packages and DRAM (every process on
the machine); the estimates cover the job's process tree. A node's meter should run in one process per node
(local rank 0) over that node's devices; :func:`sum_readings` adds the nodes' readings up.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import platform
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

COMPONENTS = ("device", "cpu", "memory")
METHODS = ("nvml", "npu-smi", "rapl", "estimate")
DEVICE_KINDS = ("cpu", "cuda", "npu")
DEFAULTS_PATH = Path(__file__).resolve().parent / "data" / "power_defaults.json"
RAPL_ROOT = Path("/sys/class/powercap")
ESTIMATE_LABEL = "estimate (CodeCarbon-style), not measured"


def load_defaults() -> dict[str, Any]:
    """The shipped defaults (``data/power_defaults.json``), every figure with its source."""
    with DEFAULTS_PATH.open() as fh:
        return json.load(fh)


_DEFAULTS = load_defaults()
UNKNOWN_CPU_TDP_WATTS = float(_DEFAULTS["cpu"]["unknown_tdp_watts"])
"""CodeCarbon's TDP for a CPU it does not know (``POWER_CONSTANT = 85``); source in the data file."""
MEMORY_WATTS_PER_GIB = float(_DEFAULTS["memory"]["watts_per_GiB"])
"""CodeCarbon v2's 3 W per 8 GB (GiB: CodeCarbon divides by 1024**3); source in the data file."""


class SourceUnavailable(RuntimeError):
    """A power source is absent here; the message says why (shown in ``describe()["tried"]``)."""


# ------------------------------------------------------------------------------------------- readings


@dataclass(frozen=True)
class PowerReading:
    """Cumulative energy per component since a meter started, at one instant."""

    time: datetime
    """Wall-clock time of the reading, aware UTC (the carbon intensity in force is looked up by it)."""
    joules: dict[str, float]
    """Cumulative joules per component (``device``, ``cpu``, ``memory``) since the meter started."""

    def __post_init__(self) -> None:
        if self.time.tzinfo is None:
            raise ValueError("a reading's time must be timezone-aware (UTC)")
        unknown = set(self.joules) - set(COMPONENTS)
        if unknown:
            raise ValueError(
                f"unknown component(s) {sorted(unknown)}; components are {', '.join(COMPONENTS)}"
            )
        joules = {c: float(self.joules.get(c, 0.0)) for c in COMPONENTS}
        if any(not math.isfinite(v) or v < 0 for v in joules.values()):
            raise ValueError(f"cumulative joules must be finite and >= 0, got {joules}")
        object.__setattr__(self, "time", self.time.astimezone(UTC))
        object.__setattr__(self, "joules", joules)

    @property
    def total_joules(self) -> float:
        return sum(self.joules.values())

    def to_floats(self) -> list[float]:
        """``[device, cpu, memory]`` joules: what one rank puts into an all-gather."""
        return [self.joules[c] for c in COMPONENTS]


def sum_readings(readings: Iterable[PowerReading]) -> PowerReading:
    """The readings of several nodes' meters as one (joules added, the latest time)."""
    readings = list(readings)
    if not readings:
        raise ValueError("no readings to add up")
    total = {c: sum(r.joules[c] for r in readings) for c in COMPONENTS}
    return PowerReading(max(r.time for r in readings), total)


# -------------------------------------------------------------------------------------------- sources


class _Source:
    """One power source feeding one or more components; cumulative joules since it started."""

    name = "estimate"
    measured = False

    def __init__(self, components: Sequence[str]):
        self.components = tuple(components)

    def joules(self, now: float) -> dict[str, float]:
        raise NotImplementedError

    def describe(self, component: str) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Integrator:
    """Trapezoidal integral of power samples (W) over monotonic time (s), safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.joules = 0.0
        self.last: tuple[float, float] | None = None  # (monotonic s, W)
        self.samples = 0

    def add(self, t: float, watts: float) -> None:
        with self._lock:
            if self.last is not None and t > self.last[0]:
                self.joules += 0.5 * (self.last[1] + watts) * (t - self.last[0])
            if self.last is None or t >= self.last[0]:
                self.last = (t, watts)
            self.samples += 1

    def total_at(self, now: float) -> float:
        """The integral up to the last sample, plus the last power held until ``now``."""
        with self._lock:
            if self.last is None:
                return 0.0
            return self.joules + self.last[1] * max(0.0, now - self.last[0])


class _Sampler:
    """A daemon thread calling ``sample()`` every ``interval_s`` until closed."""

    def __init__(self, name: str, interval_s: float, sample: Callable[[], None]):
        self._stop = threading.Event()
        self.errors = 0
        self.last_error = ""

        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    sample()
                except Exception as exc:  # a failed sample is counted and shown, the meter goes on
                    self.errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


# ------------------------------------------------------------------------------------------------ NVML


def _cuda_visible_devices(env: dict[str, str]) -> list[str] | None:
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() == "":
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


class NvmlEnergy(_Source):
    """The energy of CUDA devices from NVML: the total-energy counter where the GPU has one, else power
    samples integrated every ``sample_interval_s`` on a background thread.

    ``indices`` are CUDA ordinals as this process sees them; with ``CUDA_VISIBLE_DEVICES`` set they are
    mapped through it (indices or ``GPU-`` UUIDs) to NVML's devices. NVML numbers GPUs in PCI bus order:
    set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on nodes with mixed GPU models so that both orders agree.
    """

    name = "nvml"
    measured = True

    def __init__(
        self,
        indices: Sequence[int],
        *,
        sample_interval_s: float = 0.1,
        env: dict[str, str] | None = None,
    ):
        super().__init__(["device"])
        try:
            import pynvml
        except ImportError as exc:
            raise SourceUnavailable(
                "nvidia-ml-py is not installed (pip install nvidia-ml-py), so NVML cannot be read"
            ) from exc
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            missing = isinstance(exc, getattr(pynvml, "NVMLError_LibraryNotFound", ()))
            hint = ": no NVIDIA driver (libnvidia-ml.so.1) on this machine" if missing else ""
            raise SourceUnavailable(f"NVML did not initialise ({exc}){hint}") from exc
        self._initialised = True
        try:
            visible = _cuda_visible_devices(dict(os.environ) if env is None else env)
            self.gpus: list[dict[str, Any]] = []
            for index in indices:
                handle, label = self._handle(index, visible)
                self.gpus.append(self._open(index, handle, label))
        except Exception:
            self.close()
            raise
        self._sampler = None
        if any(g["mode"] == "power" for g in self.gpus):
            self._sample_power()
            self._sampler = _Sampler("nvml-power", sample_interval_s, self._sample_power)
        self.sample_interval_s = sample_interval_s

    def _handle(self, index: int, visible: list[str] | None):
        nv = self._nvml
        target = str(index)
        if visible is not None:
            if index >= len(visible):
                raise SourceUnavailable(
                    f"cuda:{index} is not among CUDA_VISIBLE_DEVICES={','.join(visible)} ({len(visible)} visible)"
                )
            target = visible[index]
        try:
            if target.isdigit():
                return nv.nvmlDeviceGetHandleByIndex(int(target)), f"nvml:{target}"
            if target.startswith("MIG-"):
                raise SourceUnavailable(
                    f"cuda:{index} is a MIG instance ({target}): NVML meters the whole GPU, not one instance"
                )
            return nv.nvmlDeviceGetHandleByUUID(target), target
        except nv.NVMLError as exc:
            raise SourceUnavailable(f"NVML has no device for cuda:{index} ({target}): {exc}") from exc

    def _open(self, index: int, handle, label: str) -> dict[str, Any]:
        nv = self._nvml
        name = nv.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        gpu: dict[str, Any] = {"cuda": index, "nvml": label, "name": name, "handle": handle}
        try:
            gpu["baseline_mj"] = int(nv.nvmlDeviceGetTotalEnergyConsumption(handle))
            gpu["mode"] = "energy counter"
        except nv.NVMLError as exc:  # pre-Volta or not supported on this board
            try:
                nv.nvmlDeviceGetPowerUsage(handle)
            except nv.NVMLError as exc2:
                raise SourceUnavailable(
                    f"{name} (cuda:{index}) has neither an energy counter ({exc}) nor a power reading ({exc2})"
                ) from exc2
            gpu["mode"] = "power"
            gpu["why_not_counter"] = str(exc)
            gpu["integrator"] = _Integrator()
        return gpu

    def _sample_power(self) -> None:
        nv = self._nvml
        for g in self.gpus:
            if g["mode"] == "power":
                g["integrator"].add(time.monotonic(), nv.nvmlDeviceGetPowerUsage(g["handle"]) / 1000.0)

    def joules(self, now: float) -> dict[str, float]:
        total = 0.0
        for g in self.gpus:
            if g["mode"] == "energy counter":
                mj = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(g["handle"]))
                total += max(0, mj - g["baseline_mj"]) / 1000.0
            else:
                total += g["integrator"].total_at(now)
        return {"device": total}

    def describe(self, component: str) -> dict[str, Any]:
        modes = sorted({g["mode"] for g in self.gpus})
        out: dict[str, Any] = {
            "source": "nvml",
            "measured": True,
            "how": (
                "NVML total-energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since driver load)"
                if modes == ["energy counter"]
                else f"NVML power (nvmlDeviceGetPowerUsage, mW) sampled every {self.sample_interval_s} s and "
                "integrated (trapezoid) where a GPU has no energy counter"
            ),
            "scope": "whole GPU boards (GPU and its memory)",
            "gpus": [{k: g[k] for k in ("cuda", "nvml", "name", "mode")} for g in self.gpus],
        }
        if self._sampler is not None and self._sampler.errors:
            out["sample_errors"] = {"count": self._sampler.errors, "last": self._sampler.last_error}
        return out

    def close(self) -> None:
        sampler = getattr(self, "_sampler", None)
        if sampler is not None:
            sampler.close()
            self._sampler = None
        if getattr(self, "_initialised", False):
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass


# --------------------------------------------------------------------------------------------- npu-smi

# ``npu-smi info -t power -i <npu id> [-c <chip id>]`` prints ``key : value`` lines, each key left-aligned
# in 30 columns after a tab (the npu-smi sources print them with ``"\t%-30s : %.1f\n"``), e.g. on an
# Atlas A2 (Ascend 910B, npu-smi 25.5.1):
#
#         NPU ID                         : 0
#         Chip Count                     : 1
#
#         NPU Real-time Power(W)         : 103.5
#         Chip ID                        : 0
#
# Huawei's npu-smi command reference (support.huawei.com EDOC1100438695 for Atlas A2, EDOC1100368198 for
# 310P: "info -t power -i id -c chip_id") documents the query. The power line's label depends on the
# product and on whether a chip or the board's MCU answers:
# - ``NPU Real-time Power(W)``: the chip's (or, in ``-t common`` output, the MCU's) real-time power;
# - ``Power Dissipation(W)``: the board's power where the MCU answers (Ascend 310/310B boards, cards);
# - ``Rated Power Dissipation(W)``: a rating (Ascend 310 chips), not a measurement: refused here;
# - ``NA`` as the value: not available (e.g. a vNPU inside a container).
NPU_POWER_LABELS = ("NPU Real-time Power(W)", "Power Dissipation(W)")
NPU_RATED_LABEL = "Rated Power Dissipation(W)"
_KEY_VALUE = re.compile(r"^\s*([^:]+?)\s*:\s*(.*?)\s*$")


@dataclass(frozen=True)
class NpuPower:
    """One power figure parsed from ``npu-smi info -t power``."""

    watts: float
    label: str
    npu_id: int | None
    chip_id: int | None


def parse_npu_smi_power(text: str) -> NpuPower:
    """The measured power in ``npu-smi info -t power -i <id> [-c <chip>]`` output (format above);
    ``ValueError`` saying what was found when there is none (a rating, ``NA``, an error message)."""
    fields: list[tuple[str, str]] = []
    for line in text.splitlines():
        m = _KEY_VALUE.match(line)
        if m:
            fields.append((m.group(1), m.group(2)))
    npu_id = next((int(v) for k, v in fields if k == "NPU ID" and v.isdigit()), None)
    chip_id = next((int(v) for k, v in fields if k == "Chip ID" and v.isdigit()), None)
    for label in NPU_POWER_LABELS:
        for key, value in fields:
            if key != label:
                continue
            try:
                watts = float(value)
            except ValueError:
                raise ValueError(
                    f"npu-smi reports {label} as {value!r}: no power reading available"
                ) from None
            if not math.isfinite(watts) or watts < 0:
                raise ValueError(f"npu-smi reports {label} as {value!r}, not a power")
            return NpuPower(watts, label, npu_id, chip_id)
    if any(k == NPU_RATED_LABEL for k, _ in fields):
        raise ValueError(f"npu-smi reports only {NPU_RATED_LABEL}, a rating and not a measurement")
    shown = text.strip().splitlines()[:3]
    raise ValueError(f"no power line ({' or '.join(NPU_POWER_LABELS)}) in npu-smi output: {shown!r}")


def parse_npu_smi_mapping(text: str) -> dict[int, tuple[int, int]]:
    """``npu-smi info -m`` as ``{chip logic id: (npu id, chip id)}``; MCU rows (logic id ``-``) are left
    out. The table's columns: ``NPU ID  Chip ID  Chip Logic ID  Chip Name``."""
    mapping: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) >= 3 and all(p.isdigit() for p in parts[:3]):
            mapping[int(parts[2])] = (int(parts[0]), int(parts[1]))
    return mapping


class NpuSmiPower(_Source):
    """The power of Ascend NPUs from ``npu-smi``, sampled every ``sample_interval_s`` on a background thread
    (one subprocess per NPU per sample: too slow to run on the training thread) and integrated.

    ``indices`` are the NPU ordinals this process sees (``npu:<i>``); through ``ASCEND_RT_VISIBLE_DEVICES``
    they map to chip logic ids, and ``npu-smi info -m`` maps those to the ``-i <npu id> -c <chip id>`` the
    power query takes."""

    name = "npu-smi"
    measured = True

    def __init__(
        self,
        indices: Sequence[int],
        *,
        executable: str = "npu-smi",
        sample_interval_s: float = 1.0,
        env: dict[str, str] | None = None,
        timeout_s: float = 10.0,
    ):
        super().__init__(["device"])
        path = shutil.which(executable)
        if path is None:
            raise SourceUnavailable(
                f"{executable} is not on PATH: no Ascend driver here (it installs /usr/local/bin/npu-smi)"
            )
        self.executable, self.timeout_s = path, timeout_s
        env = dict(os.environ) if env is None else env
        visible = env.get("ASCEND_RT_VISIBLE_DEVICES", "").strip()
        logic = [int(p) for p in visible.split(",") if p.strip().isdigit()] if visible else None
        try:
            mapping = parse_npu_smi_mapping(self._run(["info", "-m"]))
        except SourceUnavailable:
            mapping = {}
        self.npus: list[dict[str, Any]] = []
        for index in indices:
            logic_id = logic[index] if logic is not None and index < len(logic) else index
            npu_id, chip_id = mapping.get(logic_id, (logic_id, None))
            self.npus.append(self._open(index, npu_id, chip_id))
        self.sample_interval_s = sample_interval_s
        self._sampler = _Sampler("npu-smi-power", sample_interval_s, self._sample)

    def _run(self, args: list[str]) -> str:
        try:
            done = subprocess.run(
                [self.executable, *args], capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SourceUnavailable(f"npu-smi {' '.join(args)} failed: {exc}") from exc
        if done.returncode != 0:
            raise SourceUnavailable(
                f"npu-smi {' '.join(args)} exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"
            )
        return done.stdout

    def _open(self, index: int, npu_id: int, chip_id: int | None) -> dict[str, Any]:
        attempts = [["-c", str(chip_id)]] if chip_id is not None else []
        attempts.append([])  # some products answer only per board (no -c)
        errors = []
        for extra in attempts:
            args = ["info", "-t", "power", "-i", str(npu_id), *extra]
            try:
                power = parse_npu_smi_power(self._run(args))
            except (SourceUnavailable, ValueError) as exc:
                errors.append(str(exc))
                continue
            integrator = _Integrator()
            integrator.add(time.monotonic(), power.watts)
            return {
                "npu": index,
                "npu_id": npu_id,
                "args": args,
                "label": power.label,
                "integrator": integrator,
            }
        raise SourceUnavailable(f"npu:{index} (NPU ID {npu_id}): " + "; ".join(errors))

    def _sample(self) -> None:
        for n in self.npus:
            n["integrator"].add(time.monotonic(), parse_npu_smi_power(self._run(n["args"])).watts)

    def joules(self, now: float) -> dict[str, float]:
        return {"device": sum(n["integrator"].total_at(now) for n in self.npus)}

    def describe(self, component: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": "npu-smi",
            "measured": True,
            "how": f"npu-smi info -t power sampled every {self.sample_interval_s} s and integrated (trapezoid)",
            "scope": "NPU chips (or boards, where only the board's MCU answers)",
            "npus": [
                {k: n[k] for k in ("npu", "npu_id", "label")} | {"command": n["args"]} for n in self.npus
            ],
        }
        if self._sampler.errors:
            out["sample_errors"] = {"count": self._sampler.errors, "last": self._sampler.last_error}
        return out

    def close(self) -> None:
        self._sampler.close()


# ------------------------------------------------------------------------------------------------ RAPL


@dataclass
class _RaplZone:
    path: Path
    name: str
    component: str
    max_range_uj: int
    last_uj: int
    joules: float = 0.0
    wraps: int = 0


class RaplEnergy(_Source):
    """CPU package (and DRAM, where a ``dram`` zone exists) energy from the Linux powercap RAPL counters.

    Top-level zones ``intel-rapl:<n>`` named ``package-<n>`` feed ``cpu``; zones named ``dram`` feed
    ``memory``; ``core``/``uncore`` sub-zones (inside the package) and ``psys`` (the platform, which
    includes the packages) are skipped so nothing is counted twice. A counter that went down wrapped at
    ``max_energy_range_uj`` (kernel Documentation/power/powercap/powercap.rst); one wrap takes minutes at
    full power, so the meter is read at least that often (``poll_interval_s`` does it in the background).
    """

    name = "rapl"
    measured = True

    def __init__(self, root: str | Path = RAPL_ROOT, *, poll_interval_s: float | None = 10.0):
        root = Path(root)
        if not root.is_dir():
            raise SourceUnavailable(
                f"{root} does not exist: no powercap RAPL interface (a virtual machine, or a kernel without the "
                "intel_rapl driver)"
            )
        zones = sorted(p for p in root.glob("intel-rapl:*") if p.is_dir())
        if not zones:
            raise SourceUnavailable(
                f"no intel-rapl:* zones under {root}: RAPL is not exposed on this machine"
            )
        self.root = root
        self.zones: list[_RaplZone] = []
        skipped = []
        for path in zones:
            name = _read_text(path / "name")
            if name is None:
                continue
            if name.startswith("package"):
                component = "cpu"
            elif name == "dram":
                component = "memory"
            else:
                skipped.append(f"{path.name} ({name})")
                continue
            try:
                energy = int((path / "energy_uj").read_text().strip())
            except PermissionError as exc:
                raise SourceUnavailable(
                    f"{path / 'energy_uj'} is readable by root only (Linux restricts RAPL counters since "
                    "CVE-2020-8694); grant read access or run the meter as root"
                ) from exc
            except (OSError, ValueError) as exc:
                raise SourceUnavailable(f"cannot read {path / 'energy_uj'}: {exc}") from exc
            max_range = _read_int(path / "max_energy_range_uj")
            if max_range is None or max_range <= 0:
                raise SourceUnavailable(
                    f"cannot read {path / 'max_energy_range_uj'}: counter wraps undetectable"
                )
            self.zones.append(_RaplZone(path, name, component, max_range, energy))
        if not any(z.component == "cpu" for z in self.zones):
            raise SourceUnavailable(f"no package zone under {root} (found: {', '.join(skipped) or 'none'})")
        self.skipped = skipped
        super().__init__(sorted({z.component for z in self.zones}, key=COMPONENTS.index))
        self._lock = threading.Lock()
        self._poller = _Sampler("rapl-poll", poll_interval_s, self._poll) if poll_interval_s else None

    def _poll(self) -> None:
        with self._lock:
            for z in self.zones:
                now_uj = int((z.path / "energy_uj").read_text().strip())
                delta = now_uj - z.last_uj
                if delta < 0:  # wrapped at max_energy_range_uj
                    delta += z.max_range_uj
                    z.wraps += 1
                z.joules += delta / 1e6
                z.last_uj = now_uj

    def joules(self, now: float) -> dict[str, float]:
        self._poll()
        out = dict.fromkeys(self.components, 0.0)
        with self._lock:
            for z in self.zones:
                out[z.component] += z.joules
        return out

    def describe(self, component: str) -> dict[str, Any]:
        zones = [z for z in self.zones if z.component == component]
        return {
            "source": "rapl",
            "measured": True,
            "how": "Linux powercap RAPL energy_uj counters (wrap-around at max_energy_range_uj handled)",
            "scope": "whole CPU packages (every process on the machine)"
            if component == "cpu"
            else "DRAM attached to the packages (every process on the machine)",
            "zones": [{"zone": z.path.name, "name": z.name, "wraps": z.wraps} for z in zones],
            "skipped": self.skipped,
        }

    def close(self) -> None:
        if self._poller is not None:
            self._poller.close()
            self._poller = None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------- estimates


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


class CpuEstimate(_Source):
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
                f"CodeCarbon's default for a CPU it does not know: {_DEFAULTS['cpu']['unknown_tdp_source']}"
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
            "method_source": _DEFAULTS["cpu"]["method_source"],
            "scope": f"process tree of pid {self.tree.root_pid}",
        }


class MemoryEstimate(_Source):
    """CodeCarbon v2: 3 W per 8 GiB of resident memory of the process tree, integrated over time."""

    def __init__(self, tree: ProcessTree, *, watts_per_gib: float = MEMORY_WATTS_PER_GIB):
        super().__init__(["memory"])
        self.tree, self.watts_per_gib = tree, float(watts_per_gib)
        self._integrator = _Integrator()

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
            "watts_per_GiB_source": _DEFAULTS["memory"]["source"],
            "scope": f"process tree of pid {self.tree.root_pid}",
        }


class DeviceEstimate(_Source):
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
            "method_source": _DEFAULTS["accelerator"]["method_source"],
        }


class _NoSource(_Source):
    """A component nothing meters: zero joules, and the description says why."""

    name = "none"

    def __init__(self, component: str, why: str, *, missing: bool):
        super().__init__([component])
        self.why, self.missing = why, missing

    def joules(self, now: float) -> dict[str, float]:
        return dict.fromkeys(self.components, 0.0)

    def describe(self, component: str) -> dict[str, Any]:
        return {"source": "none", "measured": False, "missing": self.missing, "why": self.why}


# ----------------------------------------------------------------------------------------------- meter


@dataclass
class PowerMeter:
    """Cumulative energy per component from the sources :func:`select_meter` chose."""

    device_kind: str
    sources: dict[str, _Source]
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

    def _unique_sources(self) -> list[_Source]:
        seen: dict[int, _Source] = {}
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
        return [c for c in COMPONENTS if isinstance(self.sources[c], _NoSource) and self.sources[c].missing]

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
    sources: dict[str, _Source] = {}

    # device: NVML / npu-smi, else an estimate from the TDP, else nothing (said so)
    if kind == "cpu":
        sources["device"] = _NoSource(
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
                sources["device"] = _NoSource(
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
