"""``cann-train calibrate``: measure this machine so that plans for ``cpu`` runs can be checked against
real runs. Imports torch lazily (only this module needs it).

Measures GEMM throughput by shape (fits the planner's GEMM-efficiency curve), streaming memory
bandwidth, gloo all-reduce time between 2 local processes (the latency floor of small collectives and the
bus bandwidth), and the training runtime's host-side cost per layer pass and per step under each of its
wrappers and recompute modes (``measure_framework``: on a CPU the dispatcher, autograd, DTensor, the
wrappers' hooks and their collectives' start-up cost more than the arithmetic of a small model); writes
``cpu.json`` (a device profile) and ``cluster-cpu.json`` (a cluster.json for this machine, 2 "devices" =
2 processes) under ``var/calibration``.
"""

from __future__ import annotations

import contextlib
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
SMALL_COLLECTIVE = 64 << 10  # at most this many bytes: the latency floor (start-up) of a collective
SMALL_REPEAT = 10  # times the repeats for those


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
        for _ in range(3):  # the group's first collectives set up its connections
            dist.all_reduce(x)
        dist.barrier()
        samples = []
        # a small buffer's time is the start-up alone: cheap, and noisy over few samples (one round's 4 KiB
        # median came out several times the others')
        for _ in range(repeat * (SMALL_REPEAT if nbytes <= SMALL_COLLECTIVE else 1)):
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
    """Alpha and bus bandwidth of t = 2(p-1) alpha + 2(p-1)/p * n / B (ring all-reduce) from gloo all-reduce
    timings of 2 processes: B from the two largest buffers (their difference: the start-up cancels), alpha
    from the small buffers (at most ``SMALL_COLLECTIVE``: the least of their medians, their bandwidth share
    taken out, is the floor every small collective pays). A straight-line fit over all sizes let one noisy middle size move alpha
    2x (736 against the 4 KiB all-reduce's 415 us measured alongside it)."""
    points = _on_processes(_allreduce_worker, list(sizes), repeat)
    p = PROCESSES
    share = 2 * (p - 1) / p
    (n1, t1), (n2, t2) = sorted((q["bytes"], q["seconds"]) for q in points)[-2:]
    bw = share * (n2 - n1) / (t2 - t1) if t2 > t1 else share * n2 / t2
    small = [q["seconds"] - share * q["bytes"] / bw for q in points if q["bytes"] <= SMALL_COLLECTIVE]
    alpha = max(min(small) if small else min(q["seconds"] for q in points), 1e-6)
    return {"points": points, "bus_bandwidth_GBps": bw / 1e9, "latency_us": alpha / (2 * (p - 1)) * 1e6}


# the probe of measure_framework: a model of the runtime's own blocks far smaller than any example, so
# that its passes are the runtime's host-side cost (dispatch, autograd, DTensor, hooks and the collectives'
# start-up), not arithmetic
PROBE_MODEL = {
    "name": "calibrate-probe",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "ffn_hidden_size": 64,
    "vocab_size": 256,  # the runtime's least (byte tokens: workers.training.config.parse_model)
    "seq_length": 8,
    "activation": "swiglu",
    "moe": None,
}
# the MoE probe (expert parallelism): every block a MoE block of the runtime's own kind (shared expert in)
PROBE_MOE = {
    "num_experts": 4,
    "top_k": 2,
    "expert_ffn_hidden_size": 32,
    "num_shared_experts": 1,
    "first_dense_layers": 0,
    "layer_frequency": 1,
    "capacity_factor": 1.25,
    "load_imbalance": 1.0,
}
PROBE_LAYERS = (1, 3)  # the per-layer cost is the slope between these, the rest the intercept
PROBE_BATCHES = (1, 32)  # ... at two batch sizes: the per-pass cost at 0 tokens, and the cost per token
# The runtime's wrappings the probe runs, as the layout of the 2 ranks that ``parallelize`` turns into it
# (``None``: a model per rank, no wrapper), the profile's prefix of each one's figures, and the recompute
# modes measured (activation checkpointing's host cost differs by wrapper: the selective policy runs every
# operator of the block under a dispatch mode, DTensor's too).
PROBE_KINDS = {
    "plain": (None, "", ("none", "selective", "full")),
    "dp": ({"dp": 2}, "dp_", ("none", "selective", "full")),  # DDP: zero 0, tp 1
    "tp": ({"tp": 2, "sequence_parallel": True}, "tp_", ("none", "selective", "full")),
    "fsdp": ({"dp": 2, "zero_stage": 3}, "fsdp_", ("none", "selective", "full")),  # FSDP2, ZeRO-3
    "ep": ({"dp": 2, "ep": 2}, "ep_", ("none",)),  # the MoE probe: experts split by all-to-all, DDP
}
# the step's work differs with the parameters' kind: plain, DTensor, sharded
SYNCED_KINDS = ("dp", "fsdp")  # data parallel: gradients reduced in the backward of a step's last micro-batch
STEP_KINDS = ("plain", "tp", "fsdp")
# the kinds whose intercept is the embedding, head and loss (under ep, DDP's also holds its one bucket's
# all-reduce: a run does it once per step, not per micro-batch; ep layouts take the plain figure)
EDGE_KINDS = ("plain", "dp", "tp", "fsdp")


