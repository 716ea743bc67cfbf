"""Device profiles: the calibrated efficiency constants the cost model needs next to the datasheet
figures a ``cluster.json`` already carries.

Profiles are data (``data/hardware_profiles.json``, one source per number). A cluster's device is
matched by name (case-insensitive, aliases allowed); ``cpu`` comes from ``var/calibration/cpu.json``
written by ``cann-train calibrate`` when present, else from the shipped, clearly-labelled default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
PROFILES_PATH = DATA_DIR / "hardware_profiles.json"


def calibration_dir() -> Path:
    """Where ``cann-train calibrate`` writes: ``$CANN_TRAIN_VAR/calibration``, else the control plane's var
    directory's (``$CANN_TRAIN_VAR_DIR/calibration``: the app's processes, which calibrate from the
    planner page, read and write the same), else ``<repo>/var/calibration``."""
    root = os.environ.get("CANN_TRAIN_VAR") or os.environ.get("CANN_TRAIN_VAR_DIR")
    if root:
        return Path(root) / "calibration"
    return Path(__file__).resolve().parents[2] / "var" / "calibration"


@dataclass(frozen=True)
class Efficiency:
    """Achieved-versus-peak constants of one device, the only calibrated numbers in the cost model."""

    gemm_max: float
    """Fraction of dense peak a large, well-shaped GEMM reaches."""
    gemm_half_intensity: float
    """Arithmetic intensity (FLOP per byte of 16-bit operands, MNK/(MK+KN+MN)) at which a GEMM reaches
    half of ``gemm_max``: eff = gemm_max * I / (I + I_half). Equivalent to charging the operand bytes at
    an effective bandwidth of peak * gemm_max / I_half on top of the compute time."""
    memory_bandwidth_efficiency: float
    """Fraction of datasheet memory bandwidth that streaming (elementwise) kernels reach."""
    elementwise_traffic: float
    """Bytes of device-memory traffic of the memory-bound kernels (norms, softmax, dropout, activation,
    residual) per byte of activation that Korthikanti et al. 2022 count as stored, forward pass."""
    collective_efficiency_intra: float
    """Achieved bus bandwidth / link bandwidth of collectives inside a node."""
    collective_efficiency_inter: float
    """Achieved bus bandwidth / link bandwidth of collectives between nodes."""
    framework_overhead_GiB: float
    """Memory taken before the model: runtime context, communicator buffers, allocator fragmentation."""
    overlap_slowdown: float = 0.25
    """Share of the communication time hidden behind compute that is still paid, because collectives
    running concurrently take compute units and memory bandwidth from the kernels they overlap."""

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> Efficiency:
        """The profile's constants; ``gemm_max`` and ``gemm_half_intensity``, where the profile does not
        list them (every accelerator), derived from its cited ``achievable_matmul`` (:func:`derive_gemm`)."""
        eff = profile["efficiency"]
        values = {f.name: float(eff[f.name]["value"]) for f in fields(cls) if f.name in eff}
        if "gemm_max" not in values and "achievable_matmul" in profile:
            values.update(derive_gemm(profile))
        return cls(**values)

    def replace(self, **changes: float) -> Efficiency:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Efficiency(**values)


def model_constants() -> dict[str, float]:
    """The device-independent compute constants (``model_constants`` of the profiles file): ``gemm_of_mamf``
    (training GEMMs / best-shape matmul throughput) and ``operand_reuse`` (effective operand bandwidth /
    HBM bandwidth), fitted once on the A100 runs."""
    doc = load_profiles()["model_constants"]
    return {k: float(v["value"]) for k, v in doc.items() if isinstance(v, dict)}


def _peak_and_bandwidth(profile: dict[str, Any]) -> tuple[float, float]:
    peak = profile["peak_tflops"]
    return float(peak.get("bf16") or peak.get("fp16")) * 1e12, float(profile["memory_bandwidth_GBps"]) * 1e9


def derive_gemm(profile: dict[str, Any], constants: dict[str, float] | None = None) -> dict[str, float]:
    """``gemm_max`` and ``gemm_half_intensity`` of an accelerator from its achievable matmul fraction
    (a cited microbenchmark, or ``cann-train calibrate`` on the device) and its datasheet peak and memory
    bandwidth: ``gemm_max = gemm_of_mamf * achievable_matmul``, ``gemm_half_intensity = peak * gemm_max /
    (operand_reuse * bandwidth)``. Achievable compute is thereby a property of the device; only the two
    shape constants are shared (``constants``, default :func:`model_constants`)."""
    c = constants or model_constants()
    gemm_max = c["gemm_of_mamf"] * float(profile["achievable_matmul"]["value"])
    peak, bandwidth = _peak_and_bandwidth(profile)
    return {"gemm_max": gemm_max, "gemm_half_intensity": peak * gemm_max / (c["operand_reuse"] * bandwidth)}


def constants_of(eff: Efficiency, profile: dict[str, Any]) -> dict[str, float]:
    """The inverse of :func:`derive_gemm`: the shape constants that give ``eff`` on the device of
    ``profile`` (how a fit on one device carries to another: leave-one-device-out)."""
    peak, bandwidth = _peak_and_bandwidth(profile)
    return {
        "gemm_of_mamf": eff.gemm_max / float(profile["achievable_matmul"]["value"]),
        "operand_reuse": peak * eff.gemm_max / (eff.gemm_half_intensity * bandwidth),
    }


def achievable_compute(device_name: str) -> dict[str, Any] | None:
    """What a plan shows of where its compute ceiling comes from: the device's achievable matmul fraction
    with its source and confidence, and the ``gemm_max`` derived from it (None for profiles that list their
    own ``gemm_max``: the measured cpu, the generic fallback)."""
    return _achievable_compute(*find_profile(device_name))


def _achievable_compute(name: str, profile: dict[str, Any]) -> dict[str, Any] | None:
    entry = profile.get("achievable_matmul")
    if not entry or "gemm_max" in profile.get("efficiency", {}):
        return None
    return {
        "profile": name,
        "matmul_fraction_of_peak": float(entry["value"]),
        "confidence": entry.get("confidence", "published"),
        "source": entry["source"],
        "gemm_max": round(derive_gemm(profile)["gemm_max"], 4),
    }


@dataclass(frozen=True)
class FrameworkCollectives:
    """How a training framework moves ZeRO-3 parameters and gradients (``frameworks`` in the profiles
    file, one source per field): what the cost model charges per micro-batch for the gathers."""

    name: str
    zero3_inter_node: str = "ring"
    """``ring``: NCCL-style rings whose node-boundary edges use all of a node's NICs at once (a node's
    inbound traffic is the gathered buffer once); ``per_device_link``: each rank's off-node share of every
    gather crosses its own NIC (the node moves the buffer once per local rank)."""
    zero3_unit: str = "layer"
    """``layer``: one all-gather / reduce-scatter per transformer block (FSDP wrapping), two blocks'
    parameters live (the computed and the prefetched one); ``bucket``: per prefetch bucket of
    ``prefetch_parameters`` elements, at most ``max_live_parameters`` gathered at once (DeepSpeed)."""
    prefetch_parameters: float = 0.0
    max_live_parameters: float = 0.0
    reduce_bucket_parameters: float = 0.0
    """Gradient elements reduced at once (DeepSpeed ``reduce_bucket_size``); 0: one block's (FSDP)."""
    sources: tuple[tuple[str, str], ...] = ()

    def describe(self) -> dict[str, Any]:
        """The model as a plan stores it: each field with its source."""
        out: dict[str, Any] = {"framework": self.name, "zero3_inter_node": self.zero3_inter_node}
        out["zero3_unit"] = self.zero3_unit
        if self.zero3_unit == "bucket":
            out["prefetch_parameters"] = self.prefetch_parameters
            out["max_live_parameters"] = self.max_live_parameters
            out["reduce_bucket_parameters"] = self.reduce_bucket_parameters
        out["sources"] = dict(self.sources)
        return out


