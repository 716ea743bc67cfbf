"""A small LSTM that reads a node's last ``window`` samples of features and gives the probability that the
node fails within the horizon (default 15 min).

Training: every sample of the fit traces is a window ending there, labelled 1 when a failure of the node
follows within the horizon. All positive windows are kept and the negatives are subsampled uniformly (a
kept share ``r``); the model's odds are multiplied back by ``r`` at prediction time, so that the risk is a
probability at the traces' own failure rate, not at the training set's balance. The alarm threshold is
the one with the best event-level F1 on validation traces (:func:`.evaluate.choose_threshold`), as the
baseline's is.

Saved as a directory: ``model.pt`` (the state_dict) and ``model.json`` (configuration, feature
normalisation, threshold, and a description of the data it was trained on).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from workers.reliability.risk.evaluate import NodeRisk, describe_data, operating_points, trained_on
from workers.reliability.risk.features import FEATURES, FeatureScaler, node_features
from workers.reliability.risk.traces import NodeTrace, TraceSet, fails_within

MODEL_VERSION = 1
CHUNK = 8192
"""Windows scored per forward pass (bounds the memory of prediction)."""


@dataclass
class LstmConfig:
    horizon_s: float = 900.0
    window: int = 20
    """Samples per window (20 x 30 s = 10 min)."""
    hidden: int = 32
    epochs: int = 6
    batch_size: int = 256
    learning_rate: float = 3e-3
    negatives_per_positive: float = 10.0
    seed: int = 0
    threads: int = 1
    """torch threads for training and prediction (at most the machine's CPUs). One: a model this small
    gains nothing from more, and loses a lot when the cores are shared (measured on the 2-core dev
    machine while other tests ran: 8 epochs on 55k windows took 8.3 s with 1 thread, 199 s with 2)."""

    def validate(self) -> None:
        if self.horizon_s <= 0:
            raise ValueError(f"horizon must be positive, got {self.horizon_s} s")
        if not 2 <= self.window <= 1000:
            raise ValueError(f"window must be 2-1000 samples, got {self.window}")
        if not 1 <= self.hidden <= 1024:
            raise ValueError(f"hidden must be 1-1024, got {self.hidden}")
        if (
            self.epochs < 1
            or self.batch_size < 1
            or self.learning_rate <= 0
            or self.negatives_per_positive <= 0
        ):
            raise ValueError("epochs, batch_size, learning_rate and negatives_per_positive must be positive")


class RiskLSTM(nn.Module):
    """features (batch, window, F) -> one logit per window: an LSTM, its last hidden state, a linear head."""

    def __init__(self, n_features: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(x)
        return self.head(h[-1]).squeeze(-1)


@contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, min(n, os.cpu_count() or 1)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _windows(x: np.ndarray, start: int, stop: int, window: int) -> np.ndarray:
    """A view ``(stop - start, window, F)``: the window ending at each row of the segment, its first row
    repeated before the segment's start."""
    seg = x[start:stop]
    padded = np.concatenate([np.repeat(seg[:1], window - 1, axis=0), seg])
    return np.lib.stride_tricks.sliding_window_view(padded, window, axis=0).transpose(0, 2, 1)


class LstmRiskModel:
    name = "lstm"

    def __init__(
        self,
        *,
        net: RiskLSTM,
        scaler: FeatureScaler,
        config: LstmConfig,
        threshold: float,
        negative_keep: float,
        trained_on: dict,
        training: dict | None = None,
        precise_threshold: float | None = None,
    ) -> None:
        self.net = net.eval()
        self.scaler = scaler
        self.config = config
        self.threshold = float(threshold)
        self.precise_threshold = None if precise_threshold is None else float(precise_threshold)
        """The precision-target operating point (:func:`.evaluate.choose_precise_threshold`), if any."""
        self.negative_keep = float(negative_keep)
        self.trained_on = trained_on
        self.training = training or {}

    @property
    def horizon_s(self) -> float:
        return self.config.horizon_s

    @property
    def trained_on_text(self) -> str:
        t = self.trained_on
        return describe_data(t["description"], t["nodes"], t["node_days"], t["failures"])

    def risk(self, trace: NodeTrace) -> np.ndarray:
        """Per sample, the probability that the node fails within the horizon."""
        out = np.zeros(len(trace))
        if len(trace) == 0:
            return out
        x = self.scaler.transform(node_features(trace))
        logits = []
        with _threads(self.config.threads), torch.inference_mode():
            for a, b in trace.segments():
                w = _windows(x, a, b, self.config.window)
                for i in range(0, len(w), CHUNK):
                    logits.append(
                        self.net(torch.from_numpy(np.array(w[i : i + CHUNK], dtype=np.float32))).double()
                    )
        logit = torch.cat(logits).numpy()
        # undo the negative subsampling: odds at the data's own balance = model odds x kept share
        return 1.0 / (1.0 + np.exp(-(logit + np.log(self.negative_keep))))

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.net.state_dict(), directory / "model.pt")
        meta = {
            "model": "lstm",
            "version": MODEL_VERSION,
            "config": asdict(self.config),
            "n_features": len(FEATURES),
            "normalisation": self.scaler.to_json(),
            "threshold": self.threshold,
            "precise_threshold": self.precise_threshold,
            "negative_keep": self.negative_keep,
            "trained_on": self.trained_on,
            "trained_on_text": self.trained_on_text,
            "training": self.training,
        }
        (directory / "model.json").write_text(json.dumps(meta, indent=1))
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> LstmRiskModel:
        directory = Path(directory)
        meta = json.loads((directory / "model.json").read_text())
        if meta.get("model") != "lstm" or meta.get("version") != MODEL_VERSION:
            raise ValueError(f"{directory}: not an LSTM risk model of version {MODEL_VERSION}")
        config = LstmConfig(**meta["config"])
        net = RiskLSTM(meta["n_features"], config.hidden)
        net.load_state_dict(torch.load(directory / "model.pt", weights_only=True))
        return cls(
            net=net,
            scaler=FeatureScaler.from_json(meta["normalisation"]),
            config=config,
            threshold=meta["threshold"],
            negative_keep=meta["negative_keep"],
            trained_on=meta["trained_on"],
            training=meta.get("training"),
            precise_threshold=meta.get("precise_threshold"),
        )