KIND_WHAT = {
    "plain": "one model per rank, no wrapper",
    "dp": "the runtime's DDP over the 2 ranks, no_sync as before a step's last micro-batch",
    "tp": "tp 2 + sequence parallel (DTensor), its collectives in",
    "fsdp": "FSDP2 ZeRO-3 over the 2 ranks, its parameter gathers in, gradient sync off as before a step's last micro-batch",
    "ep": "the MoE probe, experts split over the 2 ranks (its all-to-alls in), DDP for the rest",
}


def framework_fields() -> list[tuple[str, str]]:
    """(name, what it is) of every figure :func:`measure_framework` writes to the profile's ``framework``
    section (``workers.planner.hardware.Framework`` reads them)."""
    out = []
    for kind, (_layout, prefix, modes) in PROBE_KINDS.items():
        name = "moe_layer_pass" if kind == "ep" else "layer_pass"
        for recompute in modes:
            suffix = "" if recompute == "none" else f"_{recompute}"
            how = "" if recompute == "none" else f", {recompute} recompute"
            out.append((f"{prefix}{name}{suffix}_s", f"forward + backward per layer{how}; {KIND_WHAT[kind]}"))
        if kind in EDGE_KINDS:
            out.append(
                (
                    f"{prefix}edge_pass_s",
                    f"forward + backward of embedding, norm, head and loss; {KIND_WHAT[kind]}",
                )
            )
    for kind in STEP_KINDS:
        prefix = PROBE_KINDS[kind][1]
        what = "the trainer's step work (pending reductions, float64 gradient norm, clipping, its AdamW)"
        out.append((f"{prefix}step_layer_s", f"{what} per layer; {KIND_WHAT[kind]}"))
        out.append((f"{prefix}step_fixed_s", f"{what} of the rest; {KIND_WHAT[kind]}"))
    for kind in SYNCED_KINDS:
        prefix = PROBE_KINDS[kind][1]
        what = "the gradients' reduction in the backward of a step's last micro-batch (passes with gradient sync less those without)"
        out.append((f"{prefix}reduce_layer_s", f"{what}, per layer; {KIND_WHAT[kind]}"))
        out.append((f"{prefix}reduce_fixed_s", f"{what}, of the rest; {KIND_WHAT[kind]}"))
    out.append(("step_collective_s", "one all-reduce of 5 float64"))
    out.append(
        (
            "two_process_contention",
            "the plain passes with both ranks at once / with one alone (the other idle in a barrier): a factor",
        )
    )
    return out


def _probe_part(kind: str, layers: int, recompute: str, world: int, rank: int):
    """(model part, ParallelModel or None) of the probe at ``layers`` layers under ``kind`` and
    ``recompute``, built as the runtime builds a run: ``parallelize`` (plain: the model and its activation
    checkpointing, one per rank)."""
    import torch

    from workers.planner.specs import ModelSpec
    from workers.training.config import JobConfig
    from workers.training.model import Transformer
    from workers.training.parallelize import apply_ac, parallelize

    layout, _prefix, _modes = PROBE_KINDS[kind]
    model_doc = {**PROBE_MODEL, "num_layers": layers}
    if kind == "ep":
        model_doc["moe"] = PROBE_MOE
    model = Transformer.build(ModelSpec.from_dict(model_doc), 0)
    if layout is None:
        if recompute != "none":
            apply_ac(model, recompute)
        return model, None
    cfg = JobConfig.from_dict(
        {
            "model": model_doc,
            "strategy": {**layout, "recompute": recompute, "micro_batch_size": 1},
            "training": {"global_batch_size": layout.get("dp", 1), "dtype": "fp32", "optimizer": "adamw"},
            "steps": 1,
            "device": "cpu",
        }
    )
    pm = parallelize(model, cfg, torch.device("cpu"), world, rank)
    return pm.parts[0], pm