_COLLECTIVES_OVERRIDE: ContextVar[FrameworkCollectives | None] = ContextVar("collectives", default=None)


@contextmanager
def collectives_override(model: FrameworkCollectives) -> Iterator[None]:
    """Cost every framework's ZeRO-3 collectives with ``model`` inside the block: how
    ``bench/planner_accuracy.py`` puts the alternatives side by side on the same runs."""
    token = _COLLECTIVES_OVERRIDE.set(model)
    try:
        yield
    finally:
        _COLLECTIVES_OVERRIDE.reset(token)


def collectives_for(framework: str) -> FrameworkCollectives:
    """The collective model of a framework (``cann-train`` when it has no entry)."""
    if (override := _COLLECTIVES_OVERRIDE.get()) is not None:
        return override
    frameworks = load_profiles().get("frameworks", {})
    doc = frameworks.get(framework) or frameworks["cann-train"]
    values: dict[str, Any] = {}
    sources = []
    for f in fields(FrameworkCollectives):
        entry = doc.get(f.name)
        if isinstance(entry, dict):
            values[f.name] = entry["value"]
            sources.append((f.name, entry["source"]))
    return FrameworkCollectives(
        name=framework if framework in frameworks else "cann-train", sources=tuple(sources), **values
    )


@dataclass(frozen=True)
class Framework:
    """Host-side cost of the training runtime itself, beside the kernels the rest of the model charges:
    Python, the dispatcher, autograd, DTensor's sharding propagation, the wrappers' hooks and the start-up of
    the collectives they issue per operator or per block, and the optimizer's per-tensor loop. On an
    accelerator it hides behind queued kernels; on a CPU, where the kernels run on the same cores in the same
    thread, it is paid in full and dominates small models. Each field is measured by ``cann-train
    calibrate`` on probe layers unlike any example, built by the runtime's own ``parallelize``
    (``workers.training.calibrate.measure_framework``), per wrapper: plain (no prefix), ``dp_`` (DDP),
    ``tp_`` (tensor + sequence parallel), ``fsdp_`` (FSDP2 ZeRO-3), ``ep_`` (expert parallel); per layer pass
    also under each recompute mode (``_selective``, ``_full``). A figure not measured (0: a profile of an
    older calibrate) falls back to the plain one, and a recompute to the pass x 4/3. Profiles without a
    ``framework`` section (every shipped accelerator) charge nothing for it."""

    layer_pass_s: float = 0.0
    """Forward + backward of one transformer layer of a tiny probe (compute negligible), per micro-batch."""
    layer_pass_selective_s: float = 0.0
    """The same under the runtime's selective recompute (an op-level policy: every operator of the block
    runs under a dispatch mode, and again in the backward but the matmuls)."""
    layer_pass_full_s: float = 0.0
    """The same under full recompute (the block's forward again in the backward)."""
    edge_pass_s: float = 0.0
    """Forward + backward of the embedding, final norm, LM head and loss of the probe, per micro-batch."""
    dp_layer_pass_s: float = 0.0
    """As ``layer_pass_s`` under the runtime's DDP (zero_stage 0, tp 1, more than one replica): its
    autograd hooks, under ``no_sync`` (a micro-batch before a step's last)."""
    dp_layer_pass_selective_s: float = 0.0
    dp_layer_pass_full_s: float = 0.0
    tp_layer_pass_s: float = 0.0
    """As ``layer_pass_s`` with tensor + sequence parallelism over 2 ranks (DTensor), its collectives in."""
    tp_layer_pass_selective_s: float = 0.0
    tp_layer_pass_full_s: float = 0.0
    tp_edge_pass_s: float = 0.0
    fsdp_layer_pass_s: float = 0.0
    """As ``layer_pass_s`` under FSDP2 ZeRO-3 over 2 ranks, its parameter gathers in, without the gradient
    reduce-scatter (a micro-batch before a step's last)."""
    fsdp_layer_pass_selective_s: float = 0.0
    fsdp_layer_pass_full_s: float = 0.0
    fsdp_edge_pass_s: float = 0.0
    fsdp_reduce_layer_s: float = 0.0
    """FSDP2's gradient reduce-scatter per layer, once per step (the last micro-batch's backward)."""
    fsdp_reduce_fixed_s: float = 0.0
    dp_edge_pass_s: float = 0.0
    """As ``edge_pass_s`` under DDP, without its reduction (``no_sync``: a micro-batch before a step's last)."""
    dp_reduce_layer_s: float = 0.0
    """DDP's gradient reduction (its bucket all-reduces and their start-up), once per step, per layer."""
    dp_reduce_fixed_s: float = 0.0
    ep_moe_layer_pass_s: float = 0.0
    """Forward + backward of one MoE layer with its experts split over 2 ranks (routing, the dispatch and
    combine all-to-alls in), per micro-batch; replaces the layer figure of the MoE layers of an ep layout."""
    step_layer_s: float = 0.0
    """The trainer's per-step work per layer: pending reductions, gradient norm, clipping, its AdamW."""
    step_fixed_s: float = 0.0
    """The same for the embedding, norm and head (the intercept over layers)."""
    tp_step_layer_s: float = 0.0
    tp_step_fixed_s: float = 0.0
    fsdp_step_layer_s: float = 0.0
    fsdp_step_fixed_s: float = 0.0
    step_collective_s: float = 0.0
    """The one small all-reduce every step carries (loss, gradient norm, snapshot requests)."""
    compute_scale: float = 1.0
    """Measured / modelled time per token of the probe's layer passes (the slope between two batch sizes,
    the per-pass cost above taken out): how far small tensors on this device fall short of the GEMM curve
    and the streaming bandwidth the rest of the model assumes. Multiplies the modelled compute (tp too)."""
    two_process_contention: float = 1.0
    """The plain probe's passes with both ranks at once / with one alone: every figure above was measured
    with 2 processes sharing the machine, and a layout of one process (the other cores idle) divides its
    host costs and ``compute_scale`` by this."""

    FACTORS = ("compute_scale", "two_process_contention")
    """The fields that are factors (1 = nothing measured), not seconds."""

    @property
    def measured(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self) if f.name not in self.FACTORS)

    @classmethod
    def from_profile(cls, profile: dict[str, Any]) -> Framework:
        fw = profile.get("framework") or {}
        values = {}
        for f in fields(cls):
            entry = fw.get(f.name)
            value = entry.get("value") if isinstance(entry, dict) else None
            if isinstance(value, int | float) and value >= 0 and (value > 0 or f.name not in cls.FACTORS):
                values[f.name] = float(value)
        return cls(**values)


