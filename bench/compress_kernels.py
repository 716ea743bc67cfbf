"""Native gradient-compression kernels vs the pure-torch (``torch.topk``) reference, side by side.

Usage: ``python bench/compress_kernels.py [--numel 10000000] [--density 0.01] [--repeats 5]``.
Prints the median time of each kernel on the native path and on the reference path, and their ratio.
Target (issue 6): native top-k compression of a 10M-element gradient >= 3x faster than ``torch.topk``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import native_ops  # noqa: E402
from native_ops import reference  # noqa: E402


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (allocator, page faults, OpenMP pool)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=10_000_000)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--chunk", type=int, default=4096, help="sign compression: elements per scale")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    native = native_ops.load(build=True)
    if native_ops.backend() != "native":
        print(f"native extension unavailable: {native_ops.fallback_reason()}", file=sys.stderr)
        return 3
    torch.manual_seed(0)
    n = args.numel
    k = native_ops.k_for_density(n, args.density)
    grad = torch.randn(n)
    res_native, res_ref = torch.randn(n) * 0.1, torch.randn(n) * 0.1
    half = torch.float16

    def bare_torch_topk() -> object:
        _, i = torch.topk(grad.abs(), k, sorted=False)
        return i.int(), grad[i].half()

    rows = [
        (
            "topk_compress",
            lambda: native.topk_compress(grad, k, half),
            lambda: reference.topk_compress(grad, k, half),
        ),
        ("topk (bare torch.topk+gather)", lambda: native.topk_compress(grad, k, half), bare_torch_topk),
        (
            "topk_ef_compress (fused EF)",
            lambda: native.topk_ef_compress(grad, res_native, k, half, 1.0),
            lambda: reference.topk_ef_compress(grad, res_ref, k, half, 1.0),
        ),
        (
            "sign_compress",
            lambda: native.sign_compress(grad, args.chunk),
            lambda: reference.sign_compress(grad, args.chunk),
        ),
        (
            "sign_ef_compress (fused EF)",
            lambda: native.sign_ef_compress(grad, res_native, args.chunk, 1.0),
            lambda: reference.sign_ef_compress(grad, res_ref, args.chunk, 1.0),
        ),
    ]
    idx, vals = native.topk_compress(grad, k, half)
    stacked_i, stacked_v = idx.repeat(4, 1), vals.repeat(4, 1)
    out_n, out_r = torch.zeros(n), torch.zeros(n)
    rows.append(
        (
            "topk_decompress_add (4 ranks)",
            lambda: native.topk_decompress_add(out_n, stacked_i, stacked_v, 1.0),
            lambda: reference.topk_decompress_add(out_r, stacked_i, stacked_v, 1.0),
        )
    )
    bits, scales = native.sign_compress(grad, args.chunk)
    sb, ss = bits.repeat(4, 1), scales.repeat(4, 1)
    rows.append(
        (
            "sign_decompress_add (4 ranks)",
            lambda: native.sign_decompress_add(out_n, sb, ss, args.chunk, 1.0),
            lambda: reference.sign_decompress_add(out_r, sb, ss, args.chunk, 1.0),
        )
    )

    print(
        f"numel={n:,} density={args.density} k={k:,} threads={torch.get_num_threads()} "
        f"repeats={args.repeats} (median) backend=native"
    )
    print(f"{'kernel':34s} {'native ms':>10s} {'reference ms':>13s} {'ratio':>7s}")
    ratios = {}
    for name, fn_native, fn_ref in rows:
        t_native = median_seconds(fn_native, args.repeats)
        t_ref = median_seconds(fn_ref, args.repeats)
        ratios[name] = t_ref / t_native
        print(f"{name:34s} {t_native * 1e3:10.2f} {t_ref * 1e3:13.2f} {ratios[name]:6.1f}x")
    dense = 4 * n
    sparse = k * (4 + 2)
    print(
        f"payload: dense fp32 {dense / 1e6:.1f} MB, top-k int32+fp16 {sparse / 1e6:.2f} MB ({dense / sparse:.1f}x fewer)"
    )
    target = ratios["topk_compress"] >= 3.0
    print(
        f"target native top-k >= 3x torch.topk reference: {'met' if target else 'NOT met'} ({ratios['topk_compress']:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
