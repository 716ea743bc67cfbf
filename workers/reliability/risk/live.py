"""Scoring live telemetry: keep each node's recent samples at the model's sampling interval and give the
values of a ``risk`` event (``workers/events.py``) for the node's latest sample.

The live sampler streams every few seconds; a model was trained on samples ``interval_s`` apart (30 s for
the simulator's default), and its window and counter rates assume that spacing. So the scorer keeps at most
one sample per interval (the first one at least ``interval_s`` after the last kept), and scores the node on
the last ``keep`` kept samples (enough for the LSTM's window and the baseline's rolling window).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from workers.reliability.risk.traces import NodeTrace
from workers.reliability.telemetry.base import TelemetrySample


class LiveRiskScorer:
    """Per node, the risk of failing within the model's horizon, from its streamed telemetry samples."""

    def __init__(self, model, *, keep: int | None = None) -> None:
        self.model = model
        self.interval_s = float(model.trained_on.get("interval_s", 30.0))
        window = getattr(getattr(model, "config", None), "window", None) or getattr(model, "window", 20)
        self.keep = keep or int(window) + 2
        self._samples: dict[str, deque[TelemetrySample]] = {}

    def add(self, sample: TelemetrySample) -> bool:
        """Keep ``sample`` if it is at least one interval after the node's last kept one; True if kept."""
        kept = self._samples.setdefault(sample.node, deque(maxlen=self.keep))
        if kept and sample.time_unix_s - kept[-1].time_unix_s < self.interval_s * 0.95:
            return False
        kept.append(sample)
        return True

    def score(self, node: str) -> dict[str, Any] | None:
        """The ``values`` of a ``risk`` event for the node's latest kept sample (None before any sample)."""
        kept = self._samples.get(node)
        if not kept:
            return None
        trace = NodeTrace.from_samples(node, list(kept))
        risk = float(self.model.risk(trace)[-1])
        return {
            "node": node,
            "risk": round(risk, 4),
            "at_risk": risk >= self.model.threshold,
            "threshold": self.model.threshold,
            # the model's high-precision operating point (None: validation reached no confident one)
            "precise_threshold": getattr(self.model, "precise_threshold", None),
            "horizon_s": self.model.horizon_s,
            "model": self.model.name,
            "trained_on": self.model.trained_on_text,
            "sampled_at_unix_s": kept[-1].time_unix_s,
            "samples": len(kept),
        }