def framework_for(device_name: str) -> Framework:
    """The runtime's host-side costs on a device (zeros unless its profile measured them)."""
    return Framework.from_profile(find_profile(device_name)[1])


@lru_cache(maxsize=1)
def load_profiles() -> dict[str, Any]:
    """The shipped profiles document (``data/hardware_profiles.json``)."""
    with PROFILES_PATH.open() as fh:
        return json.load(fh)


CPU_DEFAULT_ORIGIN = "default (run `cann-train calibrate`)"
UNCALIBRATED_NOTE = "uncalibrated: run `cann-train calibrate`"
"""What a prediction from the shipped cpu default says beside its figures (they can be off many times over)."""


@lru_cache(maxsize=8)
def _read_calibration(path: str, _mtime_ns: int, _size: int) -> dict[str, Any]:
    """A calibration file's profile, read once per version of the file (the key holds its mtime and
    size): every cost model of a search asks for the cpu profile, several times each."""
    with open(path) as fh:
        return json.load(fh)


def _cpu_profile() -> tuple[dict[str, Any], str]:
    """The cpu profile and where it comes from: the calibration file's path, or ``CPU_DEFAULT_ORIGIN``."""
    path = calibration_dir() / "cpu.json"
    try:
        stat = path.stat()
        return _read_calibration(str(path), stat.st_mtime_ns, stat.st_size), str(path)
    except (OSError, ValueError):
        return load_profiles()["profiles"]["cpu"], CPU_DEFAULT_ORIGIN


