"""The failure-pattern knowledge base: one pattern per kind of failure that interrupts a training job — what
it is, how often it happens (published, with the source), which telemetry shows it coming and how long
ahead, and what to do about it — extended with a team's own incidents.

Everything here is derived from tables that exist elsewhere, so that the simulator, the risk models and the
pages tell one story:

- the kinds, counts and shares: Llama 3's Table 5 (``simulator.LLAMA3_TABLE5``, cited there); the rate per
  node-day is Table 5's overall rate (``simulator.LLAMA3_RATE_PER_NODE_DAY``) times the kind's share;
- the precursors: ``simulator.PRECURSORS`` and ``simulator.SIGNAL_EFFECTS``, ASSUMPTIONS every one (the
  patterns say so); the XID codes are named from ``telemetry.nvml.XID_DESCRIPTIONS``; the risk features and
  metric names a signal shows in are ``features.FEATURES``;
- the prevention action: from the precursor's signals and the prevention tiers of
  ``risk_watch.PreventionPolicy`` (warn, snapshot now, then drain or rebalance), one rule per signal family
  (:func:`prevention_for`).

Imported incidents (``history.incident_rows``: node, time, kind) extend the catalog
(:func:`extend_with_incidents`): each pattern gets the observed count, share, first and last time and nodes;
a kind the catalog does not know becomes a pattern of its own, marked imported with no published rate.
Kinds match tolerantly (:func:`pattern_key`): ``GPU HBM3 Memory``, ``gpu-hbm3`` and ``gpu_hbm3`` are one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from workers.reliability.risk.features import FEATURES
from workers.reliability.risk.policy import PreventionPolicy
from workers.reliability.risk.simulator import (
    LLAMA3_RATE_PER_NODE_DAY,
    LLAMA3_RATE_SOURCE,
    LLAMA3_TABLE5,
    LLAMA3_TABLE5_NOTE,
    LLAMA3_TABLE5_SOURCE,
    PRECURSORS,
    SIGNAL_EFFECTS,
)
from workers.reliability.risk.traces import Failure
from workers.reliability.telemetry.nvml import describe_xid

PRECURSOR_SOURCE = (
    "ASSUMPTION of the fault simulator (workers/reliability/risk/simulator.py: PRECURSORS, SIGNAL_EFFECTS): "
    "plausible shapes from the telemetry NVIDIA and the exporters document, not measurements"
)
IMPORTED_NOTE = "imported, no published rate"

SIGNAL_NAMES: dict[str, str] = {
    # what each key of simulator.SIGNAL_EFFECTS is, for a person
    "temp": "GPU temperature",
    "temp_all": "every GPU's temperature",
    "sbe": "single-bit ECC errors",
    "remap": "remapped memory rows",
    "dbe": "double-bit ECC errors",
    "xid": "XID events",
    "nvlink": "NVLink CRC errors",
    "pcie": "PCIe replays",
    "nic": "NIC errors",
    "net_slow": "slower collectives",
    "slow": "one GPU's compute slows",
    "slow_all": "every rank of the host slows",
    "stall": "rank stalls",
    "power": "unstable GPU power",
    "disk": "disk busy",
}
SIGNAL_FEATURES: dict[str, tuple[str, ...]] = {
    # the risk features (features.FEATURES) each signal moves, as the simulator writes its metrics
    "temp": ("temp_max_C", "throttle_thermal"),
    "temp_all": ("temp_max_C",),
    "sbe": ("ecc_sbe_per_min",),
    "remap": ("mem_remap_per_min",),
    "dbe": ("ecc_dbe_per_min",),
    "xid": ("xid_per_min",),
    "nvlink": ("nvlink_errors_per_min",),
    "pcie": ("pcie_replays_per_min",),
    "nic": ("nic_errors_per_s",),
    "net_slow": ("collective_wait_s",),
    "slow": ("compute_time_s",),
    "slow_all": ("compute_time_s",),
    "stall": ("step_time_s",),
    "power": ("power_mean_W",),
    "disk": ("disk_busy_pct",),
}
# signal families, which decide the prevention action (prevention_for)
NODE_HARDWARE_SIGNALS = frozenset(
    {"temp", "temp_all", "sbe", "remap", "dbe", "xid", "nvlink", "pcie", "nic", "power", "disk"}
)
"""Counters and gauges of one node's own hardware: they name the node to take out."""
SLOWNESS_SIGNALS = frozenset({"slow", "slow_all"})
"""The node computes slower: a straggler the whole job waits for."""
JOB_WIDE_SIGNALS = frozenset({"net_slow", "stall"})
"""Every node waits more, or a rank stalls: the job shows it, but no node's hardware is named."""

ACTIONS: dict[str, str] = {
    "snapshot-then-drain": "snapshot now, then drain the node",
    "rebalance-or-swap": "snapshot now, then rebalance or swap the node out",
    "snapshot-now": "snapshot now (no drain)",
    "snapshots-and-recovery": "rely on snapshots and recovery",
}


