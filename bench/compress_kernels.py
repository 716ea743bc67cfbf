"""Gradient-compression kernels side by side: the C++/OpenMP kernels on the CPU vs the pure-torch path.

Usage: ``python bench/compress_kernels.py [--device cpu|cuda|npu] [--numel 10000000] [--density 0.01]
[--repeats 5]``.

- ``--device cpu`` (default): native kernels vs the pure-torch (``torch.topk``) reference, both on the CPU.
  Target (issue 6): native top-k compression of a 10M-element gradient >= 3x faster than ``torch.topk``.
- ``--device cuda`` / ``npu``: native kernels on CPU tensors vs the device path the hooks take for buckets
  on that device (the same pure-torch kernels, on device tensors; timed with the device synchronized),
  then a check that the device results equal the CPU kernels'. Skips with a message (exit 0) when the
  device is absent.

Prints the median time of each kernel on both paths and their ratio, right / left (> 1: the C++ kernels
are faster).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
from harness import bench_parser

import native_ops
from native_ops import reference


def device_unavailable(device: str) -> str:
    """Why ``device`` cannot be benchmarked here, or ``""`` if it can."""
    if device == "cpu":
        return ""
    if device == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu; not autoloaded when TORCH_DEVICE_BACKEND_AUTOLOAD=0)
        except ImportError:
            return "torch_npu is not installed"
    module = getattr(torch, device, None)
    if module is None or not module.is_available():
        return f"torch.{device}.is_available() is False"
    return ""


def synchronizer(device: str) -> Callable[[], None]:
    """Waits for the device's queued kernels (a no-op on the CPU): device ops return before they finish."""
    if device == "cpu":
        return lambda: None
    return getattr(torch, device).synchronize


