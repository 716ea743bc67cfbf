"""Gradient-compression kernels: a C++/OpenMP torch extension with a pure-torch fallback.

Importing this package compiles nothing. The extension is JIT-built by ``python -m native_ops build``
(``make setup`` runs it) or, failing that, on the first kernel call, into ``$CANN_TRAIN_EXT_DIR`` or
``<repo>/var/torch_extensions``. When it cannot be built (no C++ compiler, no ninja, a compile error)
or ``CANN_TRAIN_NATIVE=off``, the kernels come from :mod:`native_ops.reference` (identical semantics,
slower) and the reason is logged once. ``CANN_TRAIN_NATIVE=prebuilt`` loads a finished build only.

Public kernels (gradients/residuals are 1-D contiguous; residuals float32):

- ``topk_compress(x, density=None, *, k=None, value_dtype=torch.float16) -> (indices int32, values)``
- ``topk_ef_compress(grad, residual, density=None, *, k=None, value_dtype=..., scale=1.0)``:
  fused ``residual += scale*grad``; top-k of the residual; ``residual[indices] -= values``.
- ``topk_decompress_add(out, indices, values, alpha=1.0)``: ``out[indices] += alpha*values``; 2-D inputs
  are rows (one per rank), added in row order.
- ``sign_compress(x, chunk=4096) -> (bits uint8[ceil(n/8)], scales float32[ceil(n/chunk)])``
- ``sign_ef_compress(grad, residual, chunk=4096, scale=1.0)``: fused error feedback + sign.
- ``sign_decompress_add(out, bits, scales, chunk=4096, alpha=1.0)``
- ``ef_update(residual, grad, decompressed, scale=1.0)``: ``residual += scale*grad - decompressed``.

Which implementation runs is decided per call by :func:`kernels_for` from the tensors: CPU float32 → the
C++/OpenMP extension (or its reference fallback); any other device (CUDA, NPU) or dtype → the pure-torch
kernels of :mod:`native_ops.reference`, which run on the tensors' own device (docs/comm.md, "Device path").
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from native_ops import reference

log = logging.getLogger("native_ops")

EXTENSION_NAME = "cann_native_ops"
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = [CSRC / "compress.cpp"]
# -O3 with the baseline ISA (no -march=native): the kernels are memory-bound, so wider SIMD buys little,
# and a cache built on one host must run on every host that shares it. -ffp-contract=off keeps the
# arithmetic bit-identical to the torch reference (GCC contracts a*b+c into FMA by default on aarch64,
# i.e. on Kunpeng hosts next to Ascend NPUs).
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
LDFLAGS = ["-fopenmp"]

_backend_module: ModuleType | None = None
_backend_name = "unloaded"
_fallback_reason = ""


def build_dir() -> Path:
    """Where the extension is built: ``$CANN_TRAIN_EXT_DIR`` or ``<repo>/var/torch_extensions``."""
    root = os.environ.get("CANN_TRAIN_EXT_DIR") or str(
        Path(__file__).resolve().parents[1] / "var" / "torch_extensions"
    )
    tag = f"{EXTENSION_NAME}-torch{torch.__version__.split('+')[0]}-py{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}"
    return Path(root) / tag


def _source_stamp() -> str:
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.read_bytes())
    h.update(" ".join(CFLAGS + LDFLAGS).encode())
    h.update(torch.__version__.encode())
    return h.hexdigest()


def _missing_toolchain() -> str:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"C++ compiler {cxx!r} not found on PATH"
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return "ninja not found (pip install ninja, or apt-get install ninja-build)"
    return ""


def _load_prebuilt(directory: Path) -> ModuleType | None:
    stamp = directory / "source.sha256"
    libs = sorted(directory.glob(f"{EXTENSION_NAME}*.so"))
    if not libs or not stamp.exists() or stamp.read_text().strip() != _source_stamp():
        return None
    spec = importlib.util.spec_from_loader(
        EXTENSION_NAME, importlib.machinery.ExtensionFileLoader(EXTENSION_NAME, str(libs[0]))
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(verbose: bool = False) -> tuple[ModuleType, Path, float]:
    """Compile (or re-use) the extension; returns (module, build directory, seconds). Raises on failure."""
    reason = _missing_toolchain()
    if reason:
        raise RuntimeError(reason)
    from torch.utils.cpp_extension import load as jit_load

    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    module = jit_load(
        name=EXTENSION_NAME,
        sources=[str(s) for s in SOURCES],
        extra_cflags=list(CFLAGS),  # copies: torch appends to these lists
        extra_ldflags=list(LDFLAGS),
        build_directory=str(directory),
        verbose=verbose,
    )
    (directory / "source.sha256").write_text(_source_stamp() + "\n")
    return module, directory, time.perf_counter() - t0


def load(build: bool = True) -> ModuleType:
    """The kernel module: the native extension if available (built if ``build``), else the reference."""
    global _backend_module, _backend_name, _fallback_reason
    if _backend_module is not None:
        return _backend_module
    mode = os.environ.get("CANN_TRAIN_NATIVE", "auto").lower()
    module: ModuleType | None = None
    reason = ""
    if mode == "off":
        reason = "CANN_TRAIN_NATIVE=off"
    else:
        try:
            module = _load_prebuilt(build_dir())
        except (ImportError, OSError) as exc:
            module, reason = None, f"prebuilt extension failed to load: {exc}"
        if module is None and build and mode != "prebuilt":
            log.info("building the native_ops extension into %s (one-off)", build_dir())
            try:
                module = globals()["build"]()[0]
            except Exception as exc:  # compiler errors come as RuntimeError/CalledProcessError/ImportError
                first = str(exc).strip().splitlines()
                reason = f"native build failed: {first[0] if first else type(exc).__name__}"
        elif module is None and not reason:
            reason = "no prebuilt extension (run `python -m native_ops build`)"
    if module is None:
        _backend_module, _backend_name, _fallback_reason = reference, "reference", reason
        log.warning("native_ops: using the pure-torch reference kernels (%s)", reason)
    else:
        _backend_module, _backend_name, _fallback_reason = module, "native", ""
    return _backend_module


def backend() -> str:
    """``native`` or ``reference`` (after the first load), ``unloaded`` before."""
    return _backend_name


def fallback_reason() -> str:
    return _fallback_reason


def kernels_for(*buffers: torch.Tensor, inputs: tuple[torch.Tensor, ...] = ()) -> ModuleType:
    """The kernel module for one call: the C++ extension (:func:`load`) when every ``buffers`` tensor (the
    gradient, residual or output) is a CPU float32 tensor and every ``inputs`` tensor (indices, values,
    bits, scales) is on the CPU; :mod:`native_ops.reference` otherwise.

    Why by device: the C++ kernels dereference host pointers and take float32 only. On an accelerator,
    torch's own ops (``torch.topk``, ``index_add_``, comparisons, shifts) already are device kernels queued
    on the bucket's stream, so the pure-torch twin *is* the device path: same results, no host round trip
    of the bucket. A hand-written CUDA / Ascend C kernel would be chosen here, by ``device.type``, once it
    measures faster than those ops (``bench/compress_kernels.py --device cuda``)."""
    if all(t.device.type == "cpu" and t.dtype == torch.float32 for t in buffers) and all(
        t.device.type == "cpu" for t in inputs
    ):
        return load()
    return reference


def k_for_density(n: int, density: float) -> int:
    """Number of elements kept at ``density`` (at least 1 for a non-empty tensor and density > 0)."""
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    if n == 0 or density == 0.0:
        return 0
    return min(n, max(1, math.ceil(density * n)))


def _k(n: int, density: float | None, k: int | None) -> int:
    if (density is None) == (k is None):
        raise ValueError("give exactly one of density and k")
    return k_for_density(n, density) if density is not None else max(0, min(int(k), n))  # type: ignore[arg-type]


def topk_compress(
    x: torch.Tensor,
    density: float | None = None,
    *,
    k: int | None = None,
    value_dtype: torch.dtype = torch.float16,
) -> tuple[torch.Tensor, torch.Tensor]:
    idx, vals = kernels_for(x).topk_compress(x, _k(x.numel(), density, k), value_dtype)
    return idx, vals


def topk_ef_compress(
    grad: torch.Tensor,
    residual: torch.Tensor,
    density: float | None = None,
    *,
    k: int | None = None,
    value_dtype: torch.dtype = torch.float16,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    idx, vals = kernels_for(grad, residual).topk_ef_compress(
        grad, residual, _k(grad.numel(), density, k), value_dtype, float(scale)
    )
    return idx, vals


def topk_decompress_add(
    out: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, alpha: float = 1.0
) -> None:
    kernels_for(out, inputs=(indices, values)).topk_decompress_add(out, indices, values, float(alpha))


def sign_compress(x: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    bits, scales = kernels_for(x).sign_compress(x, int(chunk))
    return bits, scales


def sign_ef_compress(
    grad: torch.Tensor, residual: torch.Tensor, chunk: int = 4096, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    bits, scales = kernels_for(grad, residual).sign_ef_compress(grad, residual, int(chunk), float(scale))
    return bits, scales


def sign_decompress_add(
    out: torch.Tensor, bits: torch.Tensor, scales: torch.Tensor, chunk: int = 4096, alpha: float = 1.0
) -> None:
    kernels_for(out, inputs=(bits, scales)).sign_decompress_add(out, bits, scales, int(chunk), float(alpha))


def ef_update(
    residual: torch.Tensor, grad: torch.Tensor, decompressed: torch.Tensor, scale: float = 1.0
) -> None:
    kernels_for(residual, grad, decompressed).ef_update(residual, grad, decompressed, float(scale))


__all__ = [
    "backend",
    "build",
    "build_dir",
    "ef_update",
    "fallback_reason",
    "k_for_density",
    "kernels_for",
    "load",
    "reference",
    "sign_compress",
    "sign_decompress_add",
    "sign_ef_compress",
    "topk_compress",
    "topk_decompress_add",
    "topk_ef_compress",
]
