"""``cann-train calibrate``: measure this machine so that plans for ``cpu`` runs can be checked against
real runs. Imports torch lazily (only this module needs it).

Measures GEMM throughput by shape (fits the planner's GEMM-efficiency curve), streaming memory
bandwidth, gloo all-reduce time between 2 local processes (fits alpha and bus bandwidth), and the training
runtime's host-side cost per layer pass and per step (``measure_framework``: on a CPU the dispatcher,
autograd and DTensor cost more than the arithmetic of a small model); writes
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
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workers.planner.hardware import calibration_dir, device_calibration_path

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


def _on_processes(worker, *args) -> Any:
    """Run ``worker(rank, PROCESSES, port, *args, out_path)`` in ``PROCESSES`` spawned processes that meet
    on a free loopback port; returns the JSON rank 0 wrote to ``out_path``."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(PROCESSES, port, *args, out), nprocs=PROCESSES, join=True)
        return json.loads(Path(out).read_text())


def measure_allreduce(repeat: int, sizes=ALLREDUCE_BYTES) -> dict[str, Any]:
    """Fit t = alpha + 2(p-1)/p * n / B (ring all-reduce) to gloo all-reduce timings of 2 processes."""
    import numpy as np

    points = _on_processes(_allreduce_worker, list(sizes), repeat)
    p = PROCESSES
    x = np.array([2 * (p - 1) / p * q["bytes"] for q in points])
    y = np.array([q["seconds"] for q in points])
    slope, alpha = np.polyfit(x, y, 1)
    bw = 1.0 / slope if slope > 0 else float(x[-1] / y[-1])
    alpha_per_step = max(alpha, 1e-6) / (2 * (p - 1))
    return {"points": points, "bus_bandwidth_GBps": bw / 1e9, "latency_us": alpha_per_step * 1e6}


# the probe of measure_framework: a model of the runtime's own blocks far smaller than any example, so
# that its passes are the runtime's host-side cost (dispatch, autograd, DTensor), not arithmetic
PROBE_MODEL = {
    "name": "calibrate-probe",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "ffn_hidden_size": 64,
    "vocab_size": 64,
    "seq_length": 8,
    "activation": "swiglu",
    "moe": None,
}
PROBE_LAYERS = (1, 3)  # the per-layer cost is the slope between these, the rest the intercept
PROBE_BATCHES = (1, 32)  # ... at two batch sizes: the per-pass cost at 0 tokens, and the cost per token


