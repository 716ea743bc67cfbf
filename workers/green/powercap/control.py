"""Power control on this machine: whether a power limit can be set and measured here, and NVML's
limits of one NVIDIA GPU, read, set and profiled (:class:`NvmlPowerLimit`, the only code that ever changes a
limit, on explicit request, and always restores it), with a GEMM loop to profile."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.devices.nvml import NvmlSession, NvmlUnavailable
from workers.green.power import NvmlEnergy, SourceUnavailable
from workers.green.powercap.points import PowerPoint, PowerProfile, finite_number

CPUFREQ_DIR = Path("/sys/devices/system/cpu/cpu0/cpufreq")


def power_control_status(*, cpufreq_dir: str | Path = CPUFREQ_DIR) -> dict[str, Any]:
    """Whether this machine can set and measure a power limit: ``{"available", "why", "nvml", "cpufreq"}``.
    Measured advice needs NVML (an NVIDIA driver and GPU); cpufreq is reported for CPU jobs, but cann-train
    has no CPU power-limit profiler, so it never makes measured advice available."""
    nvml: dict[str, Any]
    try:
        session = NvmlSession()
    except NvmlUnavailable as exc:
        nvml = {"available": False, "why": str(exc)}
    else:
        with session:
            count = session.device_count()
            nvml = {"available": count > 0, "gpus": count}
            if not count:
                nvml["why"] = "NVML sees no GPU"
    cpufreq_dir = Path(cpufreq_dir)
    if cpufreq_dir.is_dir():
        cpufreq = {
            "available": True,
            "path": str(cpufreq_dir),
            "why": "present, but cann-train profiles power limits only through NVML (no CPU profiler)",
        }
    else:
        cpufreq = {"available": False, "why": f"{cpufreq_dir} is absent: no CPU frequency control here"}
    available = bool(nvml.get("available"))
    why = "" if available else f"NVML: {nvml['why']}; cpufreq: {cpufreq['why']}"
    return {"available": available, "why": why, "nvml": nvml, "cpufreq": cpufreq}


@dataclass(frozen=True)
class PowerLimits:
    """A GPU's power limits as NVML reports them, W."""

    min_w: float
    max_w: float
    default_w: float
    current_w: float


