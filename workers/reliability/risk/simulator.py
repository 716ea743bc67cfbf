"""A fault simulator: per-node telemetry traces of a training job, with failures drawn from a published
taxonomy and the precursor signals each kind of failure shows (or does not) before it happens.

What is cited and what is assumed:

- **The failure mix** is Llama 3's Table 5 (:data:`LLAMA3_TABLE5`, cited there): which kinds of failure
  interrupt a large training job and how often, relative to each other.
- **The failure rate** that Table 5 implies is :data:`LLAMA3_RATE_PER_NODE_DAY` (about one failure per node
  every 264 days). The simulator runs ``SimConfig.failure_rate_per_node_day`` instead, by default one per
  node-day, 264 times faster: an ASSUMPTION, made so that a small simulated fleet sees enough failures to
  learn from and be scored on. Precision depends on the base rate (false alarms per node-day do not), so
  :mod:`.evaluate` also reports the precision the same detector would have at Table 5's rate.
- **Everything about the signals** is ASSUMED, and tabulated in :data:`PRECURSORS` (per kind: the share of
  failures that show any precursor, how long before the failure, which signals), :data:`SIGNAL_EFFECTS`
  (how each signal drifts) and :data:`BENIGN` (healthy noise and benign spikes that look like trouble but
  are not, so that false alarms are possible). They are plausible shapes from the telemetry NVIDIA and the
  exporters document, not measurements: replace them with a cluster's own history
  (:mod:`.history`) as soon as there is one.

The job: ``nodes`` nodes of ``gpus_per_node`` GPUs each (one rank per GPU) training synchronously, sampled
every ``interval_s``. A step takes as long as the slowest rank's compute plus the collective; each rank's
collective wait is the step time minus its own compute, so a slow rank waits least and makes everybody
else wait more. A failed node is down (no samples) for ``downtime_s``, then rejoins with a reset GPU (its
volatile counters start again from zero) while the rest of the job goes on (elastic training).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from workers.reliability.risk.traces import Failure, NodeTrace, TraceSet

SIMULATOR_VERSION = "risk-sim/1"


@dataclass(frozen=True)
class FailureKind:
    key: str
    component: str
    """As Table 5 names it."""
    category: str
    """Table 5's category column."""
    count: int
    """Interruptions of this kind among the 419 unexpected ones."""
    percent: float
    """As printed in Table 5 (see :data:`LLAMA3_TABLE5_NOTE`)."""


LLAMA3_TABLE5_SOURCE = (
    "Dubey et al. 2024, 'The Llama 3 Herd of Models' (arXiv:2407.21783), Table 5: root-cause categorization "
    "of the 419 unexpected interruptions during a 54-day snapshot of Llama 3 405B pre-training on 16,384 "
    "H100 GPUs (466 interruptions, 47 of them planned)"
)
LLAMA3_TABLE5: tuple[FailureKind, ...] = (
    # Dubey et al. 2024, Table 5 (component, category, interruption count, % of interruptions), in its order.
    FailureKind("faulty_gpu", "Faulty GPU", "GPU", 148, 30.1),
    FailureKind("gpu_hbm3", "GPU HBM3 Memory", "GPU", 72, 17.2),
    FailureKind("software_bug", "Software Bug", "Dependency", 54, 12.9),
    FailureKind("network_switch_cable", "Network Switch/Cable", "Network", 35, 8.4),
    FailureKind("host_maintenance", "Host Maintenance", "Unplanned Maintenance", 32, 7.6),
    FailureKind("gpu_sram", "GPU SRAM Memory", "GPU", 19, 4.5),
    FailureKind("gpu_system_processor", "GPU System Processor", "GPU", 17, 4.1),
    FailureKind("nic", "NIC", "Host", 7, 1.7),
    FailureKind("nccl_watchdog", "NCCL Watchdog Timeouts", "Unknown", 7, 1.7),
    FailureKind("silent_data_corruption", "Silent Data Corruption", "GPU", 6, 1.4),
    FailureKind("gpu_thermal", "GPU Thermal Interface + Sensor", "GPU", 6, 1.4),
    FailureKind("ssd", "SSD", "Host", 3, 0.7),
    FailureKind("power_supply", "Power Supply", "Host", 3, 0.7),
    FailureKind("server_chassis", "Server Chassis", "Host", 2, 0.5),
    FailureKind("io_expansion_board", "IO Expansion Board", "Host", 2, 0.5),
    FailureKind("dependency", "Dependency", "Dependency", 2, 0.5),
    FailureKind("cpu", "CPU", "Host", 2, 0.5),
    FailureKind("system_memory", "System Memory", "Host", 2, 0.5),
)
LLAMA3_TABLE5_NOTE = (
    "The counts add up to the 419 unexpected interruptions and every printed percentage but one is its "
    "count / 419 rounded; Faulty GPU is printed as 30.1% although 148 / 419 = 35.3%, so the printed "
    "percentages add up to 94.9%. The simulator draws kinds by count (count / 419)."
)
LLAMA3_RATE_PER_NODE_DAY = 419 / (16384 / 8 * 54)
"""Unexpected interruptions per node-day in that snapshot: 419 over 54 days on 16,384 GPUs in servers of
eight GPUs each (Dubey et al. 2024, section 3.3.1: 'Each server is equipped with eight GPUs'), ~0.0038."""
LLAMA3_RATE_SOURCE = (
    "419 unexpected interruptions over 54 days on 16,384 GPUs in servers of eight GPUs each (2,048 nodes): "
    "Dubey et al. 2024, Table 5 and section 3.3.1"
)
"""Where :data:`LLAMA3_RATE_PER_NODE_DAY` comes from, for a page or report that shows it."""
KINDS = tuple(k.key for k in LLAMA3_TABLE5)