def _framework_worker(rank: int, world: int, port: int, repeat: int, out_path: str) -> None:
    """Both ranks at once (as in a 2-process run, sharing the cores): forward + backward of the probe at
    1 and 3 layers, plain and with the runtime's tensor + sequence parallelism over the 2 ranks
    (``workers.training.parallel.tensor.apply_tp``); the per-step work of the runtime's trainer per
    parameter (float64 gradient norm, AdamW step); and the step's small all-reduce."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from workers.planner.specs import ModelSpec
    from workers.training.model import Transformer
    from workers.training.parallel.data_parallel import apply_ddp
    from workers.training.parallel.tensor import apply_tp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))

    def timed_in_turn(fns: dict[str, object], n: int, setup=None) -> dict[str, float]:
        """Median seconds of each of ``fns``, sampled in turn (one of each per round, ``n`` rounds), each
        sample after an untimed ``setup``: a burst of other work on the machine lands on every configuration
        alike instead of on one's whole series. Measured one after the other, a 3-layer probe once came out
        no slower than the 1-layer one under the long tier's other tests (CI ci6: a layer pass of 0 s)."""
        for fn in fns.values():
            for _ in range(3):
                if setup is not None:
                    setup()
                fn()
        dist.barrier()
        samples: dict[str, list[float]] = {key: [] for key in fns}
        for _ in range(n):
            for key, fn in fns.items():
                if setup is not None:
                    setup()
                t0 = time.perf_counter()
                fn()
                samples[key].append(time.perf_counter() - t0)
        return {key: statistics.median(v) for key, v in samples.items()}

    def timed(fn, n: int, setup=None) -> float:
        """Median seconds of ``fn``, each sample after an untimed ``setup``."""
        return timed_in_turn({"": fn}, n, setup)[""]

    results: dict[str, float] = {}
    for kind in ("plain", "tp", "ddp"):
        probes = {}
        for layers in PROBE_LAYERS:
            model = Transformer.build(ModelSpec.from_dict({**PROBE_MODEL, "num_layers": layers}), 0)
            if kind == "tp":
                apply_tp(model, mesh, True)
            elif kind == "ddp":  # the runtime's DDP wrapper (zero_stage 0): its autograd hooks and buckets
                model, _state = apply_ddp(model, dist.group.WORLD, torch.device("cpu"), [], None, None)
            params = list(model.parameters())
            optimizer = torch.optim.AdamW(params, lr=1e-3)

            def passes(model=model, batch=1):
                tokens = torch.randint(0, PROBE_MODEL["vocab_size"], (batch, PROBE_MODEL["seq_length"]))
                logits = model(tokens)
                logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
                F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()

            def step_work(params=params, optimizer=optimizer):
                total = torch.zeros((), dtype=torch.float64)
                for p in params:
                    g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                    total += torch.linalg.vector_norm(g, dtype=torch.float64).square()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)  # as the trainer: the next backward allocates them

            probes[layers] = (passes, step_work)
        # the passes at both depths and both batches in turn: the per-layer slopes come from one stretch of time
        results.update(
            timed_in_turn(
                {
                    f"{kind}_pass_b{batch}_{layers}": (lambda p=passes, b=batch: p(batch=b))
                    for layers, (passes, _step) in probes.items()
                    for batch in PROBE_BATCHES
                },
                repeat,
            )
        )
        if kind == "ddp":
            continue  # its step is the plain one
        for layers, (passes, step_work) in probes.items():
            # the step's work after an untimed backward, as in training (fresh gradients)
            results[f"{kind}_step_{layers}"] = timed(step_work, repeat, setup=passes)
    small = torch.zeros(5, dtype=torch.float64)
    results["step_collective"] = timed(lambda: dist.all_reduce(small), 2 * repeat)
    # the last DDP module (its reducer holds the group) goes before the group does: left to the
    # interpreter's exit after destroy_process_group, a rank once died of "terminate called without an
    # active exception" (SIGABRT) and failed the calibration after its figures were written
    model = params = optimizer = passes = step_work = probes = None  # (the closures hold them as defaults)
    import gc

    gc.collect()
    dist.barrier()
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def measure_framework(repeat: int) -> dict[str, Any]:
    """The runtime's host-side costs (``workers.planner.hardware.Framework``) on 2 processes: per-layer
    slopes and intercepts of the probe's passes and per-step work, negative intercepts (noise) as 0."""
    raw = _on_processes(_framework_worker, repeat)
    lo, hi = PROBE_LAYERS

    def line(key: str) -> tuple[float, float]:
        a, b = raw[f"{key}_{lo}"], raw[f"{key}_{hi}"]
        slope = max((b - a) / (hi - lo), 0.0)
        return slope, max(a - lo * slope, 0.0)

    b1, b2 = PROBE_BATCHES

    def at_zero_tokens(kind: str) -> tuple[float, float, float]:
        """(layer pass, rest, measured seconds per extra token per layer) extrapolated to no tokens."""
        (l1, e1), (l2, e2) = line(f"{kind}_pass_b{b1}"), line(f"{kind}_pass_b{b2}")
        per_batch = (l2 - l1) / (b2 - b1)
        return max(l1 - b1 * per_batch, 0.0), max(e1 - b1 * (e2 - e1) / (b2 - b1), 0.0), per_batch

    layer, edge, per_batch = at_zero_tokens("plain")
    tp_layer, tp_edge, _tp_per_batch = at_zero_tokens("tp")
    dp_layer, _dp_edge, _dp_per_batch = at_zero_tokens("ddp")  # its rest holds the bucket all-reduce
    step_layer, step_fixed = line("plain_step")
    tp_step_layer, _tp_step_fixed = line("tp_step")
    return {
        "layer_pass_s": layer,
        "edge_pass_s": edge,
        "tp_layer_pass_s": tp_layer,
        "tp_edge_pass_s": tp_edge,
        "dp_layer_pass_s": dp_layer,
        "step_layer_s": step_layer,
        "tp_step_layer_s": tp_step_layer,
        "step_fixed_s": step_fixed,
        "step_collective_s": raw["step_collective"],
        "layer_s_per_sequence": per_batch,
        "raw_s": raw,
    }


