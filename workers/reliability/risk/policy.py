"""What the node risk watch may do about a node's risk, and the tiers it scores against: the policy the risk
models and the failure patterns are judged with, below the watch that applies it
(:mod:`workers.reliability.risk_watch`)."""

from __future__ import annotations

from dataclasses import dataclass

WARN_RISK = 0.6  # issue 14's prevention tiers: warn (event + badge) ...
ACT_RISK = 0.85  # ... snapshot now, then drain or rebalance


def risk_level(risk: float | None) -> str | None:
    """``high`` / ``medium`` / ``low`` for a risk in [0, 1] (None: not scored)."""
    if risk is None:
        return None
    return "high" if risk >= ACT_RISK else "medium" if risk >= WARN_RISK else "low"


@dataclass(frozen=True)
class PreventionPolicy:
    """What the watch may do about a node's risk (issue 14's tiers; ``mode`` is the job's ``risk_policy``)."""

    mode: str = "act"
    """``act`` or ``observe`` (report the risk and what would have been done; never act)."""
    warn_at: float = WARN_RISK
    act_at: float = ACT_RISK
    snapshot_cooldown_s: float = 120.0
    """At most one snapshot-now per this many seconds on a node (assumption: a snapshot of the job's state
    every few minutes bounds what a failure costs, and more would stall training for little)."""
    answer_timeout_s: float = 120.0
    """A snapshot the ranks did not take within this long is ``unanswered`` (they may be stopped or hung)."""
    cut_hang_min_s: float = 15.0
    """A stall is cut (``cut-hang``) no sooner than this: a quarter of the default 60 s hang timeout
    (assumption: longer than the pauses a healthy group takes between steps, a synchronous snapshot of a
    large model or a short evaluation; a user whose evaluations run longer sets a longer hang timeout)."""
    cut_hang_share: float = 0.25
    """... and no sooner than this share of the job's hang timeout."""

    def __post_init__(self) -> None:
        if self.mode not in ("act", "observe"):
            raise ValueError(f"mode must be act or observe, got {self.mode!r}")
        if not 0 < self.warn_at <= self.act_at <= 1:
            raise ValueError(f"need 0 < warn_at <= act_at <= 1, got {self.warn_at}, {self.act_at}")