def failure_mix() -> dict[str, float]:
    """The share of each kind among failures (count / 419)."""
    total = sum(k.count for k in LLAMA3_TABLE5)
    return {k.key: k.count / total for k in LLAMA3_TABLE5}


@dataclass(frozen=True)
class PrecursorShape:
    share: float
    """Of the failures of this kind, the share that shows any precursor signal."""
    lead_min_s: float
    lead_max_s: float
    """The precursor starts a uniform random time in [lead_min_s, lead_max_s] before the failure."""
    signals: tuple[str, ...]
    """Keys of :data:`SIGNAL_EFFECTS`."""
    xid_codes: tuple[int, ...] = ()
    """XID codes its ``xid`` signal raises (NVIDIA's Xid catalog, named in
    telemetry.nvml.XID_DESCRIPTIONS)."""
    why: str = ""


_M = 60.0
PRECURSORS: dict[str, PrecursorShape] = {
    # ASSUMPTIONS, every row: share of failures with a precursor, its lead, the signals that drift.
    "faulty_gpu": PrecursorShape(
        0.6, 5 * _M, 30 * _M, ("xid", "slow", "nvlink"), (13, 31, 74), "engine exceptions, NVLink errors"
    ),
    "gpu_hbm3": PrecursorShape(
        0.8, 10 * _M, 45 * _M, ("sbe", "remap", "dbe", "xid"), (63, 94), "rising correctable ECC, remaps"
    ),
    "software_bug": PrecursorShape(0.1, 2 * _M, 10 * _M, ("stall",), (), "most bugs crash without warning"),
    "network_switch_cable": PrecursorShape(
        0.6, 3 * _M, 20 * _M, ("nic", "net_slow"), (), "link errors, slower collectives"
    ),
    "host_maintenance": PrecursorShape(0.0, 0, 0, (), (), "an operator's decision: no telemetry precursor"),
    "gpu_sram": PrecursorShape(0.5, 5 * _M, 20 * _M, ("sbe", "xid"), (94,), "on-chip SRAM ECC"),
    "gpu_system_processor": PrecursorShape(
        0.4, 3 * _M, 15 * _M, ("xid", "stall"), (119, 120), "GSP RPC timeouts"
    ),
    "nic": PrecursorShape(0.6, 5 * _M, 20 * _M, ("nic",), (), "NIC error counters"),
    "nccl_watchdog": PrecursorShape(0.4, 2 * _M, 15 * _M, ("stall", "net_slow"), (), "intermittent stalls"),
    "silent_data_corruption": PrecursorShape(0.0, 0, 0, (), (), "silent by definition"),
    "gpu_thermal": PrecursorShape(0.9, 15 * _M, 60 * _M, ("temp", "slow"), (), "heats up, throttles"),
    "ssd": PrecursorShape(0.5, 10 * _M, 40 * _M, ("disk",), (), "I/O queues back up"),
    "power_supply": PrecursorShape(0.5, 5 * _M, 30 * _M, ("power",), (), "unstable power draw"),
    "server_chassis": PrecursorShape(0.3, 10 * _M, 40 * _M, ("temp_all",), (), "fans: every GPU warms"),
    "io_expansion_board": PrecursorShape(0.6, 5 * _M, 30 * _M, ("pcie",), (), "PCIe replays"),
    "dependency": PrecursorShape(0.0, 0, 0, (), (), "an external service fails"),
    "cpu": PrecursorShape(0.3, 5 * _M, 20 * _M, ("slow_all",), (), "every rank on the host slows"),
    "system_memory": PrecursorShape(0.0, 0, 0, (), (), "host EDAC counters are not collected"),
}
SIGNAL_EFFECTS: dict[str, str] = {
    # ASSUMPTIONS: how each signal drifts over a precursor of progress p (0 at its start, 1 at the failure),
    # scaled by the failure's severity s ~ U(0.3, 1). "GPU" is one GPU of the node, drawn per failure.
    "temp": "GPU temperature + 20 s p degC; thermal throttle flag at >= 87 degC",
    "temp_all": "every GPU's temperature + 12 s p degC",
    "sbe": "GPU single-bit ECC errors, Poisson 12 s p^2 per sample",
    "remap": "GPU correctable remapped rows, Poisson 0.15 s p per sample; 30% one uncorrectable at the end",
    "dbe": "half the time one double-bit ECC error in the last 30% of the lead",
    "xid": "GPU XID events, Poisson 0.3 s p per sample, codes from the kind's list",
    "nvlink": "GPU NVLink CRC errors, Poisson 150 s p^2 per sample",
    "pcie": "GPU PCIe replays, Poisson 60 s p^2 per sample",
    "nic": "NIC receive errors 15 s p /s (x U(0.5, 1.5) per sample), transmit half that",
    "net_slow": "the job's collective time + 0.8 s p seconds (every node waits more)",
    "slow": "the GPU's compute time x (1 + 0.35 s p)",
    "slow_all": "every GPU's compute time on the node x (1 + 0.25 s p)",
    "stall": "the GPU's compute + U(1, 5) s on a share 0.5 s p of samples",
    "power": "the node's GPU power + N(0, 120 s p) W per sample",
    "disk": "disk busy + 70 s p %",
}
SEVERITY = (0.3, 1.0)
THROTTLE_TEMP_C = 87.0
"""ASSUMPTION: where the simulated GPU starts thermal throttling (a plausible slowdown point, not a datasheet
figure)."""