def _framework_worker(rank: int, world: int, port: int, repeat: int, out_path: str) -> None:
    """Both ranks at once (as in a 2-process run, sharing the cores): forward + backward of the probe at
    1 and 3 layers under each of :data:`PROBE_KINDS` (the runtime's ``parallelize``: DDP, tensor +
    sequence parallel, FSDP2 ZeRO-3, expert parallel), each recompute mode, the plain probe also at 32
    sequences; the per-step work of the trainer (``finish_grads``, float64 gradient norm, clipping, the
    trainer's own optimizer) on plain, DTensor and sharded parameters; and the step's small all-reduce."""
    import torch
    import torch.distributed as dist

    from workers.training.optimizer import build_optimizer, scale_gradients
    from workers.training.parallelize import cross_entropy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def timed_in_turn(fns: dict[str, object], n: int, setup=None, together: bool = True) -> dict[str, float]:
        """Median seconds of each of ``fns``, sampled in turn (one of each per round, ``n`` rounds), each
        sample after an untimed ``setup``: a burst of other work on the machine lands on every configuration
        alike instead of on one's whole series. Measured one after the other, a 3-layer probe once came out
        no slower than the 1-layer one under the long tier's other tests (CI ci6: a layer pass of 0 s).
        ``together``: both ranks start at once (a barrier after the warm-up); else this rank alone."""
        for fn in fns.values():
            for _ in range(3):
                if setup is not None:
                    setup()
                fn()
        if together:
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

    def passes(part, batch: int, unsynced: bool = False) -> None:
        """The trainer's forward + backward of one micro-batch (``Trainer._forward_backward``); ``unsynced``:
        of one before a step's last, under DDP's ``no_sync`` (FSDP2's is set on the module)."""
        tokens = torch.randint(0, PROBE_MODEL["vocab_size"], (batch, PROBE_MODEL["seq_length"]))
        with part.no_sync() if unsynced else contextlib.nullcontext():
            cross_entropy(part(tokens), tokens).backward()

    def step_work(part, pm, optimizer) -> None:
        """The trainer's step after the backward (``Trainer.train_step``), its small all-reduce left out:
        pending reductions, the gradient norm, clipping (the examples' norms exceed ``grad_clip``), AdamW."""
        params = list(part.parameters())
        if pm is not None:
            pm.finish_grads()
            pm.grad_sq_local(torch.device("cpu"))
        else:
            total = torch.zeros((), dtype=torch.float64)
            for p in params:
                total += torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float64).square()
        scale_gradients(params, 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # as the trainer: the next backward allocates them

    results: dict[str, float] = {}
    keep = []  # every probe until the group goes (a DDP reducer or FSDP state freed after it can abort)
    for kind, (_layout, _prefix, modes) in PROBE_KINDS.items():
        fns, steps = {}, {}
        # DDP and FSDP2 reduce the gradients in the backward of a step's last micro-batch only: their passes
        # are measured without (as the others), and once more with ("sync", whose step work follows)
        for mode in (*modes, "sync") if kind in SYNCED_KINDS else modes:
            recompute = "none" if mode == "sync" else mode
            for layers in PROBE_LAYERS:
                part, pm = _probe_part(kind, layers, recompute, world, rank)
                keep.append((part, pm))
                if kind == "fsdp" and mode != "sync":
                    part.set_requires_gradient_sync(False)  # as Trainer._forward_backward before the last
                unsynced = kind == "dp" and mode != "sync"
                batches = PROBE_BATCHES if (kind == "plain" and mode == "none") else PROBE_BATCHES[:1]
                for batch in batches:
                    fns[f"{kind}_{mode}_b{batch}_{layers}"] = lambda part=part, batch=batch, u=unsynced: (
                        passes(part, batch, u)
                    )
                if kind in STEP_KINDS and mode == ("sync" if kind in SYNCED_KINDS else "none"):
                    optimizer = build_optimizer(
                        list(part.parameters()), "adamw", 1e-3, 0.0, torch.device("cpu")
                    )
                    keep.append(optimizer)
                    steps[layers] = (part, pm, optimizer)
        # a kind's passes at both depths, every mode and batch in turn: its slopes come from one stretch of time
        results.update(timed_in_turn(fns, repeat))
        if kind == "plain":
            # the same passes with the other rank idle (waiting in a barrier): a run of one process has the
            # machine to itself, the figures above share it (the two-process contention)
            alone = {key: fn for key, fn in fns.items() if key.startswith("plain_none_")}
            dist.barrier()
            if rank == 0:
                results.update(
                    {f"alone_{k}": v for k, v in timed_in_turn(alone, repeat, together=False).items()}
                )
            dist.barrier()
        for layers, (part, pm, optimizer) in steps.items():
            # the step's work after an untimed backward, as in training (fresh gradients)
            results[f"{kind}_step_{layers}"] = timed(
                lambda part=part, pm=pm, optimizer=optimizer: step_work(part, pm, optimizer),
                repeat,
                setup=lambda part=part: passes(part, PROBE_BATCHES[0]),
            )
    small = torch.zeros(5, dtype=torch.float64)
    results["step_collective"] = timed(lambda: dist.all_reduce(small), 2 * repeat)
    # the last DDP module (its reducer holds the group) goes before the group does: left to the
    # interpreter's exit after destroy_process_group, a rank once died of "terminate called without an
    # active exception" (SIGABRT) and failed the calibration after its figures were written
    keep = fns = steps = part = pm = optimizer = None
    import gc

    gc.collect()
    dist.barrier()
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def measure_framework(repeat: int) -> dict[str, Any]:
    """The runtime's host-side costs (``workers.planner.hardware.Framework``) on 2 processes: per kind of
    :data:`PROBE_KINDS` (prefix) and recompute mode the per-layer slope and the intercept of the probe's
    passes, extrapolated to no tokens with the plain probe's cost per sequence (the one measured at two
    batch sizes), and the per-layer slope and intercept of the step's work; negative values (noise) as 0."""
    raw = _on_processes(_framework_worker, repeat)
    lo, hi = PROBE_LAYERS
    b1, b2 = PROBE_BATCHES

    def line(key: str) -> tuple[float, float]:
        a, b = raw[f"{key}_{lo}"], raw[f"{key}_{hi}"]
        slope = (b - a) / (hi - lo)
        return slope, a - lo * slope

    (l1, e1), (l2, e2) = line(f"plain_none_b{b1}"), line(f"plain_none_b{b2}")
    per_layer_sequence, per_edge_sequence = (l2 - l1) / (b2 - b1), (e2 - e1) / (b2 - b1)
    out: dict[str, Any] = {}
    for kind, (_layout, prefix, modes) in PROBE_KINDS.items():
        for recompute in modes:
            layer, edge = line(f"{kind}_{recompute}_b{b1}")
            suffix = "" if recompute == "none" else f"_{recompute}"
            name = "moe_layer_pass" if kind == "ep" else "layer_pass"
            out[f"{prefix}{name}{suffix}_s"] = max(layer - b1 * per_layer_sequence, 0.0)
            if recompute == "none" and kind in EDGE_KINDS:
                out[f"{prefix}edge_pass_s"] = max(edge - b1 * per_edge_sequence, 0.0)
    for kind in STEP_KINDS:
        prefix = PROBE_KINDS[kind][1]
        slope, fixed = line(f"{kind}_step")
        out[f"{prefix}step_layer_s"], out[f"{prefix}step_fixed_s"] = max(slope, 0.0), max(fixed, 0.0)
    for (
        kind
    ) in SYNCED_KINDS:  # the reduction of the last micro-batch: its passes with gradient sync less without
        prefix = PROBE_KINDS[kind][1]
        (synced, synced_edge), (unsynced, unsynced_edge) = (
            line(f"{kind}_sync_b{b1}"),
            line(f"{kind}_none_b{b1}"),
        )
        out[f"{prefix}reduce_layer_s"] = max(synced - unsynced, 0.0)
        out[f"{prefix}reduce_fixed_s"] = max(synced_edge - unsynced_edge, 0.0)
    # both ranks at once over one alone, the plain passes: what sharing the cores costs a 2-process run
    both = sum(raw[f"plain_none_b{b}_{n}"] for b in PROBE_BATCHES for n in PROBE_LAYERS)
    alone = sum(raw[f"alone_plain_none_b{b}_{n}"] for b in PROBE_BATCHES for n in PROBE_LAYERS)
    out["two_process_contention"] = both / alone
    out["step_collective_s"] = raw["step_collective"]
    out["layer_s_per_sequence"] = per_layer_sequence
    out["raw_s"] = raw
    return out


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
    ("gemm", "GEMM throughput by shape (fp32)", 0.26),
    ("bf16", "a bf16 GEMM", 0.04),
    ("memory", "memory bandwidth", 0.04),
    ("allreduce", "gloo all-reduce between 2 processes", 0.11),
    (
        "framework",
        "the runtime's own layers: plain, DDP, tp 2, FSDP2 and expert parallel (2 processes)",
        0.55,
    ),
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
    framework_repeat = 10 if quick else 40
    framework = measure_framework(framework_repeat) if allreduce else None
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
            f"{src}; both processes at once, median of {framework_repeat} (a kind's passes in turn); a probe of the "
            f"runtime's own Transformer (hidden {PROBE_MODEL['hidden_size']}, {PROBE_MODEL['seq_length']} tokens) "
            f"built by the runtime's parallelize, at {PROBE_LAYERS[0]} and {PROBE_LAYERS[1]} layers: slope per "
            f"layer, intercept for the rest, extrapolated to no tokens with the plain probe's cost per sequence "
            f"({PROBE_BATCHES[0]} and {PROBE_BATCHES[1]} sequences)"
        )
        profile["framework"] = {
            name: e(framework[name], f"{how} ({what})")
            for name, what in framework_fields()
            if name in framework
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