def cpu_profile() -> tuple[dict[str, Any], str]:
    """The cpu profile plans for this machine use now, and where it comes from (a calibration file's path,
    or ``CPU_DEFAULT_ORIGIN``): ``confidence`` is ``measured`` once ``cann-train calibrate`` ran."""
    return _cpu_profile()


def find_profile(device_name: str) -> tuple[str, dict[str, Any]]:
    """The profile whose name or alias matches ``device_name`` (``generic`` when none does)."""
    key = device_name.strip().lower()
    profiles = load_profiles()["profiles"]
    if key == "cpu" or key.startswith("cpu"):
        profile, _origin = _cpu_profile()
        return "cpu", profile
    for name, profile in profiles.items():
        names = [name.lower(), *(a.lower() for a in profile.get("aliases", []))]
        if key in names:
            return name, _with_device_calibration(name, profile)
    for name, profile in profiles.items():
        names = [name.lower(), *(a.lower() for a in profile.get("aliases", []))]
        if any(n and (n in key or key in n) for n in names if n != "generic"):
            return name, _with_device_calibration(name, profile)
    return "generic", profiles["generic"]


def device_calibration_path(profile_name: str, out_dir: str | Path | None = None) -> Path:
    """Where ``cann-train calibrate --device`` writes an accelerator profile's measured achievable matmul
    fraction (``out_dir``, default :func:`calibration_dir`), which :func:`find_profile` then reads."""
    return (Path(out_dir) if out_dir else calibration_dir()) / f"device-{profile_name}.json"