@dataclass(frozen=True)
class Published:
    """What Table 5 says about the kind."""

    count: int
    """Interruptions of this kind among the 419 unexpected ones."""
    percent_printed: float
    """As Table 5 prints it (see ``note``)."""
    share: float
    """count / 419 (what the simulator draws by)."""
    rate_per_node_day: float
    """Table 5's overall rate x share: interruptions of this kind per node-day."""
    source: str
    rate_source: str
    note: str


@dataclass(frozen=True)
class Signal:
    key: str
    name: str
    effect: str
    """How it drifts before the failure (``SIGNAL_EFFECTS``, an assumption)."""
    features: tuple[str, ...]
    """The risk features it moves."""
    metrics: tuple[str, ...]
    """Our telemetry names behind those features (``*``: any device, NIC or disk)."""


@dataclass(frozen=True)
class XidCode:
    code: int
    description: str


@dataclass(frozen=True)
class Precursor:
    """What the kind shows before it happens: ASSUMED (``source``)."""

    share: float
    """Of the failures of this kind, the share that shows any precursor."""
    lead_min_s: float
    lead_max_s: float
    signals: tuple[Signal, ...]
    xid_codes: tuple[XidCode, ...]
    why: str
    assumed: bool = True
    source: str = PRECURSOR_SOURCE


@dataclass(frozen=True)
class Prevention:
    action: str
    """A key of :data:`ACTIONS`."""
    summary: str
    reason: str
    """One line: why this action fits the kind."""
    tiers: tuple[str, ...]
    """What the risk watch does at each risk (``PreventionPolicy``), for this kind."""


@dataclass(frozen=True)
class Observed:
    """The kind among imported incidents."""

    count: int
    share: float
    """Of all imported incidents."""
    first_seen_unix_s: float
    last_seen_unix_s: float
    nodes: tuple[str, ...]
    spellings: tuple[str, ...]
    """The kinds as the incident lists wrote them."""


@dataclass(frozen=True)
class FailurePattern:
    key: str
    component: str
    category: str
    origin: str
    """``published`` (Table 5) or ``imported`` (only in incident lists)."""
    published: Published | None
    precursor: Precursor | None
    """None: nothing is known (an imported kind)."""
    prevention: Prevention
    observed: Observed | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _normalised(text: str) -> str:
    return re.sub(r"[\W_]+", "_", text.casefold()).strip("_")


_ALIASES: dict[str, str] = {}
for _kind in LLAMA3_TABLE5:
    _ALIASES[_normalised(_kind.component)] = _kind.key
    _ALIASES[_normalised(_kind.key)] = _kind.key


def pattern_key(kind: str) -> str:
    """The pattern a kind as written belongs to: a simulator key where the kind names one of Table 5's (by
    key or component, case, spaces, hyphens and punctuation aside: ``GPU HBM3 Memory`` -> ``gpu_hbm3``),
    else the normalised kind itself (``Kernel panic`` -> ``kernel_panic``); empty when it has no letter or
    digit."""
    norm = _normalised(kind)
    return _ALIASES.get(norm, norm)


def _metric_text(pattern: str) -> str:
    """A feature's metric regex as a person reads it: ``^gpu\\.<device>\\.temp_C$`` -> ``gpu.*.temp_C``."""
    text = pattern.strip("^$").replace(r"[^.]+(?:\.[^.]+)*", "*").replace("[^.]+", "*").replace("[0-9]+", "N")
    return text.replace("\\.", ".")


_FEATURE_METRICS = {f.name: tuple(_metric_text(p) for p in f.patterns) for f in FEATURES}


def _signal(key: str) -> Signal:
    features = SIGNAL_FEATURES[key]
    return Signal(
        key=key,
        name=SIGNAL_NAMES[key],
        effect=SIGNAL_EFFECTS[key],
        features=features,
        metrics=tuple(m for f in features for m in _FEATURE_METRICS[f]),
    )


def lead_text(lead_min_s: float, lead_max_s: float) -> str:
    """``5-30 min``."""
    return f"{lead_min_s / 60:g}–{lead_max_s / 60:g} min"