@dataclass(frozen=True)
class Benign:
    rate_per_node_day: float
    """Events per node-day (0: continuous noise, not events)."""
    what: str


BENIGN: dict[str, Benign] = {
    # ASSUMPTIONS, every row: healthy noise and benign events (no failure follows them).
    "temp_noise": Benign(
        0, "GPU temperature 62 +- 4 degC per GPU, AR(1) noise (phi 0.95, sd 1.6), diurnal +-1.5"
    ),
    "power_noise": Benign(0, "GPU power 620 +- 20 W per GPU, + N(0, 15) W per sample"),
    "step_noise": Benign(
        0,
        "compute 2.0 s x (1 + N(0, 0.01)) per node x (1 + N(0, 0.01)) per sample; "
        "collective 0.4 s x (1 + N(0, 0.05))",
    ),
    "checkpoint": Benign(
        48, "job-wide every 30 min: step + U(3, 6) s, power - U(100, 200) W, disk busy 70-100%"
    ),
    "evaluation": Benign(8, "job-wide every 3 h: power - 250 W for 3 min"),
    "temp_spike": Benign(2, "one GPU + U(4, 12) degC for 1-4 samples (fan hiccup, hot spot)"),
    "rank_stall": Benign(4, "one rank's compute + U(0.5, 3) s for one sample (data loader, GC, OS jitter)"),
    "sbe_burst": Benign(
        1, "one GPU: 1-20 single-bit ECC errors per sample for 1-3 samples (a weak cell found)"
    ),
    "sbe_chronic": Benign(0, "10% of nodes: one GPU with a steady 0.3 single-bit ECC errors per sample"),
    "xid_benign": Benign(
        0.5, "one XID 13 / 31 / 43 caused by the application (a bad kernel), nothing follows"
    ),
    "remap_benign": Benign(0.05, "one correctable remapped row"),
    "nvlink_burst": Benign(
        0.5, "one GPU: 10-500 NVLink CRC errors per sample for 1-2 samples; background Poisson 0.05"
    ),
    "pcie_burst": Benign(0.3, "one GPU: 1-100 PCIe replays in one sample; background Poisson 0.01"),
    "nic_burst": Benign(1, "NIC receive errors 1-30 /s for 1-3 samples (a link flap that recovers)"),
    "disk_burst": Benign(3, "disk busy + 20-60% for 1-4 samples (data loading)"),
}