def _with_device_calibration(name: str, profile: dict[str, Any]) -> dict[str, Any]:
    """The profile with the achievable matmul fraction ``cann-train calibrate --device`` measured on this
    kind of device, when it did (``var/calibration/device-<profile>.json``): a measurement here beats the
    cited figure, and the plan's ``achievable_compute`` says which it used."""
    path = device_calibration_path(name)
    try:
        stat = path.stat()
        doc = _read_calibration(str(path), stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError):
        return profile
    measured = doc.get("achievable_matmul") if isinstance(doc, dict) else None
    if not isinstance(measured, dict) or not isinstance(measured.get("value"), int | float):
        return profile
    if not 0.05 <= measured["value"] <= 1.2:  # a broken or foreign file must not move every plan
        return profile
    return {**profile, "achievable_matmul": measured}


def profile_origin(device_name: str) -> dict[str, Any]:
    """Where the efficiency constants of a device come from, to be stored beside a prediction:
    ``{"name", "origin", "confidence"}``, plus ``"note"`` (``UNCALIBRATED_NOTE``) when the device is the
    cpu and ``cann-train calibrate`` never ran here, so the prediction rests on the shipped placeholder."""
    name, profile = find_profile(device_name)
    if name != "cpu":
        out = {
            "name": name,
            "origin": f"data/{PROFILES_PATH.name}",
            "confidence": profile.get("confidence", "published"),
        }
        # where the compute ceiling comes from (a cited matmul microbenchmark, or an assumption: it says so)
        if (compute := _achievable_compute(name, profile)) is not None:
            out["achievable_compute"] = compute
        return out
    _profile, origin = _cpu_profile()
    if origin == CPU_DEFAULT_ORIGIN:
        return {"name": name, "origin": origin, "confidence": "default", "note": UNCALIBRATED_NOTE}
    return {"name": name, "origin": origin, "confidence": "measured"}


def efficiency_for(device_name: str) -> tuple[str, Efficiency]:
    """(profile name, efficiency constants) for a device name."""
    name, profile = find_profile(device_name)
    return name, Efficiency.from_profile(profile)
