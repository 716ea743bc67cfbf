"""Choose the accelerator (``npu|cuda|cpu``) and its process-group backend (``hccl|nccl|gloo``).

``CANN_TRAIN_DEVICE=auto|cpu|cuda|npu`` (default ``auto``: npu, then cuda, then cpu). ``torch_npu`` is
imported lazily and only when asked for or probed, and every reason a backend is unavailable is kept so
that the caller can print it (``cann-train train`` does, and the runtime's ``started`` event carries it).

Foundation issue: with ``torch-npu`` installed but no Ascend runtime (CANN toolkit / driver), ``import
torch`` itself fails because torch auto-loads ``torch_npu`` through its device-backend entry point.
:func:`prepare_environment` sets ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` before torch is imported (the runtime
entry point calls it first thing), so torch always imports and ``torch_npu`` is probed explicitly.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field

DEVICE_ENV = "CANN_TRAIN_DEVICE"
CHOICES = ("auto", "cpu", "cuda", "npu")
BACKEND_FOR = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


class DeviceUnavailable(RuntimeError):
    """The requested device kind cannot be used here; the message says why."""


@dataclass(frozen=True)
class DeviceChoice:
    """The device kind this process trains on and why the others were passed over."""

    kind: str  # "cpu" | "cuda" | "npu"
    backend: str  # "gloo" | "nccl" | "hccl"
    requested: str  # what CANN_TRAIN_DEVICE / the config asked for
    name: str = ""  # human-readable device name ("NVIDIA H100", "Ascend910B", "cpu")
    count: int = 1  # devices visible to this process (1 for cpu)
    unavailable: dict[str, str] = field(default_factory=dict)  # kind -> why it could not be used

    def device_for_local_rank(self, local_rank: int):
        import torch

        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device(self.kind, local_rank % max(self.count, 1))

    def explain(self) -> str:
        lines = [f"device: {self.kind} ({self.name}), backend {self.backend}, requested {self.requested}"]
        lines += [f"  {kind} unavailable: {why}" for kind, why in self.unavailable.items()]
        return "\n".join(lines)


def prepare_environment() -> None:
    """Call before the first ``import torch`` so that a broken torch-npu cannot break it."""
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def probe_npu() -> tuple[int, str, str]:
    """(count, name, why-unavailable). Imports ``torch_npu`` lazily."""
    if importlib.util.find_spec("torch_npu") is None:
        return 0, "", "torch_npu is not installed (pip install 'cann-train[npu]', needs the CANN toolkit)"
    try:
        import torch

        importlib.import_module("torch_npu")
    except Exception as exc:  # torch_npu raises many kinds when the CANN runtime is absent
        return (
            0,
            "",
            (
                f"torch_npu is installed but failed to import ({type(exc).__name__}: {exc}); "
                "is the Ascend CANN runtime installed and set_env.sh sourced?"
            ),
        )
    try:
        count = int(torch.npu.device_count())
    except Exception as exc:
        return 0, "", f"torch_npu imported but the Ascend driver did not answer ({exc})"
    if count == 0:
        return 0, "", "torch_npu imported but no Ascend NPU is visible (ASCEND_RT_VISIBLE_DEVICES?)"
    return count, str(torch.npu.get_device_name(0)), ""


def probe_cuda() -> tuple[int, str, str]:
    import torch

    if not torch.backends.cuda.is_built():
        return 0, "", f"this torch build ({torch.__version__}) has no CUDA support"
    if not torch.cuda.is_available():
        return (
            0,
            "",
            "torch has CUDA support but no GPU/driver is visible (CUDA_VISIBLE_DEVICES, nvidia-smi?)",
        )
    return torch.cuda.device_count(), torch.cuda.get_device_name(0), ""


PROBES = {"npu": probe_npu, "cuda": probe_cuda}


def select_device(requested: str | None = None) -> DeviceChoice:
    """Resolve ``requested`` (or ``$CANN_TRAIN_DEVICE``, default ``auto``) to a usable device kind.

    ``auto`` falls back npu -> cuda -> cpu and records why each was skipped; an explicit ``cuda``/``npu``
    that cannot be used raises :class:`DeviceUnavailable` with the reason, never silently runs on cpu.
    """
    prepare_environment()
    requested = (requested or os.environ.get(DEVICE_ENV) or "auto").strip().lower()
    if requested not in CHOICES:
        raise DeviceUnavailable(f"{DEVICE_ENV} must be one of {'|'.join(CHOICES)}, got {requested!r}")
    unavailable: dict[str, str] = {}
    candidates = ["npu", "cuda"] if requested == "auto" else [requested] if requested != "cpu" else []
    for kind in candidates:
        count, name, why = PROBES[kind]()
        if count > 0:
            return DeviceChoice(kind, BACKEND_FOR[kind], requested, name, count, unavailable)
        unavailable[kind] = why
        if requested == kind:
            raise DeviceUnavailable(f"{kind} requested but unavailable: {why}")
    return DeviceChoice("cpu", "gloo", requested, "cpu", 1, unavailable)


def synchronize(kind: str) -> None:
    """Wait for queued device work (so step timings are real); a no-op on cpu."""
    if kind == "cpu":
        return
    import torch

    getattr(torch, kind).synchronize()


def max_memory_GiB(kind: str, index: int | None = None) -> float:
    """Peak memory of this process: reserved device memory on cuda/npu (of device ``index``: named, so that
    another thread than the one that set the device asks of the right one), peak RSS on cpu."""
    if kind == "cpu":
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # ru_maxrss is KiB on Linux
    import torch

    return getattr(torch, kind).max_memory_reserved(index) / 2**30


def devices_missing(requested: str | None, ranks_per_node: int) -> str:
    """Why this node cannot run ``ranks_per_node`` ranks on ``requested`` (empty when it can): the
    device kind is unavailable, or the node has fewer devices than ranks. Checked by a node's supervisor
    before it starts any rank, so a job never spawns 8 ranks on a machine without a GPU."""
    try:
        choice = select_device(requested)
    except DeviceUnavailable as exc:
        return f"This node cannot run the job: {exc}."
    if choice.kind != "cpu" and choice.count < ranks_per_node:
        return (
            f"This node has {choice.count} {choice.kind} device(s) ({choice.name}) but the job needs "
            f"{ranks_per_node} per node. Use more nodes, or a strategy with fewer ranks."
        )
    return ""


def device_memory_GiB(kind: str) -> float | None:
    """Memory of one device of ``kind`` on this node (GiB); None for cpu (the node's memory is shared)."""
    if kind == "cpu":
        return None
    import torch

    if kind == "npu":
        importlib.import_module("torch_npu")
    return getattr(torch, kind).get_device_properties(0).total_memory / 2**30