@dataclass
class SimConfig:
    """What to simulate."""

    nodes: int = 48
    days: float = 3.0
    seed: int = 0
    interval_s: float = 30.0
    """Sampling interval (the live sampler streams every few seconds; 30 s keeps simulated traces small)."""
    gpus_per_node: int = 2
    """GPUs (and ranks) per node: 2 by default to keep traces small (Llama 3's servers have 8)."""
    failure_rate_per_node_day: float = 1.0
    """ASSUMPTION: 264x Table 5's observed rate (:data:`LLAMA3_RATE_PER_NODE_DAY`): see the module
    docstring."""
    downtime_s: float = 3600.0
    """ASSUMPTION: how long a failed node is out (diagnosed, repaired or replaced) before it rejoins."""
    node_prefix: str = "node"
    start_unix_s: float = 1767225600.0
    """2026-01-01T00:00:00Z."""
    kinds: dict[str, float] = field(default_factory=failure_mix)
    """Kind -> share of failures (default: Table 5)."""

    def validate(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes must be at least 1, got {self.nodes}")
        if not 0 < self.days <= 365:
            raise ValueError(f"days must be in (0, 365], got {self.days}")
        if not 1 <= self.interval_s <= 3600:
            raise ValueError(f"interval_s must be in [1, 3600] seconds, got {self.interval_s}")
        if not 1 <= self.gpus_per_node <= 16:
            raise ValueError(f"gpus_per_node must be in [1, 16], got {self.gpus_per_node}")
        if self.failure_rate_per_node_day < 0:
            raise ValueError("failure_rate_per_node_day must be >= 0")
        if self.downtime_s < 2 * self.interval_s:
            raise ValueError("downtime_s must be at least two sampling intervals (a down node leaves a gap)")
        unknown = sorted(set(self.kinds) - set(PRECURSORS))
        if unknown:
            raise ValueError(f"unknown failure kinds: {', '.join(unknown)}")
        if any(v < 0 for v in self.kinds.values()) or sum(self.kinds.values()) <= 0:
            raise ValueError("kind shares must be >= 0 with a positive sum")

    def describe(self) -> dict:
        d = asdict(self)
        d.pop("kinds")
        default_mix = self.kinds == failure_mix()
        return {
            "source": "simulated",
            "simulator": SIMULATOR_VERSION,
            **d,
            "failure_mix": LLAMA3_TABLE5_SOURCE if default_mix else "custom: " + repr(self.kinds),
            "assumptions": "precursor shapes, benign events and the failure rate are assumptions "
            "(workers/reliability/risk/simulator.py: PRECURSORS, SIGNAL_EFFECTS, BENIGN)",
        }


@dataclass
class _SimFailure:
    node: int
    t: float
    """Seconds since the start."""
    kind: str
    lead_s: float
    severity: float
    gpu: int


def _draw_failures(rng: np.random.Generator, cfg: SimConfig, span_s: float) -> list[_SimFailure]:
    keys = list(cfg.kinds)
    shares = np.array([cfg.kinds[k] for k in keys], dtype=float)
    shares /= shares.sum()
    out = []
    rate_per_s = cfg.failure_rate_per_node_day / 86400.0
    for n in range(cfg.nodes):
        t = 0.0
        while rate_per_s > 0:
            t += rng.exponential(1.0 / rate_per_s)
            if t >= span_s:
                break
            kind = keys[int(rng.choice(len(keys), p=shares))]
            shape = PRECURSORS[kind]
            has = rng.random() < shape.share
            lead = rng.uniform(shape.lead_min_s, shape.lead_max_s) if has else 0.0
            sev = rng.uniform(*SEVERITY)
            out.append(_SimFailure(n, t, kind, lead, sev, int(rng.integers(cfg.gpus_per_node))))
            t += cfg.downtime_s
    return out


def _ar1(rng: np.random.Generator, shape: tuple[int, ...], steps: int, phi: float, sd: float) -> np.ndarray:
    """AR(1) noise along the last axis, stationary standard deviation ``sd``."""
    innov = rng.standard_normal((*shape, steps)) * sd * np.sqrt(1 - phi * phi)
    out = np.empty_like(innov)
    out[..., 0] = rng.standard_normal(shape) * sd
    for i in range(1, steps):
        out[..., i] = phi * out[..., i - 1] + innov[..., i]
    return out


def _events(rng: np.random.Generator, n_series: int, steps: int, rate_per_day: float, days: float):
    """Random event start indices: ``[(series, start), ...]``, Poisson ``rate_per_day`` per series."""
    counts = rng.poisson(rate_per_day * days, size=n_series)
    series = np.repeat(np.arange(n_series), counts)
    starts = rng.integers(0, steps, size=len(series))
    return list(zip(series.tolist(), starts.tolist(), strict=True))


def simulate(cfg: SimConfig | None = None) -> TraceSet:
    """Simulated traces and failures; the same config (seed included) gives the same traces."""
    cfg = cfg or SimConfig()
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    N, G = cfg.nodes, cfg.gpus_per_node
    T = int(round(cfg.days * 86400.0 / cfg.interval_s))
    if T < 2:
        raise ValueError("simulate at least two samples (days x 86400 / interval_s >= 2)")
    dt = cfg.interval_s
    t_rel = np.arange(T) * dt
    days = cfg.days
    failures = _draw_failures(rng, cfg, T * dt)

    # --- up/down and segments
    up = np.ones((N, T), dtype=bool)
    for f in failures:
        up[f.node, (t_rel >= f.t) & (t_rel < f.t + cfg.downtime_s)] = False
    seg_start = np.zeros((N, T), dtype=bool)
    seg_start[:, 0] = True
    seg_start[:, 1:] = up[:, 1:] & ~up[:, :-1]

    # --- healthy levels
    temp = 62.0 + 4.0 * rng.standard_normal((N, G, 1)) + _ar1(rng, (N, G), T, 0.95, 1.6)
    temp += 1.5 * np.sin(2 * np.pi * t_rel / 86400.0 + rng.uniform(0, 2 * np.pi))
    power = 620.0 + 20.0 * rng.standard_normal((N, G, 1)) + 15.0 * rng.standard_normal((N, G, T))
    compute = 2.0 * (1 + 0.01 * rng.standard_normal((N, 1, 1))) * (1 + 0.01 * rng.standard_normal((N, G, T)))
    collective = 0.4 * (1 + 0.05 * rng.standard_normal(T))
    step_extra = np.zeros(T)
    disk = 5.0 + 3.0 * rng.random((N, T))
    nic_rx = np.zeros((N, T))
    inc = {
        name: np.zeros((N, G, T)) for name in ("sbe", "dbe", "remap_c", "remap_u", "xid", "nvlink", "pcie")
    }
    xid_code = np.zeros((N, G, T))

    # --- benign job-wide events
    ckpt_period = int(round(1800 / dt))
    for i in range(int(rng.integers(ckpt_period)), T, max(ckpt_period, 1)):
        step_extra[i] += rng.uniform(3, 6)
        power[:, :, i : i + 2] -= rng.uniform(100, 200)
        disk[:, i : i + 2] = rng.uniform(70, 100, size=(N, len(range(i, min(i + 2, T)))))
    eval_period = int(round(3 * 3600 / dt))
    for i in range(int(rng.integers(eval_period)), T, max(eval_period, 1)):
        power[:, :, i : i + max(1, int(180 / dt))] -= 250.0

    # --- benign per-node / per-GPU events
    for s, i in _events(rng, N * G, T, BENIGN["temp_spike"].rate_per_node_day / G, days):
        temp[s // G, s % G, i : i + int(rng.integers(1, 5))] += rng.uniform(4, 12)
    for s, i in _events(rng, N * G, T, BENIGN["rank_stall"].rate_per_node_day / G, days):
        compute[s // G, s % G, i] += rng.uniform(0.5, 3)
    for s, i in _events(rng, N * G, T, BENIGN["sbe_burst"].rate_per_node_day / G, days):
        k = len(range(i, min(i + int(rng.integers(1, 4)), T)))
        inc["sbe"][s // G, s % G, i : i + k] += rng.integers(1, 21, size=k)
    chronic = rng.random(N) < 0.10
    for n in np.flatnonzero(chronic):
        g = int(rng.integers(G))
        inc["sbe"][n, g] += rng.poisson(0.3, size=T)
    for s, i in _events(rng, N * G, T, BENIGN["xid_benign"].rate_per_node_day / G, days):
        inc["xid"][s // G, s % G, i] += 1
        xid_code[s // G, s % G, i] = rng.choice([13, 31, 43])
    for s, i in _events(rng, N * G, T, BENIGN["remap_benign"].rate_per_node_day / G, days):
        inc["remap_c"][s // G, s % G, i] += 1
    inc["nvlink"] += rng.poisson(0.05, size=(N, G, T))
    for s, i in _events(rng, N * G, T, BENIGN["nvlink_burst"].rate_per_node_day / G, days):
        inc["nvlink"][s // G, s % G, i : i + int(rng.integers(1, 3))] += rng.integers(10, 501)
    inc["pcie"] += rng.poisson(0.01, size=(N, G, T))
    for s, i in _events(rng, N * G, T, BENIGN["pcie_burst"].rate_per_node_day / G, days):
        inc["pcie"][s // G, s % G, i] += rng.integers(1, 101)
    for n, i in _events(rng, N, T, BENIGN["nic_burst"].rate_per_node_day, days):
        k = int(rng.integers(1, 4))
        nic_rx[n, i : i + k] += rng.uniform(1, 30, size=len(range(i, min(i + k, T))))
    for n, i in _events(rng, N, T, BENIGN["disk_burst"].rate_per_node_day, days):
        disk[n, i : i + int(rng.integers(1, 5))] += rng.uniform(20, 60)

    # --- precursors
    for f in failures:
        shape = PRECURSORS[f.kind]
        if f.lead_s <= 0:
            continue
        window = (t_rel >= f.t - f.lead_s) & (t_rel < f.t) & up[f.node]
        idx = np.flatnonzero(window)
        if len(idx) == 0:
            continue
        p = (t_rel[idx] - (f.t - f.lead_s)) / f.lead_s
        s, n, g = f.severity, f.node, f.gpu
        for signal in shape.signals:
            if signal == "temp":
                temp[n, g, idx] += 20 * s * p
            elif signal == "temp_all":
                temp[n, :, idx] += (12 * s * p)[:, None]
            elif signal == "sbe":
                inc["sbe"][n, g, idx] += rng.poisson(12 * s * p**2)
            elif signal == "remap":
                inc["remap_c"][n, g, idx] += rng.poisson(0.15 * s * p)
                if rng.random() < 0.3:
                    inc["remap_u"][n, g, idx[-1]] += 1
            elif signal == "dbe":
                if rng.random() < 0.5:
                    late = idx[p >= 0.7]
                    if len(late):
                        inc["dbe"][n, g, int(rng.choice(late))] += 1
            elif signal == "xid":
                events = rng.poisson(0.3 * s * p)
                inc["xid"][n, g, idx] += events
                hit = idx[events > 0]
                xid_code[n, g, hit] = rng.choice(shape.xid_codes, size=len(hit))
            elif signal == "nvlink":
                inc["nvlink"][n, g, idx] += rng.poisson(150 * s * p**2)
            elif signal == "pcie":
                inc["pcie"][n, g, idx] += rng.poisson(60 * s * p**2)
            elif signal == "nic":
                nic_rx[n, idx] += 15 * s * p * rng.uniform(0.5, 1.5, size=len(idx))
            elif signal == "net_slow":
                collective[idx] += 0.8 * s * p
            elif signal == "slow":
                compute[n, g, idx] *= 1 + 0.35 * s * p
            elif signal == "slow_all":
                compute[n, :, idx] *= (1 + 0.25 * s * p)[:, None]
            elif signal == "stall":
                hit = idx[rng.random(len(idx)) < 0.5 * s * p]
                compute[n, g, hit] += rng.uniform(1, 5, size=len(hit))
            elif signal == "power":
                power[n, :, idx] += rng.standard_normal((len(idx), G)) * (120 * s * p)[:, None]
            elif signal == "disk":
                disk[n, idx] += 70 * s * p
            else:  # pragma: no cover - the tables are checked by the tests
                raise ValueError(f"unknown precursor signal {signal!r}")

    # --- derived: step time and waits over the nodes that are up, counters, throttling
    masked = np.where(up[:, None, :], compute, -np.inf)
    step = masked.max(axis=(0, 1)) + collective + step_extra
    step = np.where(np.isfinite(step), step, np.nan)
    wait = step[None, None, :] - compute
    disk = np.clip(disk, 0, 100)
    throttle = (temp >= THROTTLE_TEMP_C).astype(float)
    tx = nic_rx * 0.5

    counters: dict[str, np.ndarray] = {}
    start_offsets = {"sbe": 200, "nvlink": 50, "pcie": 20}
    for name, values in inc.items():
        csum = np.cumsum(values, axis=-1)
        # reset at the start of each segment: subtract the running total before the segment's first sample
        before = np.where(seg_start[:, None, :], csum - values, np.nan)
        base = _ffill(before)
        counter = csum - base
        hi = start_offsets.get(name, 0)
        if hi:  # counters in the first segment count since the driver loaded, before the trace started
            first_segment = (np.cumsum(seg_start, axis=-1) == 1)[:, None, :]
            counter += np.where(first_segment, rng.integers(0, hi, size=(N, G, 1)), 0)
        counters[name] = counter
    xid_last = _ffill_codes(xid_code, seg_start)

    traces = []
    names = [f"{cfg.node_prefix}-{n:03d}" for n in range(N)]
    times = cfg.start_unix_s + t_rel
    gpu_metrics = {
        "temp_C": temp,
        "power_W": power,
        "throttle_thermal": throttle,
        "ecc_sbe_volatile_count": counters["sbe"],
        "ecc_dbe_volatile_count": counters["dbe"],
        "remapped_rows_correctable_count": counters["remap_c"],
        "remapped_rows_uncorrectable_count": counters["remap_u"],
        "xid_events_count": counters["xid"],
        "xid_last": xid_last,
        "nvlink_crc_flit_errors_count": counters["nvlink"],
        "pcie_replay_count": counters["pcie"],
    }
    for n in range(N):
        keep = up[n]
        m: dict[str, np.ndarray] = {}
        for g in range(G):
            for metric, arr in gpu_metrics.items():
                m[f"gpu.{g}.{metric}"] = arr[n, g, keep]
            rank = n * G + g
            m[f"job.rank{rank}.step_time_last_s"] = step[keep]
            m[f"job.rank{rank}.collective_wait_last_s"] = wait[n, g, keep]
        m["net.ib0.rx_errs_per_s"] = nic_rx[n, keep]
        m["net.ib0.tx_errs_per_s"] = tx[n, keep]
        m["disk.nvme0n1.busy_pct"] = disk[n, keep]
        traces.append(NodeTrace(names[n], times[keep], m))
    out_failures = [
        Failure(names[f.node], float(cfg.start_unix_s + f.t), f.kind, float(f.lead_s)) for f in failures
    ]
    return TraceSet(traces, out_failures, cfg.describe())


def _ffill(a: np.ndarray) -> np.ndarray:
    """Forward-fill NaNs along the last axis (the first value is never NaN here)."""
    idx = np.where(np.isnan(a), 0, np.arange(a.shape[-1]))
    np.maximum.accumulate(idx, axis=-1, out=idx)
    return np.take_along_axis(a, idx, axis=-1)


def _ffill_codes(codes: np.ndarray, seg_start: np.ndarray) -> np.ndarray:
    """The last non-zero code so far in the segment (0 before any), as DCGM's XID_ERRORS gauge."""
    marked = np.where(codes > 0, codes, np.nan)
    marked = np.where(seg_start[:, None, :] & np.isnan(marked), 0.0, marked)
    return _ffill(marked)