def compute_scales(framework: dict[str, Any], profile: dict[str, Any], cluster: dict[str, Any]) -> dict:
    """``compute_scale`` (``hardware.Framework``): the probe's measured seconds per extra sequence per layer
    (plain, one rank) over what the cost model predicts for the same probe on this profile. With tp the
    same slope is below the noise of its ~20 ms passes (DTensor's per-operator cost) and is not used:
    tp layouts take this factor too."""
    from workers.planner.costmodel import CostModel, Layouts
    from workers.planner.hardware import Efficiency, Framework
    from workers.planner.specs import ClusterSpec, ModelSpec, Strategy, TrainingConfig

    b1, b2 = PROBE_BATCHES
    model = ModelSpec.from_dict({**PROBE_MODEL, "num_layers": 1})
    spec = ClusterSpec.from_dict(cluster)

    def modelled(batch: int) -> float:
        strategy = Strategy.from_dict(
            {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "cp": 1, "vpp": 1, "micro_batch_size": batch,
             "recompute": "none", "zero_stage": 0, "sequence_parallel": False},
            partial=False,
        )  # fmt: skip
        cm = CostModel(
            model,
            spec.with_devices(1),
            TrainingConfig(global_batch_size=batch, dtype="fp32", optimizer="adamw"),
            Efficiency.from_profile(profile),
            framework=Framework(),
        )
        L = Layouts.from_strategies([strategy])
        return float(cm.compute_times(L, cm._layer_gemm_times(L))["dense_layer"].ravel()[0])

    per_batch_model = (modelled(b2) - modelled(b1)) / (b2 - b1)
    measured = framework["layer_s_per_sequence"]
    scale = min(max(measured / per_batch_model, 0.1), 100.0) if per_batch_model > 0 else 1.0
    return {"compute_scale": scale}


CALIBRATION_STAGES = (
    ("gemm", "GEMM throughput by shape (fp32)", 0.35),
    ("bf16", "a bf16 GEMM", 0.05),
    ("memory", "memory bandwidth", 0.05),
    ("allreduce", "gloo all-reduce between 2 processes", 0.15),
    ("framework", "the runtime's own layers, DDP and tp 2 (2 processes)", 0.40),
)
"""The measurements in order, with what each is and its rough share of the time (the progress a caller is
told: measured here, full run, 2 cores)."""


def calibrate(
    out_dir: str | None = None,
    quick: bool = False,
    allreduce: bool = True,
    progress: Callable[[str, str, float], None] | None = None,
):
    """Measure, write ``cpu.json`` and ``cluster-cpu.json``; return (profile, written paths). ``progress(stage,
    what, fraction done)`` is called before each of :data:`CALIBRATION_STAGES` and at the end ("done")."""
    import psutil
    import torch

    done = 0.0

    def stage(name: str) -> None:
        nonlocal done
        if progress is not None:
            what, share = next((w, f) for n, w, f in CALIBRATION_STAGES if n == name)
            progress(name, what, round(done, 3))
            done += share

    repeat = 3 if quick else 7
    threads = max(1, (os.cpu_count() or 1) // PROCESSES)
    torch.set_num_threads(threads)
    stage("gemm")
    gemm = measure_gemm(QUICK_SHAPES if quick else GEMM_SHAPES, repeat)
    peak, half = fit_gemm_curve(gemm)
    stage("bf16")
    bf16 = measure_gemm([(512, 512, 512)] if quick else [(1024, 1024, 1024)], repeat, "bf16")[0]["tflops"]
    stage("memory")
    mem_bw = measure_memory_bandwidth(repeat)
    if allreduce:
        stage("allreduce")
    link = measure_allreduce(repeat) if allreduce else None
    if allreduce:
        stage("framework")
    framework = measure_framework(10 if quick else 40) if allreduce else None
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
        "measured": {
            "gemm": gemm,
            "allreduce": link,
            "framework": framework,
            "threads_per_process": threads,
            "at": when,
        },
    }
    if framework is not None:
        how = (
            f"{src}; both processes at once, median of {10 if quick else 40} (the four passes of a layout in turn); a probe of the runtime's own "
            f"Transformer (hidden {PROBE_MODEL['hidden_size']}, {PROBE_MODEL['seq_length']} tokens) at "
            f"{PROBE_LAYERS[0]} and {PROBE_LAYERS[1]} layers and {PROBE_BATCHES[0]} and {PROBE_BATCHES[1]} "
            "sequences: slope per layer, intercept for the rest, extrapolated to no tokens"
        )
        profile["framework"] = {
            name: e(value, f"{how} ({what})")
            for name, what in (
                ("layer_pass_s", "forward + backward, per layer"),
                ("edge_pass_s", "forward + backward of embedding, norm, head and loss"),
                ("tp_layer_pass_s", "forward + backward per layer, tp 2 + sequence parallel, collectives in"),
                ("tp_edge_pass_s", "the same intercept with tp 2"),
                ("dp_layer_pass_s", "forward + backward per layer under the runtime's DDP over the 2 ranks"),
                ("step_layer_s", "float64 gradient norm + AdamW step, per layer"),
                ("tp_step_layer_s", "the same on DTensor parameters, tp 2"),
                ("step_fixed_s", "gradient norm + AdamW step of the rest"),
                ("step_collective_s", "one all-reduce of 5 float64"),
            )
            for value in (framework[name],)
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
    if framework is not None:
        for name, value in compute_scales(framework, profile, cluster).items():
            profile["framework"][name] = e(
                value,
                f"{how} (measured seconds per extra sequence per layer / the cost model's for the probe)",
            )
    out = Path(out_dir) if out_dir else calibration_dir()
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "cpu.json", out / "cluster-cpu.json"]
    paths[0].write_text(json.dumps(profile, indent=1))
    paths[1].write_text(json.dumps(cluster, indent=1))
    if progress is not None:
        progress("done", "written", 1.0)
    return profile, [str(p) for p in paths]


