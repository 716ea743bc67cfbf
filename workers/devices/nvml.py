"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``): the engines' one NVML adapter.

An :class:`NvmlSession` loads the library and initialises NVML, and shuts it down on :meth:`~NvmlSession.close`
(NVML counts its initialisations and shuts down when the count returns to zero, nvml.h ``nvmlShutdown``, so
sessions may overlap). It maps CUDA ordinals to NVML devices through ``CUDA_VISIBLE_DEVICES`` and reads what
the power meter, the power-cap advisor and the telemetry collector share: names, the total-energy counter,
power, power limits, temperature, the driver version. The telemetry collector's health queries (ECC, retired
pages, XID events, field values) go through :attr:`NvmlSession.nv`, the ``pynvml`` module itself with its
constants.

A session that cannot open raises :class:`NvmlUnavailable` saying why (no nvidia-ml-py, no driver, no such
GPU, a MIG instance); a query NVML refuses raises NVML's own ``NVMLError`` (``session.nv.NVMLError``), so
that each caller decides what a refused query means.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

NOT_INSTALLED = "nvidia-ml-py is not installed (pip install nvidia-ml-py), so NVML cannot be read"


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here, or has no such device; the message says why."""


def cuda_visible_devices(env: Mapping[str, str] | None = None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` of ``env`` (default: this process's environment) as a list of indices or
    ``GPU-``/``MIG-`` UUIDs; None when it is unset or empty (every GPU visible, in NVML's order)."""
    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() == "":
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSession:
    """NVML, initialised (use it as a context manager, or call :meth:`close`)."""

    def __init__(self) -> None:
        self.open = False
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(NOT_INSTALLED) from exc
        self.nv: Any = pynvml
        """The ``pynvml`` module: its constants, its ``NVMLError`` classes and the queries named nowhere here."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            missing = isinstance(exc, getattr(pynvml, "NVMLError_LibraryNotFound", ()))
            hint = ": no NVIDIA driver (libnvidia-ml.so.1) on this machine" if missing else ""
            raise NvmlUnavailable(f"NVML did not initialise ({exc}){hint}") from exc
        self.open = True

    def close(self) -> None:
        """Shut NVML down once (again: a no-op)."""
        if not self.open:
            return
        self.open = False
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ devices

    def device_count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount())

    def handle(self, index: int):
        """The device at NVML's ``index`` (PCI bus order, DCGM's ``gpu`` label)."""
        return self.nv.nvmlDeviceGetHandleByIndex(index)

    def cuda_handle(self, index: int, visible: list[str] | None) -> tuple[Any, str]:
        """``(handle, label)`` of CUDA ordinal ``index`` as a process with ``CUDA_VISIBLE_DEVICES`` =
        ``visible`` (:func:`cuda_visible_devices`) sees it: an index or a ``GPU-`` UUID. NVML numbers GPUs in
        PCI bus order: set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on nodes with mixed GPU models so that both
        orders agree. A MIG instance is refused: NVML meters the whole GPU."""
        nv = self.nv
        target = str(index)
        if visible is not None:
            if index >= len(visible):
                raise NvmlUnavailable(
                    f"cuda:{index} is not among CUDA_VISIBLE_DEVICES={','.join(visible)} ({len(visible)} visible)"
                )
            target = visible[index]
        try:
            if target.isdigit():
                return nv.nvmlDeviceGetHandleByIndex(int(target)), f"nvml:{target}"
            if target.startswith("MIG-"):
                raise NvmlUnavailable(
                    f"cuda:{index} is a MIG instance ({target}): NVML meters the whole GPU, not one instance"
                )
            return nv.nvmlDeviceGetHandleByUUID(target), target
        except nv.NVMLError as exc:
            raise NvmlUnavailable(f"NVML has no device for cuda:{index} ({target}): {exc}") from exc

    def name(self, handle) -> str:
        return _text(self.nv.nvmlDeviceGetName(handle))

    def driver_version(self) -> str:
        return _text(self.nv.nvmlSystemGetDriverVersion())

    # ----------------------------------------------------------------------------------------- readings

    def total_energy_mj(self, handle) -> int:
        """The board's energy since the driver loaded, mJ (``nvmlDeviceGetTotalEnergyConsumption``, Volta
        and newer)."""
        return int(self.nv.nvmlDeviceGetTotalEnergyConsumption(handle))

    def power_mw(self, handle):
        """The board's power draw now, mW (``nvmlDeviceGetPowerUsage``: GPU and its memory)."""
        return self.nv.nvmlDeviceGetPowerUsage(handle)

    def temperature_c(self, handle):
        """The GPU die temperature, degrees C (``nvmlDeviceGetTemperature``, ``NVML_TEMPERATURE_GPU``)."""
        return self.nv.nvmlDeviceGetTemperature(handle, self.nv.NVML_TEMPERATURE_GPU)

    def power_limits_mw(self, handle) -> tuple[int, int, int, int]:
        """``(min, max, default, current)`` power limits, mW (``nvmlDeviceGetPowerManagementLimitConstraints``,
        ``...DefaultLimit``, ``...Limit``); reading them needs no privilege."""
        nv = self.nv
        low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
        default = nv.nvmlDeviceGetPowerManagementDefaultLimit(handle)
        current = nv.nvmlDeviceGetPowerManagementLimit(handle)
        return low, high, default, current

    def set_power_limit_mw(self, handle, milliwatts: int) -> None:
        """Set the power limit (``nvmlDeviceSetPowerManagementLimit``: root or CAP_SYS_ADMIN, else
        ``NVMLError_NoPermission``)."""
        self.nv.nvmlDeviceSetPowerManagementLimit(handle, int(milliwatts))
