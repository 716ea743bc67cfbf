"""The baseline: a rolling z-score per feature, and a threshold on the largest one.

Per node and feature, the z-score of the current sample against the node's own previous ``window`` samples
(its mean and spread; the spread floored at a share of the feature's spread across the training fleet, so a
counter that has been flat at zero does not make every single error infinitely surprising). Rising
features count when they rise, ``both`` features (power) when they move either way. The node's risk is
``z_max / (z_max + z_scale)``: in [0, 1), monotone in the largest z-score (and not saturating, so that
thresholds can still tell z = 50 from z = 500). The window and the alarm
threshold are chosen on validation traces for the best event-level F1, as the LSTM's threshold is. This is
what an SRE's alert rules on DCGM / node_exporter metrics do, with the thresholds learnt.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from workers.reliability.risk.evaluate import (
    NodeRisk,
    choose_threshold,
    describe_data,
    operating_points,
    trained_on,
)
from workers.reliability.risk.features import FEATURES, FeatureScaler, node_features
from workers.reliability.risk.traces import NodeTrace, TraceSet

MODEL_VERSION = 1


@dataclass
class BaselineConfig:
    windows: tuple[int, ...] = (20, 60, 120)
    """Rolling windows (samples) tried; the one with the best validation F1 is kept."""
    floor_shares: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    """The spread is floored at this share of the feature's spread across the training traces; each share
    is tried with each window."""
    z_scale: float = 4.0
    min_history: int = 3
    """Samples of history a z-score needs (before that, the feature contributes 0)."""


class BaselineRiskModel:
    name = "baseline"

    def __init__(
        self,
        *,
        floor: np.ndarray,
        floor_share: float,
        window: int,
        horizon_s: float,
        threshold: float,
        config: BaselineConfig,
        trained_on: dict,
        training: dict | None = None,
        precise_threshold: float | None = None,
    ) -> None:
        self.floor = np.asarray(floor, dtype=np.float64)
        self.floor_share = float(floor_share)
        self.window = int(window)
        self.horizon_s = float(horizon_s)
        self.threshold = float(threshold)
        self.precise_threshold = None if precise_threshold is None else float(precise_threshold)
        """The precision-target operating point (:func:`.evaluate.choose_precise_threshold`), if any."""
        self.config = config
        self.trained_on = trained_on
        self.training = training or {}

    @property
    def trained_on_text(self) -> str:
        t = self.trained_on
        return describe_data(t["description"], t["nodes"], t["node_days"], t["failures"])

    def zscores(self, trace: NodeTrace) -> np.ndarray:
        """``(samples, features)``: each feature's z-score against the node's previous ``window`` samples,
        signed by the feature's direction (0 without enough history)."""
        x = FeatureScaler.squash(node_features(trace))
        z = np.zeros_like(x)
        up = np.array([f.direction == "up" for f in FEATURES])
        for a, b in trace.segments():
            z[a:b] = _rolling_z(x[a:b], self.window, self.floor, self.config.min_history)
        return np.where(up, z, np.abs(z))

    def risk(self, trace: NodeTrace) -> np.ndarray:
        if len(trace) == 0:
            return np.zeros(0)
        zmax = np.max(self.zscores(trace), axis=1)
        z = np.clip(zmax, 0, None)
        return z / (z + self.config.z_scale)

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {
            "model": "baseline",
            "version": MODEL_VERSION,
            "features": [f.name for f in FEATURES],
            "floor": self.floor.tolist(),
            "floor_share": self.floor_share,
            "window": self.window,
            "horizon_s": self.horizon_s,
            "threshold": self.threshold,
            "precise_threshold": self.precise_threshold,
            "config": asdict(self.config),
            "trained_on": self.trained_on,
            "trained_on_text": self.trained_on_text,
            "training": self.training,
        }
        (directory / "model.json").write_text(json.dumps(meta, indent=1))
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> BaselineRiskModel:
        meta = json.loads((Path(directory) / "model.json").read_text())
        if meta.get("model") != "baseline" or meta.get("version") != MODEL_VERSION:
            raise ValueError(f"{directory}: not a baseline model of version {MODEL_VERSION}")
        if meta["features"] != [f.name for f in FEATURES]:
            raise ValueError(f"{directory}: trained on other features than this version computes")
        cfg = meta["config"]
        cfg["windows"] = tuple(cfg["windows"])
        cfg["floor_shares"] = tuple(cfg["floor_shares"])
        return cls(
            floor=np.array(meta["floor"]),
            floor_share=meta["floor_share"],
            window=meta["window"],
            horizon_s=meta["horizon_s"],
            threshold=meta["threshold"],
            config=BaselineConfig(**cfg),
            trained_on=meta["trained_on"],
            training=meta.get("training"),
            precise_threshold=meta.get("precise_threshold"),
        )


def _rolling_z(x: np.ndarray, window: int, floor: np.ndarray, min_history: int) -> np.ndarray:
    """z-score of each row against the (up to) ``window`` rows before it, NaN-aware."""
    L = len(x)
    valid = ~np.isnan(x)
    v = np.where(valid, x, 0.0)
    zero = np.zeros((1, x.shape[1]))
    s1 = np.concatenate([zero, np.cumsum(v, axis=0)])
    s2 = np.concatenate([zero, np.cumsum(v * v, axis=0)])
    cnt = np.concatenate([zero, np.cumsum(valid, axis=0)])
    i = np.arange(L)
    lo = np.maximum(0, i - window)
    n = cnt[i] - cnt[lo]
    with np.errstate(all="ignore"):
        mean = (s1[i] - s1[lo]) / n
        var = (s2[i] - s2[lo]) / n - mean * mean
        sd = np.maximum(np.sqrt(np.clip(var, 0, None)), floor)
        z = (x - mean) / sd
    z[(n < min_history) | ~valid] = 0.0
    return np.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0)


def fit_baseline(
    fit: TraceSet, validation: TraceSet, *, horizon_s: float = 900.0, config: BaselineConfig | None = None
) -> BaselineRiskModel:
    """Floors from ``fit``; the window, floor and threshold with the best event F1 on ``validation``."""
    config = config or BaselineConfig()
    t0 = time.perf_counter()
    scaler = FeatureScaler.fit([node_features(t) for t in fit.traces])
    data = trained_on(fit, validation)
    best = None
    for window in config.windows:
        for share in config.floor_shares:
            model = BaselineRiskModel(
                floor=scaler.std * share,
                floor_share=share,
                window=window,
                horizon_s=horizon_s,
                threshold=1.0,
                config=config,
                trained_on=data,
            )
            nodes = [
                NodeRisk(t.node, t.times, model.risk(t), validation.failure_times(t.node), t.interval_s)
                for t in validation.traces
            ]
            m = choose_threshold(nodes, horizon_s=horizon_s)
            if best is None or m.f1 > best[2].f1:
                best = (window, share, m)
    window, share, m = best
    model = BaselineRiskModel(
        floor=scaler.std * share,
        floor_share=share,
        window=window,
        horizon_s=horizon_s,
        threshold=m.threshold,
        config=config,
        trained_on=data,
    )
    nodes = [
        NodeRisk(t.node, t.times, model.risk(t), validation.failure_times(t.node), t.interval_s)
        for t in validation.traces
    ]
    # the window and floor are the F1 optimum's; both thresholds are then chosen on them
    points = operating_points(model, nodes, horizon_s=horizon_s)
    model.training = {
        **points,
        "validation_nodes": len(validation.traces),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    return model
