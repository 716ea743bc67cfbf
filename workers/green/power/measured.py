"""The measured power sources: NVML for CUDA devices, npu-smi for Ascend NPUs, RAPL for CPU packages and
DRAM. Each reads its meter through the device adapter in :mod:`workers.devices` and turns it into cumulative
joules; each raises :class:`SourceUnavailable` with the adapter's reason where its meter is absent."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.devices.npu_smi import (
    NpuPower,
    NpuSmi,
    NpuSmiUnavailable,
    ascend_visible_devices,
    chip_query,
    parse_npu_smi_power,
)
from workers.devices.nvml import NvmlSession, NvmlUnavailable, cuda_visible_devices
from workers.devices.rapl import RAPL_ROOT, RaplUnavailable, open_zones
from workers.green.power.readings import COMPONENTS
from workers.green.power.sources import BackgroundSampler, PowerIntegrator, PowerSource, SourceUnavailable

# ------------------------------------------------------------------------------------------------ NVML


class NvmlEnergy(PowerSource):
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
            self.session = NvmlSession()
        except NvmlUnavailable as exc:
            raise SourceUnavailable(str(exc)) from exc
        try:
            visible = cuda_visible_devices(env)
            self.gpus: list[dict[str, Any]] = []
            for index in indices:
                try:
                    handle, label = self.session.cuda_handle(index, visible)
                except NvmlUnavailable as exc:
                    raise SourceUnavailable(str(exc)) from exc
                self.gpus.append(self._open(index, handle, label))
        except Exception:
            self.close()
            raise
        self._sampler = None
        if any(g["mode"] == "power" for g in self.gpus):
            self._sample_power()
            self._sampler = BackgroundSampler("nvml-power", sample_interval_s, self._sample_power)
        self.sample_interval_s = sample_interval_s

    def _open(self, index: int, handle, label: str) -> dict[str, Any]:
        nvml = self.session
        name = nvml.name(handle)
        gpu: dict[str, Any] = {"cuda": index, "nvml": label, "name": name, "handle": handle}
        try:
            gpu["baseline_mj"] = nvml.total_energy_mj(handle)
            gpu["mode"] = "energy counter"
        except nvml.nv.NVMLError as exc:  # pre-Volta or not supported on this board
            try:
                nvml.power_mw(handle)
            except nvml.nv.NVMLError as exc2:
                raise SourceUnavailable(
                    f"{name} (cuda:{index}) has neither an energy counter ({exc}) nor a power reading ({exc2})"
                ) from exc2
            gpu["mode"] = "power"
            gpu["why_not_counter"] = str(exc)
            gpu["integrator"] = PowerIntegrator()
        return gpu

    def _sample_power(self) -> None:
        for g in self.gpus:
            if g["mode"] == "power":
                g["integrator"].add(time.monotonic(), self.session.power_mw(g["handle"]) / 1000.0)

    def joules(self, now: float) -> dict[str, float]:
        total = 0.0
        for g in self.gpus:
            if g["mode"] == "energy counter":
                mj = self.session.total_energy_mj(g["handle"])
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
        session = getattr(self, "session", None)
        if session is not None:
            session.close()


# --------------------------------------------------------------------------------------------- npu-smi


class NpuSmiPower(PowerSource):
    """The power of Ascend NPUs from ``npu-smi``, sampled every ``sample_interval_s`` on a background thread
    (one subprocess per NPU per sample: too slow to run on the training thread) and integrated.

    ``indices`` are the NPU ordinals this process sees (``npu:<i>``); through ``ASCEND_RT_VISIBLE_DEVICES``
    they map to chip logic ids, and ``npu-smi info -m`` maps those to the ``-i <npu id> -c <chip id>`` the
    power query takes (:func:`~workers.devices.npu_smi.parse_npu_smi_power` documents its output)."""

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
        try:
            self.tool = NpuSmi(executable, timeout_s=timeout_s)
        except NpuSmiUnavailable as exc:
            raise SourceUnavailable(str(exc)) from exc
        self.executable, self.timeout_s = self.tool.executable, timeout_s
        logic = ascend_visible_devices(env)
        mapping = self.tool.chip_mapping()
        self.npus: list[dict[str, Any]] = []
        for index in indices:
            logic_id = logic[index] if logic is not None and index < len(logic) else index
            npu_id, chip_id = mapping.get(logic_id, (logic_id, None))
            self.npus.append(self._open(index, npu_id, chip_id))
        self.sample_interval_s = sample_interval_s
        self._sampler = BackgroundSampler("npu-smi-power", sample_interval_s, self._sample)

    def _power(self, args: list[str]) -> NpuPower:
        try:
            text = self.tool.run(args)
        except NpuSmiUnavailable as exc:
            raise SourceUnavailable(str(exc)) from exc
        return parse_npu_smi_power(text)

    def _open(self, index: int, npu_id: int, chip_id: int | None) -> dict[str, Any]:
        errors = []
        for args in chip_query("power", npu_id, chip_id):
            try:
                power = self._power(args)
            except (SourceUnavailable, ValueError) as exc:
                errors.append(str(exc))
                continue
            integrator = PowerIntegrator()
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
            n["integrator"].add(time.monotonic(), self._power(n["args"]).watts)

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

COMPONENT_OF_DOMAIN = {"package": "cpu", "dram": "memory"}
"""RAPL's package counters give ``cpu``, its DRAM counters ``memory``."""


class RaplEnergy(PowerSource):
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
        try:
            self.zones, self.skipped = open_zones(root)
        except RaplUnavailable as exc:
            raise SourceUnavailable(str(exc)) from exc
        self.root = Path(root)
        components = {COMPONENT_OF_DOMAIN[z.domain] for z in self.zones}
        super().__init__(sorted(components, key=COMPONENTS.index))
        self._lock = threading.Lock()
        self._poller = (
            BackgroundSampler("rapl-poll", poll_interval_s, self._poll) if poll_interval_s else None
        )

    def _poll(self) -> None:
        with self._lock:
            for z in self.zones:
                z.advance()

    def joules(self, now: float) -> dict[str, float]:
        self._poll()
        out = dict.fromkeys(self.components, 0.0)
        with self._lock:
            for z in self.zones:
                out[COMPONENT_OF_DOMAIN[z.domain]] += z.joules
        return out

    def describe(self, component: str) -> dict[str, Any]:
        zones = [z for z in self.zones if COMPONENT_OF_DOMAIN[z.domain] == component]
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