def median_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up (allocator, page faults, OpenMP pool, device kernels' first launch)
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def device_matches_cpu(native, device: str, n: int, k: int, chunk: int) -> list[str]:
    """Mismatches between the device path and the CPU kernels on one error-feedback round (empty: none)."""
    g = torch.Generator().manual_seed(1)
    grad, residual = torch.randn(n, generator=g), torch.randn(n, generator=g) * 0.1
    res_cpu, res_dev = residual.clone(), residual.to(device)
    grad_dev = grad.to(device)
    problems = []
    idx, vals = native.topk_ef_compress(grad, res_cpu, k, torch.float16, 0.5)
    d_idx, d_vals = reference.topk_ef_compress(grad_dev, res_dev, k, torch.float16, 0.5)
    if not (torch.equal(idx, d_idx.cpu()) and torch.equal(vals, d_vals.cpu())):
        problems.append("topk_ef_compress indices/values")
    if not torch.equal(res_cpu, res_dev.cpu()):
        problems.append("topk_ef_compress residual")
    res_cpu, res_dev = residual.clone(), residual.to(device)
    bits, scales = native.sign_ef_compress(grad, res_cpu, chunk, 0.5)
    d_bits, d_scales = reference.sign_ef_compress(grad_dev, res_dev, chunk, 0.5)
    if not torch.equal(bits, d_bits.cpu()):
        problems.append("sign_ef_compress bits")
    if not torch.allclose(scales, d_scales.cpu(), rtol=1e-6, atol=0) or not torch.allclose(
        res_cpu, res_dev.cpu(), rtol=0, atol=1e-6
    ):
        problems.append("sign_ef_compress scales/residual")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cpu")
    parser.add_argument("--numel", type=int, default=10_000_000)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--chunk", type=int, default=4096, help="sign compression: elements per scale")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    device = args.device
    missing = device_unavailable(device)
    if missing:
        print(f"skipped: no {device} device here ({missing}); nothing timed")
        return 0
    native = native_ops.load(build=True)
    if native_ops.backend() != "native":
        print(f"native extension unavailable: {native_ops.fallback_reason()}", file=sys.stderr)
        return 3
    sync = synchronizer(device)
    torch.manual_seed(0)
    n = args.numel
    k = native_ops.k_for_density(n, args.density)
    grad = torch.randn(n)
    res_native = torch.randn(n) * 0.1
    res_ref = res_native.clone()
    half = torch.float16
    # Right-hand column: the pure-torch kernels on `device` (the reference on the CPU, the device path else).
    d_grad, d_res = grad.to(device), res_ref.to(device)

    def bare_torch_topk() -> object:
        _, i = torch.topk(d_grad.abs(), k, sorted=False)
        return i.int(), d_grad[i].half()

    rows = [
        (
            "topk_compress",
            lambda: native.topk_compress(grad, k, half),
            lambda: reference.topk_compress(d_grad, k, half),
        ),
        ("topk (bare torch.topk+gather)", lambda: native.topk_compress(grad, k, half), bare_torch_topk),
        (
            "topk_ef_compress (fused EF)",
            lambda: native.topk_ef_compress(grad, res_native, k, half, 1.0),
            lambda: reference.topk_ef_compress(d_grad, d_res, k, half, 1.0),
        ),
        (
            "sign_compress",
            lambda: native.sign_compress(grad, args.chunk),
            lambda: reference.sign_compress(d_grad, args.chunk),
        ),
        (
            "sign_ef_compress (fused EF)",
            lambda: native.sign_ef_compress(grad, res_native, args.chunk, 1.0),
            lambda: reference.sign_ef_compress(d_grad, d_res, args.chunk, 1.0),
        ),
    ]
    idx, vals = native.topk_compress(grad, k, half)
    stacked_i, stacked_v = idx.repeat(4, 1), vals.repeat(4, 1)
    d_stacked_i, d_stacked_v = stacked_i.to(device), stacked_v.to(device)
    out_n, out_r = torch.zeros(n), torch.zeros(n, device=device)
    rows.append(
        (
            "topk_decompress_add (4 ranks)",
            lambda: native.topk_decompress_add(out_n, stacked_i, stacked_v, 1.0),
            lambda: reference.topk_decompress_add(out_r, d_stacked_i, d_stacked_v, 1.0),
        )
    )
    bits, scales = native.sign_compress(grad, args.chunk)
    sb, ss = bits.repeat(4, 1), scales.repeat(4, 1)
    d_sb, d_ss = sb.to(device), ss.to(device)
    rows.append(
        (
            "sign_decompress_add (4 ranks)",
            lambda: native.sign_decompress_add(out_n, sb, ss, args.chunk, 1.0),
            lambda: reference.sign_decompress_add(out_r, d_sb, d_ss, args.chunk, 1.0),
        )
    )

    right = "reference ms" if device == "cpu" else f"{device} torch ms"
    print(
        f"numel={n:,} density={args.density} k={k:,} threads={torch.get_num_threads()} "
        f"repeats={args.repeats} (median) backend=native device={device}"
    )
    if device != "cpu":
        print(
            f"{device}: {getattr(torch, device).get_device_name()}; left column = C++ kernels on CPU tensors"
        )
    print(f"{'kernel':34s} {'native ms':>10s} {right:>13s} {'ratio':>7s}")
    ratios = {}
    for name, fn_native, fn_right in rows:
        t_native = median_seconds(fn_native, args.repeats, lambda: None)
        t_right = median_seconds(fn_right, args.repeats, sync)
        ratios[name] = t_right / t_native
        print(f"{name:34s} {t_native * 1e3:10.2f} {t_right * 1e3:13.2f} {ratios[name]:6.1f}x")
    dense = 4 * n
    sparse = k * (4 + 2)
    print(
        f"payload: dense fp32 {dense / 1e6:.1f} MB, top-k int32+fp16 {sparse / 1e6:.2f} MB ({dense / sparse:.1f}x fewer)"
    )
    if device == "cpu":
        target = ratios["topk_compress"] >= 3.0
        print(
            f"target native top-k >= 3x torch.topk reference: {'met' if target else 'NOT met'} ({ratios['topk_compress']:.1f}x)"
        )
        return 0
    m = min(n, 1_000_003)
    problems = device_matches_cpu(native, device, m, native_ops.k_for_density(m, args.density), args.chunk)
    print(
        f"{device} path == CPU kernels (one EF round): {'yes' if not problems else 'NO: ' + ', '.join(problems)}"
    )
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
