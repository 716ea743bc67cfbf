"""Per-node telemetry traces in column form, the failures that ended them, and their file format.

A :class:`NodeTrace` is one node's telemetry over time: ``times`` (Unix seconds, increasing) and, per metric
name (the names of :mod:`workers.reliability.telemetry`, e.g. ``gpu.0.temp_C``), one value per sample, NaN
where the metric was absent. A gap in ``times`` longer than 1.5 sampling intervals ends a *segment* (the
node was down, or not scraped): features, windows and alarm episodes never run across a segment boundary.

A :class:`TraceSet` is several nodes' traces, the labelled failures (simulated, or a user's incident list)
and a ``description`` of where the traces come from, which travels with every model trained on them. It is
saved as one ``.npz`` file (numpy's zip of arrays; the description and the failures as JSON).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workers.reliability.telemetry.base import TelemetrySample

GAP_FACTOR = 1.5
"""A step between samples longer than this many sampling intervals starts a new segment."""
FILE_FORMAT = "cann-train risk traces/1"


@dataclass
class NodeTrace:
    """One node's telemetry: a value per metric per sample (NaN: absent at that sample)."""

    node: str
    times: np.ndarray
    """Unix seconds, strictly increasing (float64)."""
    metrics: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.times = np.asarray(self.times, dtype=np.float64)
        if self.times.ndim != 1:
            raise ValueError(f"node {self.node}: times must be one-dimensional")
        if len(self.times) > 1 and not np.all(np.diff(self.times) > 0):
            raise ValueError(f"node {self.node}: sample times must be strictly increasing")
        for name, values in self.metrics.items():
            if np.shape(values) != self.times.shape:
                raise ValueError(
                    f"node {self.node}: metric {name} has {np.shape(values)} values "
                    f"for {len(self.times)} samples"
                )

    def __len__(self) -> int:
        return len(self.times)

    @property
    def interval_s(self) -> float:
        """The sampling interval: the median step between samples (30 s when there is only one sample)."""
        if len(self.times) < 2:
            return 30.0
        return float(np.median(np.diff(self.times)))

    @property
    def observed_s(self) -> float:
        """How long the node was observed: samples x sampling interval (gaps are not counted)."""
        return len(self.times) * self.interval_s

    def segments(self) -> list[tuple[int, int]]:
        """``[(start, stop), ...]`` index ranges of the runs of samples without a gap."""
        return segments_of(self.times, self.interval_s)

    def samples(self) -> Iterator[TelemetrySample]:
        """The trace as :class:`TelemetrySample` objects (what a ``telemetry`` event carries)."""
        names = sorted(self.metrics)
        columns = [np.asarray(self.metrics[n], dtype=np.float64) for n in names]
        for i, t in enumerate(self.times):
            values = {n: float(c[i]) for n, c in zip(names, columns, strict=True) if np.isfinite(c[i])}
            yield TelemetrySample(node=self.node, time_unix_s=float(t), values=values, source="trace")

    @classmethod
    def from_samples(cls, node: str, samples: list[TelemetrySample]) -> NodeTrace:
        """Columns from time-stamped samples (a metric a sample lacks is NaN there); samples at the same
        time are merged, the later one winning."""
        by_time: dict[float, dict[str, float]] = {}
        for s in samples:
            by_time.setdefault(float(s.time_unix_s), {}).update(s.values)
        times = np.array(sorted(by_time), dtype=np.float64)
        names = sorted({n for v in by_time.values() for n in v})
        metrics = {n: np.full(len(times), np.nan) for n in names}
        for i, t in enumerate(times):
            for n, v in by_time[float(t)].items():
                metrics[n][i] = v
        return cls(node=node, times=times, metrics=metrics)


def segments_of(times: np.ndarray, interval_s: float) -> list[tuple[int, int]]:
    if len(times) == 0:
        return []
    breaks = np.flatnonzero(np.diff(times) > GAP_FACTOR * interval_s) + 1
    starts = [0, *breaks.tolist()]
    stops = [*breaks.tolist(), len(times)]
    return list(zip(starts, stops, strict=True))


