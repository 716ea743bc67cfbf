"""Per-node features from a trace, the same for simulated and imported telemetry.

Each feature reduces the node's metrics (several GPUs / NPUs, NICs, disks, ranks) to one number per
sample: a level (the hottest GPU, the slowest rank's compute) or a rate (counter increases per minute, the
exporters' per-second error rates). NVIDIA and Ascend names both feed the same feature, so a model trained
on one reads the other. A feature none of whose metrics the trace has is NaN throughout (and a model reads
it as its training mean).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import numpy as np

from workers.reliability.risk.traces import NodeTrace


@dataclass(frozen=True)
class Feature:
    name: str
    kind: str
    """``max`` / ``mean`` of levels, ``counter`` (sum of counter increases per minute), ``rate`` (sum of
    per-second rates), ``xid`` (XID events per minute, from the event count or the last-XID gauge),
    ``compute`` (the slowest rank's step time minus its collective wait)."""
    patterns: tuple[str, ...]
    direction: str = "up"
    """``up``: only a rise is suspicious; ``both``: any departure (the baseline's z-score)."""
    heavy_tailed: bool = False
    """Counts and error rates: the models read log1p of them."""


_DEV = r"[^.]+(?:\.[^.]+)*"
FEATURES: tuple[Feature, ...] = (
    Feature("temp_max_C", "max", (rf"^(gpu|npu)\.{_DEV}\.temp_C$",)),
    Feature("power_mean_W", "mean", (rf"^(gpu|npu)\.{_DEV}\.power_W$",), "both"),
    Feature("throttle_thermal", "max", (rf"^gpu\.{_DEV}\.throttle_thermal$",)),
    Feature(
        "ecc_sbe_per_min",
        "counter",
        (rf"^gpu\.{_DEV}\.ecc_sbe_volatile_count$", rf"^npu\.{_DEV}\.hbm_ecc_sbe_count$"),
        heavy_tailed=True,
    ),
    Feature(
        "ecc_dbe_per_min",
        "counter",
        (rf"^gpu\.{_DEV}\.ecc_dbe_volatile_count$", rf"^npu\.{_DEV}\.hbm_ecc_dbe_count$"),
        heavy_tailed=True,
    ),
    Feature(
        "mem_remap_per_min",
        "counter",
        (
            rf"^gpu\.{_DEV}\.remapped_rows_(correctable|uncorrectable)_count$",
            rf"^gpu\.{_DEV}\.retired_pages_(sbe|dbe)_count$",
            rf"^npu\.{_DEV}\.hbm_ecc_(sbe|dbe)_isolated_pages_count$",
        ),
        heavy_tailed=True,
    ),
    Feature("xid_per_min", "xid", (rf"^gpu\.{_DEV}\.xid_events_count$",), heavy_tailed=True),
    Feature(
        "nvlink_errors_per_min",
        "counter",
        (
            rf"^gpu\.{_DEV}\.nvlink_(crc_flit|crc_data|replay|recovery)_errors_count$",
            rf"^npu\.{_DEV}\.hccs[0-9]+_crc_errors_count$",
        ),
        heavy_tailed=True,
    ),
    Feature("pcie_replays_per_min", "counter", (rf"^gpu\.{_DEV}\.pcie_replay_count$",), heavy_tailed=True),
    Feature("nic_errors_per_s", "rate", (rf"^net\.{_DEV}\.(rx|tx)_errs_per_s$",), heavy_tailed=True),
    Feature("step_time_s", "max", (r"^job\.[^.]+\.step_time_last_s$",)),
    Feature("compute_time_s", "compute", (r"^job\.[^.]+\.step_time_last_s$",)),
    Feature("collective_wait_s", "max", (r"^job\.[^.]+\.collective_wait_last_s$",)),
    Feature("disk_busy_pct", "max", (rf"^disk\.{_DEV}\.busy_pct$",)),
)
FEATURE_NAMES = tuple(f.name for f in FEATURES)
_COMPILED = {f.name: tuple(re.compile(p) for p in f.patterns) for f in FEATURES}


def _matching(trace: NodeTrace, feature: Feature) -> list[str]:
    return sorted(n for n in trace.metrics if any(p.match(n) for p in _COMPILED[feature.name]))


def _stack(trace: NodeTrace, names: list[str]) -> np.ndarray:
    return np.stack([np.asarray(trace.metrics[n], dtype=np.float64) for n in names])


def _all_nan(a: np.ndarray) -> np.ndarray:
    return np.all(np.isnan(a), axis=0)


def counter_increases(values: np.ndarray, segment_starts: np.ndarray) -> np.ndarray:
    """Per sample, each counter's increase since the previous sample (a counter that went down was reset and
    counts from zero: Prometheus's rule, as ``telemetry.base.counter_increase``); 0 at a segment's first
    sample, NaN where either reading is missing."""
    inc = np.full(values.shape, np.nan)
    prev, cur = values[..., :-1], values[..., 1:]
    inc[..., 1:] = np.where(cur >= prev, cur - prev, cur)
    inc[..., segment_starts] = 0.0
    return inc


def node_features(trace: NodeTrace) -> np.ndarray:
    """``(samples, len(FEATURES))`` float64; NaN where the node reported none of a feature's metrics."""
    T = len(trace)
    out = np.full((T, len(FEATURES)), np.nan)
    if T == 0:
        return out
    starts = np.zeros(T, dtype=bool)
    for a, _ in trace.segments():
        starts[a] = True
    minutes = np.empty(T)
    minutes[1:] = np.diff(trace.times) / 60.0
    minutes[0] = trace.interval_s / 60.0
    minutes[starts] = trace.interval_s / 60.0
    with np.errstate(all="ignore"):
        for j, feature in enumerate(FEATURES):
            names = _matching(trace, feature)
            if feature.kind == "xid" and not names:
                gauges = sorted(n for n in trace.metrics if re.match(rf"^gpu\.{_DEV}\.xid_last$", n))
                if gauges:  # only the last XID code (dcgm-exporter): a change to a non-zero code is one event
                    g = _stack(trace, gauges)
                    changed = np.zeros_like(g)
                    changed[:, 1:] = (g[:, 1:] != g[:, :-1]) & (g[:, 1:] > 0)
                    changed[:, starts] = 0
                    changed[np.isnan(g)] = np.nan
                    out[:, j] = np.where(_all_nan(g), np.nan, np.nansum(changed, axis=0)) / minutes
                continue
            if not names:
                continue
            a = _stack(trace, names)
            if feature.kind == "max":
                col = np.nanmax(np.where(np.isnan(a), -np.inf, a), axis=0)
                col[~np.isfinite(col)] = np.nan
            elif feature.kind == "mean":
                col = np.nanmean(a, axis=0)
            elif feature.kind in ("counter", "xid"):
                inc = counter_increases(a, starts)
                col = np.where(_all_nan(inc), np.nan, np.nansum(inc, axis=0)) / minutes
            elif feature.kind == "rate":
                col = np.where(_all_nan(a), np.nan, np.nansum(a, axis=0))
            elif feature.kind == "compute":
                waits = [n.replace("step_time_last_s", "collective_wait_last_s") for n in names]
                if not all(w in trace.metrics for w in waits):
                    continue
                own = a - _stack(trace, waits)
                col = np.nanmax(np.where(np.isnan(own), -np.inf, own), axis=0)
                col[~np.isfinite(col)] = np.nan
            else:  # pragma: no cover - FEATURES is fixed
                raise ValueError(feature.kind)
            out[:, j] = col
    return out


@dataclass
class FeatureScaler:
    """log1p of heavy-tailed features, then standardisation by the training traces' mean and spread."""

    mean: np.ndarray
    std: np.ndarray
    present: list[str]
    """Features the training traces had (the others are read as 0 after scaling)."""

    @staticmethod
    def squash(x: np.ndarray) -> np.ndarray:
        y = np.array(x, dtype=np.float64, copy=True)
        heavy = [j for j, f in enumerate(FEATURES) if f.heavy_tailed]
        y[:, heavy] = np.log1p(np.clip(y[:, heavy], 0, None))
        return y

    @classmethod
    def fit(cls, feature_arrays: list[np.ndarray]) -> FeatureScaler:
        x = cls.squash(np.concatenate(feature_arrays))
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a feature no trace has: NaN, handled below
            mean = np.nanmean(x, axis=0)
            std = np.nanstd(x, axis=0)
        present = [f.name for f, m in zip(FEATURES, mean, strict=True) if np.isfinite(m)]
        mean = np.where(np.isfinite(mean), mean, 0.0)
        std = np.where(np.isfinite(std) & (std > 1e-9), std, 1.0)
        return cls(mean, std, present)

    def transform(self, features: np.ndarray) -> np.ndarray:
        z = (self.squash(features) - self.mean) / self.std
        return np.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)

    def to_json(self) -> dict:
        return {
            "features": list(FEATURE_NAMES),
            "log1p": [f.name for f in FEATURES if f.heavy_tailed],
            "mean": [float(v) for v in self.mean],
            "std": [float(v) for v in self.std],
            "present": self.present,
        }

    @classmethod
    def from_json(cls, d: dict) -> FeatureScaler:
        if list(d["features"]) != list(FEATURE_NAMES):
            raise ValueError(
                "the model was trained on other features than this version computes: "
                f"{d['features']} vs {list(FEATURE_NAMES)}"
            )
        return cls(
            np.array(d["mean"], dtype=np.float64), np.array(d["std"], dtype=np.float64), list(d["present"])
        )