# Maximum-achievable-matmul sweep for an accelerator (Bekman's mamf-finder idea, a few shapes instead of a
# brute-force grid): large bf16 GEMMs, the shapes the MAMF table found best on A100 / H100 among them
ACCELERATOR_SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (1024, 10240, 5120),
    (2048, 2048, 13312),
    (6144, 17920, 2816),
    (8192, 2048, 8192),
    (16384, 8192, 1024),
]
QUICK_ACCELERATOR_SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048)]


def measure_matmul(kind: str, shapes=None, warmup: int = 10, iterations: int = 50) -> dict[str, Any]:
    """Best bf16 matmul throughput on the first ``kind`` device (``cuda`` / ``npu``, or ``cpu`` for a
    check of the mechanics): per shape the mean of ``iterations`` after ``warmup``, timed between device
    synchronisations (MAMF methodology: Bekman, ml-engineering, compute/accelerator/benchmarks)."""
    from workers.devices.backend import select_device, synchronize

    choice = select_device(kind)  # DeviceUnavailable (with the reason) when the hardware is absent
    import torch

    device = choice.device_for_local_rank(0)
    points = []
    for m, n, k in shapes or ACCELERATOR_SHAPES:
        a = torch.randn(m, k, dtype=torch.bfloat16, device=device)
        b = torch.randn(k, n, dtype=torch.bfloat16, device=device)
        for _ in range(warmup):
            torch.matmul(a, b)
        synchronize(choice.kind)
        t0 = time.perf_counter()
        for _ in range(iterations):
            torch.matmul(a, b)
        synchronize(choice.kind)
        seconds = (time.perf_counter() - t0) / iterations
        points.append({"m": m, "n": n, "k": k, "tflops": 2.0 * m * n * k / seconds / 1e12})
        del a, b
    best = max(points, key=lambda p: p["tflops"])
    return {"kind": choice.kind, "device_name": choice.name, "points": points, "best": best}


def calibrate_device(
    kind: str, out_dir: str | None = None, quick: bool = False, shapes=None
) -> tuple[dict[str, Any], str]:
    """Measure an accelerator's achievable matmul fraction of its datasheet bf16 peak and write it for
    the planner (``hardware.device_calibration_path``); returns (the document, its path). The profile is the one the
    device's name matches (``hardware.find_profile``); the datasheet peak is that profile's."""
    from workers.planner.hardware import find_profile

    shapes = shapes or (QUICK_ACCELERATOR_SHAPES if quick else None)
    found = measure_matmul(kind, shapes, warmup=3 if quick else 10, iterations=10 if quick else 50)
    name, profile = find_profile(found["device_name"])
    peak = profile.get("peak_tflops", {}).get("bf16")
    if not peak:
        raise ValueError(
            f"the device {found['device_name']!r} matches the {name!r} profile, which has no datasheet bf16 "
            "peak to measure a fraction of: add the device to workers/planner/data/hardware_profiles.json"
        )
    best = found["best"]
    when = datetime.now(UTC).isoformat(timespec="seconds")
    doc = {
        "profile": name,
        "device_name": found["device_name"],
        "achievable_matmul": {
            "value": round(best["tflops"] / float(peak), 4),
            "confidence": "measured",
            "source": (
                f"measured by `cann-train calibrate --device {kind}` on {found['device_name']} at {when}: best "
                f"{best['tflops']:.1f} of {peak:g} TFLOP/s bf16 (shape {best['m']}x{best['n']}x{best['k']}, "
                f"mean of {10 if quick else 50} iterations over {len(found['points'])} shapes)"
            ),
        },
        "measured": found,
    }
    path = device_calibration_path(name, out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return doc, str(path)