def prevention_for(precursor: Precursor | None, policy: PreventionPolicy | None = None) -> Prevention:
    """The action that fits a kind, from its precursor's signals and the policy's tiers:

    - no precursor (or none is known): nothing to act on ahead; snapshots bound the loss, recovery resumes;
    - a signal of the node's own hardware: snapshot now, then drain the node (it is named, and will fail);
    - only slowness of the node: a straggler; snapshot now, then rebalance its work or swap it out;
    - only job-wide symptoms (slower collectives, stalls): snapshot now; a drain would not remove the cause.
    """
    policy = policy or PreventionPolicy()
    warn, act = f"{policy.warn_at:g}", f"{policy.act_at:g}"
    if precursor is None or precursor.share <= 0 or not precursor.signals:
        why = precursor.why if precursor is not None else "no precursor is known for this kind"
        return Prevention(
            action="snapshots-and-recovery",
            summary=ACTIONS["snapshots-and-recovery"],
            reason=f"{why}: nothing shows ahead to act on, so the job's snapshots bound what it costs and "
            "recovery resumes from the newest one",
            tiers=(
                "no precursor raises the risk before it happens",
                "recovery: restart from the newest snapshot, or go on without the node (elastic)",
            ),
        )
    keys = {s.key for s in precursor.signals}
    names = ", ".join(s.name for s in precursor.signals)
    ahead = f"{lead_text(precursor.lead_min_s, precursor.lead_max_s)} ahead in {precursor.share:.0%} of cases (assumed)"
    warned = f"warn at risk >= {warn}"
    snapshot = f"snapshot now at risk >= {act}"
    if keys & NODE_HARDWARE_SIGNALS:
        return Prevention(
            action="snapshot-then-drain",
            summary=ACTIONS["snapshot-then-drain"],
            reason=f"its precursors ({names}) show on the node's own hardware {ahead}: a snapshot bounds "
            "the loss and draining the node keeps its failure from interrupting the job",
            tiers=(warned, snapshot, "then drain the node (elastic shrink onto the healthy nodes)"),
        )
    if keys & SLOWNESS_SIGNALS:
        return Prevention(
            action="rebalance-or-swap",
            summary=ACTIONS["rebalance-or-swap"],
            reason=f"its precursor ({names}) is a slower node, {ahead}: every rank waits for it, so give it "
            "less work or swap it out (rebalancing is not built yet: the watch drains the node instead)",
            tiers=(warned, snapshot, "then rebalance its micro-batches or swap the node out (drain)"),
        )
    return Prevention(
        action="snapshot-now",
        summary=ACTIONS["snapshot-now"],
        reason=f"its precursors ({names}) slow the whole job rather than naming one node's hardware, {ahead}: "
        "a snapshot makes the failure cheap, and draining a node would not remove the cause",
        tiers=(warned, snapshot, "no drain: the cause is not one node's hardware"),
    )


def failure_patterns(policy: PreventionPolicy | None = None) -> list[FailurePattern]:
    """One pattern per kind of Table 5, in its order."""
    total = sum(k.count for k in LLAMA3_TABLE5)
    out = []
    for kind in LLAMA3_TABLE5:
        shape = PRECURSORS[kind.key]
        share = kind.count / total
        precursor = Precursor(
            share=shape.share,
            lead_min_s=shape.lead_min_s,
            lead_max_s=shape.lead_max_s,
            signals=tuple(_signal(s) for s in shape.signals),
            xid_codes=tuple(XidCode(c, describe_xid(c)) for c in shape.xid_codes),
            why=shape.why,
        )
        out.append(
            FailurePattern(
                key=kind.key,
                component=kind.component,
                category=kind.category,
                origin="published",
                published=Published(
                    count=kind.count,
                    percent_printed=kind.percent,
                    share=share,
                    rate_per_node_day=LLAMA3_RATE_PER_NODE_DAY * share,
                    source=LLAMA3_TABLE5_SOURCE,
                    rate_source=LLAMA3_RATE_SOURCE,
                    note=LLAMA3_TABLE5_NOTE if kind.percent != round(100 * share, 1) else "",
                ),
                precursor=precursor,
                prevention=prevention_for(precursor, policy),
            )
        )
    return out


def extend_with_incidents(
    patterns: list[FailurePattern], incidents: Iterable[Failure], policy: PreventionPolicy | None = None
) -> list[FailurePattern]:
    """The patterns with what the incidents observed of each (``observed``; None for a kind none of them
    has), then one pattern per kind they name that the catalog lacks, most frequent first (``origin``
    imported, no published figures, no known precursor). An incident whose kind has no letter or digit is
    left out (the import refuses it)."""
    by_key: dict[str, list[Failure]] = {}
    for failure in incidents:
        key = pattern_key(failure.kind)
        if key:
            by_key.setdefault(key, []).append(failure)
    total = sum(len(v) for v in by_key.values())

    def observed(failures: list[Failure]) -> Observed:
        times = [f.time_unix_s for f in failures]
        return Observed(
            count=len(failures),
            share=len(failures) / total,
            first_seen_unix_s=min(times),
            last_seen_unix_s=max(times),
            nodes=tuple(sorted({f.node for f in failures})),
            spellings=tuple(sorted({f.kind for f in failures})),
        )

    known = {p.key for p in patterns}
    out = [replace(p, observed=observed(by_key[p.key])) if p.key in by_key else p for p in patterns]
    new = sorted((k for k in by_key if k not in known), key=lambda k: (-len(by_key[k]), k))
    for key in new:
        failures = by_key[key]
        spelling = Counter(f.kind.strip() for f in failures).most_common(1)[0][0]
        out.append(
            FailurePattern(
                key=key,
                component=spelling,
                category="Imported",
                origin="imported",
                published=None,
                precursor=None,
                prevention=prevention_for(None, policy),
                observed=observed(failures),
                note=IMPORTED_NOTE,
            )
        )
    return out


def find_pattern(patterns: Iterable[FailurePattern], key: str) -> FailurePattern | None:
    """The pattern a key (or a kind as written: matched as :func:`pattern_key` matches) names, or None."""
    wanted = pattern_key(key)
    return next((p for p in patterns if p.key == wanted), None) if wanted else None