def training_windows(
    traces: TraceSet, scaler: FeatureScaler, config: LstmConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(windows, labels, kept share of negatives)``: all positives, negatives subsampled uniformly."""
    per_node = []
    positives = negatives = 0
    for t in traces.traces:
        if len(t) == 0:
            continue
        x = scaler.transform(node_features(t))
        y = fails_within(t.times, traces.failure_times(t.node), config.horizon_s)
        per_node.append((t, x, y))
        positives += int(y.sum())
        negatives += int((~y).sum())
    if positives == 0:
        raise ValueError(
            "no sample is followed by a failure within the horizon: nothing to learn from "
            "(more nodes or days, or an incident list that names these nodes and times)"
        )
    keep = min(1.0, config.negatives_per_positive * positives / max(negatives, 1))
    xs, ys = [], []
    for t, x, y in per_node:
        for a, b in t.segments():
            chosen = y[a:b] | (rng.random(b - a) < keep)
            if chosen.any():
                xs.append(_windows(x, a, b, config.window)[chosen])
                ys.append(y[a:b][chosen])
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.float32), keep


def train_lstm(train: TraceSet, config: LstmConfig | None = None, *, validation: TraceSet) -> LstmRiskModel:
    """Fit the LSTM on ``train``; choose its threshold on ``validation`` (other nodes)."""
    config = config or LstmConfig()
    config.validate()
    t0 = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)
    scaler = FeatureScaler.fit([node_features(t) for t in train.traces if len(t)])
    x, y, keep = training_windows(train, scaler, config, rng)
    net = RiskLSTM(x.shape[2], config.hidden)
    opt = torch.optim.Adam(net.parameters(), lr=config.learning_rate)
    loss_fn = nn.BCEWithLogitsLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(config.seed)
    losses = []
    with _threads(config.threads):
        net.train()
        for _ in range(config.epochs):
            order = torch.randperm(len(xt), generator=gen)
            total = 0.0
            for i in range(0, len(order), config.batch_size):
                idx = order[i : i + config.batch_size]
                opt.zero_grad()
                loss = loss_fn(net(xt[idx]), yt[idx])
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
            losses.append(round(total / len(order), 5))
        net.eval()
    fit_s = time.perf_counter() - t0
    data = trained_on(train, validation)
    model = LstmRiskModel(
        net=net, scaler=scaler, config=config, threshold=0.5, negative_keep=keep, trained_on=data
    )
    nodes = [
        NodeRisk(t.node, t.times, model.risk(t), validation.failure_times(t.node), t.interval_s)
        for t in validation.traces
        if len(t)
    ]
    points = operating_points(model, nodes, horizon_s=config.horizon_s)
    model.training = {
        "windows": len(y),
        "positives": int(y.sum()),
        "negative_keep": round(keep, 6),
        "epoch_loss": losses,
        "fit_seconds": round(fit_s, 2),
        "seconds": round(time.perf_counter() - t0, 2),
        **points,
        "validation_nodes": len(validation.traces),
        "threads": max(1, min(config.threads, os.cpu_count() or 1)),
    }
    return model
