"""Event-level evaluation of a risk model on held-out traces, the same function for every model.

An *alarm* is a sample whose risk is at or above the model's threshold; consecutive alarms of a node (no gap
between the samples) form one *alarm episode*, the unit an operator acts on. With ``H`` the horizon:

- a failure at ``f`` is **caught** when an alarm fires at some ``a`` with ``f - H <= a < f``; its **lead
  time** is ``f`` minus the earliest such alarm (an alarm after the failure catches nothing);
- an alarm episode is **true** when one of its alarms precedes a failure of its node within the horizon
  (the same condition), else it is a **false alarm**;
- ``precision`` = true episodes / all episodes, ``recall`` = caught failures / all failures (those with no
  precursor included: nothing can catch them, and they count), ``f1`` their harmonic mean,
  ``false_alarms_per_node_day`` = false episodes / node-days observed (samples x sampling interval).

Each model's threshold is chosen the same way, on validation traces apart from the held-out ones: the one
with the best F1 (:func:`choose_threshold`).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workers.reliability.risk.traces import TraceSet, fails_within, segments_of

LIU_2022_PRECISION = 0.84
"""The anchor to beat: precision 84.0% of GPU-failure prediction on a four-month production trace (Liu et al.
2022, 'Prediction of GPU Failures Under Deep Learning Workloads', arXiv:2201.11853, abstract: 'improve the
prediction precision from 46.3% to 84.0%')."""
LIU_2022_SOURCE = (
    "Liu et al. 2022, Prediction of GPU Failures Under Deep Learning Workloads, arXiv:2201.11853"
)


@dataclass
class NodeRisk:
    """One node's risk per sample and its failures."""

    node: str
    times: np.ndarray
    risk: np.ndarray
    failure_times: np.ndarray
    interval_s: float | None = None
    """The sampling interval (default: the median step between samples)."""

    def __post_init__(self) -> None:
        self.times = np.asarray(self.times, dtype=np.float64)
        self.risk = np.asarray(self.risk, dtype=np.float64)
        self.failure_times = np.sort(np.asarray(self.failure_times, dtype=np.float64))
        if self.times.shape != self.risk.shape:
            raise ValueError(f"node {self.node}: {len(self.risk)} risks for {len(self.times)} samples")
        if self.interval_s is None:
            self.interval_s = float(np.median(np.diff(self.times))) if len(self.times) > 1 else 30.0


@dataclass
class EventMetrics:
    threshold: float
    horizon_s: float
    failures: int
    caught: int
    alarm_episodes: int
    false_alarms: int
    node_days: float
    lead_times_s: list[float] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return (self.alarm_episodes - self.false_alarms) / self.alarm_episodes if self.alarm_episodes else 0.0

    @property
    def recall(self) -> float:
        return self.caught / self.failures if self.failures else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0

    @property
    def lead_time_s_median(self) -> float | None:
        return float(statistics.median(self.lead_times_s)) if self.lead_times_s else None

    @property
    def false_alarms_per_node_day(self) -> float:
        return self.false_alarms / self.node_days if self.node_days else 0.0

    def precision_at_rate(self, rate_per_node_day: float) -> float:
        """The precision with the same recall and false alarms per node-day if failures came at
        ``rate_per_node_day`` instead of this trace's rate (true episodes scale with the rate, false ones
        do not)."""
        observed = self.failures / self.node_days if self.node_days else 0.0
        if observed <= 0 or self.alarm_episodes == 0:
            return 0.0
        true_per_day = (
            (self.alarm_episodes - self.false_alarms) / self.node_days * rate_per_node_day / observed
        )
        denominator = true_per_day + self.false_alarms_per_node_day
        return true_per_day / denominator if denominator > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        lead = self.lead_time_s_median
        return {
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
            "f1": round(self.f1, 4),
            "lead_time_s_median": round(lead, 1) if lead is not None else None,
            "false_alarms_per_node_day": round(self.false_alarms_per_node_day, 4),
            "threshold": round(self.threshold, 6),
            "horizon_s": self.horizon_s,
            "failures": self.failures,
            "caught": self.caught,
            "alarm_episodes": self.alarm_episodes,
            "false_alarms": self.false_alarms,
            "node_days": round(self.node_days, 3),
        }


@dataclass
class _Prepared:
    """Threshold-independent facts of one node, so that many thresholds are cheap to try."""

    node: NodeRisk
    segment_start: np.ndarray
    precedes_failure: np.ndarray
    window_lo: np.ndarray
    window_hi: np.ndarray


def _prepare(node: NodeRisk, horizon_s: float) -> _Prepared:
    starts = np.zeros(len(node.times), dtype=bool)
    for a, _ in segments_of(node.times, node.interval_s):
        starts[a] = True
    fs = node.failure_times
    return _Prepared(
        node,
        starts,
        fails_within(node.times, fs, horizon_s),
        np.searchsorted(node.times, fs - horizon_s, side="left"),
        np.searchsorted(node.times, fs, side="left"),
    )


def _metrics(prepared: list[_Prepared], threshold: float, horizon_s: float) -> EventMetrics:
    failures = caught = episodes = false = 0
    samples_s = 0.0
    leads: list[float] = []
    for p in prepared:
        n = p.node
        samples_s += len(n.times) * n.interval_s
        failures += len(n.failure_times)
        alarm = n.risk >= threshold
        if not alarm.any():
            continue
        begins = alarm & (p.segment_start | ~np.concatenate([[False], alarm[:-1]]))
        episode = np.cumsum(begins) - 1  # episode id of each alarm sample
        episodes += int(begins.sum())
        true_ids = np.unique(episode[alarm & p.precedes_failure])
        false += int(begins.sum()) - len(true_ids)
        if len(n.failure_times):
            counts = np.concatenate([[0], np.cumsum(alarm)])
            hit = counts[p.window_hi] - counts[p.window_lo] > 0
            caught += int(hit.sum())
            alarm_idx = np.flatnonzero(alarm)
            for f, lo in zip(n.failure_times[hit], p.window_lo[hit], strict=True):
                first = alarm_idx[np.searchsorted(alarm_idx, lo)]
                leads.append(float(f - n.times[first]))
    return EventMetrics(threshold, horizon_s, failures, caught, episodes, false, samples_s / 86400.0, leads)


def event_metrics(nodes: list[NodeRisk], *, threshold: float, horizon_s: float) -> EventMetrics:
    """Precision, recall, F1, lead times and false alarms per node-day of ``risk >= threshold``."""
    if horizon_s <= 0:
        raise ValueError("horizon_s must be positive")
    return _metrics([_prepare(n, horizon_s) for n in nodes], threshold, horizon_s)


def choose_threshold(nodes: list[NodeRisk], *, horizon_s: float, candidates: int = 80) -> EventMetrics:
    """The threshold with the best F1 on ``nodes`` (the highest among equals: fewer alarms), and its metrics.
    Tried: quantiles of the risks from the 30th to the 99.999th percentile."""
    prepared = [_prepare(n, horizon_s) for n in nodes]
    risks = np.concatenate([n.risk for n in nodes]) if nodes else np.zeros(0)
    if len(risks) == 0:
        raise ValueError("no samples to choose a threshold on")
    qs = 1.0 - np.logspace(-5, np.log10(0.7), candidates)
    thresholds = np.unique(np.quantile(risks, qs))
    thresholds = thresholds[thresholds > 0] if np.any(thresholds > 0) else thresholds
    best: EventMetrics | None = None
    for thr in sorted(thresholds.tolist(), reverse=True):
        m = _metrics(prepared, float(thr), horizon_s)
        if best is None or m.f1 > best.f1 + 1e-12:
            best = m
    assert best is not None
    return best


def score(model, traces: TraceSet) -> list[NodeRisk]:
    """The model's risk on every node of ``traces``."""
    return [
        NodeRisk(t.node, t.times, model.risk(t), traces.failure_times(t.node), t.interval_s)
        for t in traces.traces
    ]


def split_validation(traces: TraceSet, share: float = 0.25) -> tuple[TraceSet, TraceSet]:
    """``(fit, validation)``: every ``1/share``-th node (at least one) is kept apart to choose thresholds
    on."""
    nodes = traces.nodes
    if len(nodes) < 2:
        raise ValueError("at least two nodes are needed: one to fit on, one to choose the threshold on")
    step = max(2, int(round(1 / share)))
    val = [n for i, n in enumerate(nodes) if i % step == step - 1] or [nodes[-1]]
    fit = [n for n in nodes if n not in set(val)]
    return traces.subset(fit, "fit"), traces.subset(val, "validation")


def trained_on(fit: TraceSet, validation: TraceSet) -> dict[str, Any]:
    """What a model was fitted and tuned on: the description of the data and its size (nodes counted once
    when the validation traces are the fit traces)."""
    seen: dict[str, Any] = {}
    for part in (fit, validation):
        for t in part.traces:
            seen[t.node] = (t.observed_s, len(part.failure_times(t.node)))
    intervals = [t.interval_s for part in (fit, validation) for t in part.traces if len(t) > 1]
    return {
        "description": fit.description,
        "interval_s": float(np.median(intervals)) if intervals else 30.0,
        "nodes": len(seen),
        "node_days": sum(s for s, _ in seen.values()) / 86400.0,
        "failures": sum(n for _, n in seen.values()),
    }


def describe_data(description: dict[str, Any], nodes: int, node_days: float, failures: int) -> str:
    d = description
    if d.get("source") == "simulated":
        return (
            f"simulated ({d['simulator']}, seed {d['seed']}): {nodes} nodes x {d['days']:g} days "
            f"({node_days:.1f} node-days up), {d['gpus_per_node']} GPUs/node, "
            f"a sample every {d['interval_s']:g} s, "
            f"{failures} failures at {d['failure_rate_per_node_day']:g}/node-day (assumption) drawn from "
            f"{'Llama 3 Table 5 (Dubey et al. 2024)' if 'Table 5' in d['failure_mix'] else d['failure_mix']}"
        )
    return (
        f"{d.get('source', 'imported')} ({d.get('traces', '?')}, incidents {d.get('incidents', '?')}): "
        f"{nodes} nodes, {node_days:.2f} node-days, {failures} incidents"
    )


def fit_models(
    train: TraceSet,
    *,
    horizon_s: float = 900.0,
    which: tuple[str, ...] = ("lstm", "baseline"),
    lstm_config=None,
    baseline_config=None,
) -> dict[str, Any]:
    """Both models fitted on ``train``: weights / statistics on three quarters of its nodes, each model's
    threshold (and the baseline's window) chosen on the other quarter."""
    from workers.reliability.risk.baseline import BaselineConfig, fit_baseline
    from workers.reliability.risk.lstm import LstmConfig, train_lstm

    fit, val = split_validation(train)
    models: dict[str, Any] = {}
    if "lstm" in which:
        cfg = lstm_config or LstmConfig(horizon_s=horizon_s)
        cfg.horizon_s = horizon_s
        models["lstm"] = train_lstm(fit, cfg, validation=val)
    if "baseline" in which:
        models["baseline"] = fit_baseline(
            fit, val, horizon_s=horizon_s, config=baseline_config or BaselineConfig()
        )
    return models


def evaluate_models(models: dict[str, Any], held_out: TraceSet) -> dict[str, EventMetrics]:
    """Each model's event metrics on ``held_out`` at the model's own threshold and horizon."""
    return {
        name: event_metrics(score(m, held_out), threshold=m.threshold, horizon_s=m.horizon_s)
        for name, m in models.items()
    }


def report(models: dict[str, Any], results: dict[str, EventMetrics], held_out: TraceSet) -> dict[str, Any]:
    """The ``evaluate --json`` document."""
    from workers.reliability.risk.simulator import LLAMA3_RATE_PER_NODE_DAY

    trained = {m.trained_on_text for m in models.values()}
    held = describe_data(
        held_out.description, len(held_out.traces), held_out.node_days, len(held_out.failures)
    )
    data = f"trained on {' / '.join(sorted(trained))}; evaluated on held-out {held}"
    out_models = {}
    for name, m in results.items():
        row = m.to_json()
        if held_out.description.get("source") == "simulated":
            row["precision_at_table5_rate"] = round(m.precision_at_rate(LLAMA3_RATE_PER_NODE_DAY), 4)
        out_models[name] = row
    best = max(results, key=lambda k: results[k].f1) if results else None
    return {
        "data": data,
        "models": out_models,
        "anchor": {
            "precision": LIU_2022_PRECISION,
            "source": LIU_2022_SOURCE,
            "beaten_by": sorted(k for k, m in results.items() if m.precision > LIU_2022_PRECISION),
        },
        "best_f1": best,
    }


def load_model(directory: str | Path):
    """A model saved by ``cann-train faults train`` (either kind)."""
    directory = Path(directory)
    meta_path = directory / "model.json"
    if not meta_path.is_file():
        raise ValueError(
            f"{directory}: no model.json (save a model with 'cann-train faults train --out DIR')"
        )
    kind = json.loads(meta_path.read_text()).get("model")
    if kind == "lstm":
        from workers.reliability.risk.lstm import LstmRiskModel

        return LstmRiskModel.load(directory)
    if kind == "baseline":
        from workers.reliability.risk.baseline import BaselineRiskModel

        return BaselineRiskModel.load(directory)
    raise ValueError(f"{meta_path}: unknown model kind {kind!r} (lstm or baseline)")


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0