@dataclass(frozen=True)
class Failure:
    """One failure (an unexpected interruption) of one node."""

    node: str
    time_unix_s: float
    kind: str
    """A key of the failure taxonomy (``simulator.LLAMA3_TABLE5``) or, for imported incidents, as given."""
    precursor_s: float | None = None
    """Simulated failures only: how long before the failure its precursor signals started drifting (0: the
    failure had none). None for real incidents, where nobody knows."""


@dataclass
class TraceSet:
    """Several nodes' traces, the failures among them, and what they are."""

    traces: list[NodeTrace]
    failures: list[Failure]
    description: dict[str, Any]

    def __post_init__(self) -> None:
        names = [t.node for t in self.traces]
        if len(set(names)) != len(names):
            raise ValueError("each node appears once in a trace set")
        unknown = sorted({f.node for f in self.failures} - set(names))
        if unknown:
            raise ValueError(f"failures on nodes without a trace: {', '.join(unknown[:5])}")

    @property
    def nodes(self) -> list[str]:
        return [t.node for t in self.traces]

    @property
    def node_days(self) -> float:
        return sum(t.observed_s for t in self.traces) / 86400.0

    def failure_times(self, node: str) -> np.ndarray:
        return np.array(sorted(f.time_unix_s for f in self.failures if f.node == node), dtype=np.float64)

    def subset(self, nodes: list[str], note: str) -> TraceSet:
        """The traces and failures of ``nodes`` only; ``note`` says which part this is."""
        keep = set(nodes)
        return TraceSet(
            [t for t in self.traces if t.node in keep],
            [f for f in self.failures if f.node in keep],
            {**self.description, "part": note},
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        arrays: dict[str, np.ndarray] = {}
        index = []
        for i, t in enumerate(self.traces):
            arrays[f"times__{i}"] = t.times
            names = sorted(t.metrics)
            for j, name in enumerate(names):
                arrays[f"metric__{i}__{j}"] = np.asarray(t.metrics[name], dtype=np.float32)
            index.append({"node": t.node, "metrics": names})
        meta = {
            "format": FILE_FORMAT,
            "description": self.description,
            "nodes": index,
            "failures": [asdict(f) for f in self.failures],
        }
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with path.open("wb") as fh:
            np.savez_compressed(fh, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> TraceSet:
        path = Path(path)
        try:
            data = np.load(path, allow_pickle=False)
            meta = json.loads(bytes(data["meta"]).decode())
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(
                f"{path}: not a trace file written by 'cann-train faults simulate' ({exc})"
            ) from None
        if meta.get("format") != FILE_FORMAT:
            raise ValueError(f"{path}: trace file format {meta.get('format')!r}, expected {FILE_FORMAT!r}")
        traces = []
        for i, entry in enumerate(meta["nodes"]):
            metrics = {
                name: data[f"metric__{i}__{j}"].astype(np.float64) for j, name in enumerate(entry["metrics"])
            }
            traces.append(NodeTrace(entry["node"], data[f"times__{i}"], metrics))
        failures = [Failure(**f) for f in meta["failures"]]
        return cls(traces, failures, meta["description"])


def fails_within(times: np.ndarray, failure_times: np.ndarray, horizon_s: float) -> np.ndarray:
    """Per sample: does a failure of the node follow within the horizon, ``t < failure <= t + horizon``?
    (the label a predictor learns, and the alarm a perfect one would raise)."""
    times = np.asarray(times, dtype=np.float64)
    fs = np.sort(np.asarray(failure_times, dtype=np.float64))
    if len(fs) == 0:
        return np.zeros(len(times), dtype=bool)
    nxt = np.searchsorted(fs, times, side="right")
    ok = nxt < len(fs)
    out = np.zeros(len(times), dtype=bool)
    out[ok] = fs[nxt[ok]] <= times[ok] + horizon_s
    return out