class NvmlPowerLimit:
    """Read, set and profile one NVIDIA GPU's power limit through NVML (the adapter
    :class:`workers.devices.nvml.NvmlSession`).

    ``NvmlPowerLimit(0)`` opens CUDA device 0 (mapped through ``CUDA_VISIBLE_DEVICES`` as
    :class:`~workers.green.power.NvmlEnergy` does, whose energy reading it uses). Reading the limits needs no
    privilege; :meth:`profile` changes the limit (``nvmlDeviceSetPowerManagementLimit``: root or
    CAP_SYS_ADMIN) and always restores the one it found. Raises :class:`SourceUnavailable` with the reason
    where NVML, the GPU or the permission is missing. Use it as a context manager (it closes NVML)."""

    def __init__(self, index: int = 0, *, env: dict[str, str] | None = None):
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"the device index must be a CUDA ordinal >= 0, got {index!r}")
        self.index = index
        self._meter = NvmlEnergy([index], env=env)  # SourceUnavailable: no pynvml / driver / device
        self._nvml = self._meter.session
        gpu = self._meter.gpus[0]
        self.handle, self.name, self.energy_mode = gpu["handle"], gpu["name"], gpu["mode"]

    def __enter__(self) -> NvmlPowerLimit:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._meter.close()

    def limits(self) -> PowerLimits:
        """Min, max, default and current limits (``nvmlDeviceGetPowerManagementLimitConstraints``,
        ``...DefaultLimit``, ``...Limit``; mW there, W here)."""
        nv = self._nvml.nv
        try:
            low, high, default, current = self._nvml.power_limits_mw(self.handle)
        except nv.NVMLError as exc:
            raise SourceUnavailable(
                f"{self.name} (cuda:{self.index}) does not report its power limits through NVML: {exc}"
            ) from exc
        return PowerLimits(low / 1000.0, high / 1000.0, default / 1000.0, current / 1000.0)

    def energy_j(self) -> float:
        """The board's energy since this object opened, J (NVML's counter, else integrated power)."""
        return float(self._meter.joules(time.monotonic())["device"])

    def _set_mw(self, milliwatts: int) -> None:
        nv = self._nvml.nv
        try:
            self._nvml.set_power_limit_mw(self.handle, milliwatts)
        except nv.NVMLError_NoPermission as exc:
            raise SourceUnavailable(
                f"changing the power limit of {self.name} (cuda:{self.index}) needs root (or CAP_SYS_ADMIN): "
                f"NVML says {exc}; nothing was changed"
            ) from exc
        except nv.NVMLError as exc:
            raise SourceUnavailable(
                f"NVML refused the power limit {milliwatts / 1000:g} W on {self.name} (cuda:{self.index}): {exc}"
            ) from exc

    def profile(
        self,
        workload: Callable[[], int | None],
        limits: Sequence[float],
        *,
        warmup: Callable[[], Any] | None = None,
        sleep_s: float = 0.0,
    ) -> PowerProfile:
        """Measure ``workload`` under each limit (W): set the limit, run ``warmup`` (unmeasured, lets clocks
        settle), then run ``workload`` between two energy readings. ``workload()`` must finish its device work
        before it returns (synchronise) and returns the steps it ran (None = 1). The limit found on entry is
        restored in a ``finally``, whatever happens; a failed restore raises with the command to fix it."""
        if not limits:
            raise ValueError("profile needs at least one power limit (W)")
        bounds = self.limits()
        wanted = [finite_number(w, "a power limit (W)", strict=True) for w in limits]
        outside = [w for w in wanted if not bounds.min_w - 1e-6 <= w <= bounds.max_w + 1e-6]
        if outside:
            raise ValueError(
                f"{self.name} accepts limits from {bounds.min_w:g} to {bounds.max_w:g} W; "
                f"{', '.join(f'{w:g}' for w in outside)} W is outside (nothing was changed)"
            )
        original_mw = int(round(bounds.current_w * 1000))
        self._set_mw(original_mw)  # a no-op change: fails early, before anything moves, without permission
        points: list[PowerPoint] = []
        try:
            for w in wanted:
                self._set_mw(int(round(w * 1000)))
                if sleep_s:
                    time.sleep(sleep_s)
                if warmup is not None:
                    warmup()
                e0, t0 = self.energy_j(), time.perf_counter()
                steps = workload()
                t1, e1 = time.perf_counter(), self.energy_j()
                steps = 1 if steps is None else steps
                if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                    raise ValueError(f"the workload must return the steps it ran (>= 1), got {steps!r}")
                wall = t1 - t0
                points.append(PowerPoint(w, wall / steps, max(0.0, e1 - e0) / wall, "measured"))
        finally:
            try:
                self._set_mw(original_mw)
            except SourceUnavailable as exc:
                raise RuntimeError(
                    f"could not restore the power limit of {self.name} to {original_mw / 1000:g} W: {exc}. "
                    f"Restore it by hand: sudo nvidia-smi -i {self.index} -pl {original_mw / 1000:g}"
                ) from exc
        how = (
            "NVML total-energy counter"
            if self.energy_mode == "energy counter"
            else "NVML power samples integrated"
        )
        return PowerProfile(
            points=tuple(points),
            device=self.name,
            source=f"measured on {self.name} (cuda:{self.index}): {how}, wall time per step; "
            f"limit restored to {original_mw / 1000:g} W",
            default_limit_w=bounds.default_w,
            max_limit_w=bounds.max_w,
            min_limit_w=bounds.min_w,
        )


def nvml_min_limit(device_name: str) -> tuple[float | None, str]:
    """(the minimum power limit of the plan's device from NVML, or None, and why / where from): used only
    when a GPU here is that device (its name contains the plan's, or the other way round)."""
    try:
        with NvmlPowerLimit(0) as gpu:
            here = gpu.name
            a, b = here.lower(), (device_name or "").lower()
            if not b or not (b in a or a.removeprefix("nvidia ") in b):
                return None, f"the GPU here ({here}) is not the plan's device ({device_name or 'unnamed'})"
            limits = gpu.limits()
            return limits.min_w, f"NVML nvmlDeviceGetPowerManagementLimitConstraints on {here} (cuda:0)"
    except SourceUnavailable as exc:
        return None, str(exc)


def gemm_workload(seconds: float, *, device_index: int = 0, size: int = 8192, per_step: int = 8):
    """A callable for :meth:`NvmlPowerLimit.profile`: square GEMMs (bf16 where supported, else fp16) on CUDA
    device ``device_index`` for ``seconds`` (or the seconds it is called with); a step is ``per_step`` GEMMs
    then a synchronise. It returns the steps it ran. Raises :class:`SourceUnavailable` without CUDA."""
    seconds = finite_number(seconds, "seconds", strict=True)
    import torch

    if not torch.cuda.is_available():
        raise SourceUnavailable(f"no CUDA device visible to torch {torch.__version__}")
    device = torch.device("cuda", device_index)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def run(for_s: float | None = None) -> int:
        steps, end = 0, time.perf_counter() + (seconds if for_s is None else for_s)
        while steps == 0 or time.perf_counter() < end:
            for _ in range(per_step):
                torch.mm(a, b)
            torch.cuda.synchronize(device)
            steps += 1
        return steps

    run.describe = f"{per_step} x {size}x{size} {str(dtype).removeprefix('torch.')} GEMMs per step"  # type: ignore[attr-defined]
    return run
