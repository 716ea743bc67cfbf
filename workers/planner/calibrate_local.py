"""``cann-train calibrate``: measure this machine so that plans for ``cpu`` runs can be checked against
real runs. Imports torch lazily (only this module needs it).

Measures GEMM throughput by shape (fits the planner's GEMM-efficiency curve), streaming memory
bandwidth, and gloo all-reduce time between 2 local processes (fits alpha and bus bandwidth); writes
``cpu.json`` (a device profile) and ``cluster-cpu.json`` (a cluster.json for this machine, 2 "devices" =
2 processes) under ``var/calibration``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .hardware import calibration_dir

PROCESSES = 2
GEMM_SHAPES = [  # (m, n, k): square sweep plus the skinny shapes tensor parallelism produces
    (64, 64, 64),
    (128, 128, 128),
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (1024, 128, 1024),
    (1024, 1024, 128),
    (128, 1024, 1024),
    (2048, 256, 512),
    (1536, 1536, 1536),
]
QUICK_SHAPES = [(64, 64, 64), (256, 256, 256), (512, 512, 512), (1024, 128, 1024), (1024, 1024, 1024)]
ALLREDUCE_BYTES = [4 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20]


def _time(fn, repeat: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_gemm(shapes, repeat: int, dtype: str = "fp32") -> list[dict[str, float]]:
    import torch

    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=tdtype)
        b = torch.randn(k, n, dtype=tdtype)
        t = _time(lambda a=a, b=b: torch.matmul(a, b), repeat)
        out.append({"m": m, "n": n, "k": k, "seconds": t, "tflops": 2.0 * m * n * k / t / 1e12})
    return out


def fit_gemm_curve(points: list[dict[str, float]]) -> tuple[float, float]:
    """(peak TFLOP/s, half-efficiency intensity) of eff = I / (I + I_half), I = mnk/(mk+kn+mn):
    peak is the best measured throughput; I_half the median of I (peak/achieved - 1) over the shapes
    that do not reach the peak (robust to one noisy point)."""
    peak = max(p["tflops"] for p in points)
    halves = []
    for p in points:
        m, n, k = p["m"], p["n"], p["k"]
        intensity = 1.0 / (1.0 / m + 1.0 / n + 1.0 / k)
        eff = p["tflops"] / peak
        if eff < 0.98:
            halves.append(intensity * (1.0 / eff - 1.0))
    return peak, (statistics.median(halves) if halves else 1.0)


def measure_memory_bandwidth(repeat: int) -> float:
    """GB/s of a large tensor copy (read + write)."""
    import torch

    src = torch.empty(16 << 20, dtype=torch.float32).fill_(1.0)  # 64 MiB
    dst = torch.empty_like(src)
    t = _time(lambda: dst.copy_(src), repeat)
    return 2 * src.numel() * 4 / t / 1e9


def _allreduce_worker(rank: int, world: int, port: int, sizes: list[int], repeat: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        dist.all_reduce(x)
        dist.barrier()
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            dist.all_reduce(x)
            samples.append(time.perf_counter() - t0)
        results.append({"bytes": nbytes, "seconds": statistics.median(samples)})
    dist.barrier()
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def measure_allreduce(repeat: int, sizes=ALLREDUCE_BYTES) -> dict[str, Any]:
    """Fit t = alpha + 2(p-1)/p * n / B (ring all-reduce) to gloo all-reduce timings of 2 processes."""
    import numpy as np
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "allreduce.json")
        mp.spawn(
            _allreduce_worker, args=(PROCESSES, port, list(sizes), repeat, out), nprocs=PROCESSES, join=True
        )
        points = json.loads(Path(out).read_text())
    p = PROCESSES
    x = np.array([2 * (p - 1) / p * q["bytes"] for q in points])
    y = np.array([q["seconds"] for q in points])
    slope, alpha = np.polyfit(x, y, 1)
    bw = 1.0 / slope if slope > 0 else float(x[-1] / y[-1])
    alpha_per_step = max(alpha, 1e-6) / (2 * (p - 1))
    return {"points": points, "bus_bandwidth_GBps": bw / 1e9, "latency_us": alpha_per_step * 1e6}


def calibrate(out_dir: str | None = None, quick: bool = False, allreduce: bool = True):
    """Measure, write ``cpu.json`` and ``cluster-cpu.json``; return (profile, written paths)."""
    import psutil
    import torch

    repeat = 3 if quick else 7
    threads = max(1, (os.cpu_count() or 1) // PROCESSES)
    torch.set_num_threads(threads)
    gemm = measure_gemm(QUICK_SHAPES if quick else GEMM_SHAPES, repeat)
    peak, half = fit_gemm_curve(gemm)
    bf16 = measure_gemm([(512, 512, 512)] if quick else [(1024, 1024, 1024)], repeat, "bf16")[0]["tflops"]
    mem_bw = measure_memory_bandwidth(repeat)
    link = measure_allreduce(repeat) if allreduce else None
    memory_gib = psutil.virtual_memory().total / (1 << 30) / PROCESSES
    when = datetime.now(UTC).isoformat(timespec="seconds")
    host = f"{platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    src = f"measured by `cann-train calibrate` on {host} at {when}, {threads} thread(s) per process"

    def e(value, source):
        return {"value": value, "source": source}

    profile = {
        "aliases": ["cpu"],
        "confidence": "measured",
        "note": f"Calibrated profile of this machine; each of {PROCESSES} processes is one 'device'.",
        "peak_tflops": {"fp32": peak, "bf16": max(bf16, 1e-6), "fp16": max(bf16, 1e-6)},
        "memory_GiB": memory_gib,
        "memory_bandwidth_GBps": mem_bw,
        "devices_per_node": PROCESSES,
        "sources": {
            "peak_tflops.fp32": src + " (best GEMM throughput over the shapes)",
            "peak_tflops.bf16": src + " (one square bf16 GEMM)",
            "memory_bandwidth_GBps": src + " (64 MiB tensor copy, read + write)",
            "memory_GiB": "psutil total memory / processes",
        },
        "efficiency": {
            "gemm_max": e(1.0, "peak_tflops is the measured best GEMM throughput"),
            "gemm_half_intensity": e(half, src + "; median fit of eff = I/(I+I_half) over the GEMM shapes"),
            "memory_bandwidth_efficiency": e(1.0, "memory_bandwidth_GBps is measured"),
            "elementwise_traffic": e(1.88, "not measured: the A100 fit (same meaning on any device)"),
            "collective_efficiency_intra": e(1.0, "link bandwidth is the measured gloo bus bandwidth"),
            "collective_efficiency_inter": e(1.0, "link bandwidth is the measured gloo bus bandwidth"),
            "framework_overhead_GiB": e(0.5, "python + torch + gloo resident set, order of magnitude"),
        },
        "measured": {"gemm": gemm, "allreduce": link, "threads_per_process": threads, "at": when},
    }
    bw = link["bus_bandwidth_GBps"] if link else mem_bw / 4
    lat = link["latency_us"] if link else 50.0
    cluster = {
        "name": f"local-cpu-{platform.node() or 'host'}",
        "num_nodes": 1,
        "devices_per_node": PROCESSES,
        "device": {
            "name": "cpu",
            "peak_tflops": profile["peak_tflops"],
            "memory_GiB": round(memory_gib, 2),
            "memory_bandwidth_GBps": round(mem_bw, 2),
            "tdp_watts": None,
        },
        "intra_node": {"kind": "gloo-loopback", "bandwidth_GBps": round(bw, 4), "latency_us": round(lat, 2)},
        "inter_node": {"kind": "gloo-tcp", "bandwidth_GBps": round(bw, 4), "latency_us": round(lat, 2)},
        "tiers": [],
    }
    out = Path(out_dir) if out_dir else calibration_dir()
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "cpu.json", out / "cluster-cpu.json"]
    paths[0].write_text(json.dumps(profile, indent=1))
    paths[1].write_text(json.dumps(cluster, indent=1))
    return profile, [str(p) for p in paths]
