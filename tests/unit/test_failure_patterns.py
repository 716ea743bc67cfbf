"""The failure-pattern catalog (workers/reliability/risk/patterns.py): one pattern per Table 5 kind with its
published figures and source, the simulator's precursor assumptions labelled as such, a prevention action
that follows the precursor's signals, and the extension by imported incidents."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from workers.reliability.risk.features import FEATURE_NAMES
from workers.reliability.risk.history import incident_rows
from workers.reliability.risk.patterns import (
    ACTIONS,
    IMPORTED_NOTE,
    SIGNAL_FEATURES,
    SIGNAL_NAMES,
    extend_with_incidents,
    failure_patterns,
    find_pattern,
    pattern_key,
)
from workers.reliability.risk.policy import PreventionPolicy
from workers.reliability.risk.simulator import (
    KINDS,
    LLAMA3_RATE_PER_NODE_DAY,
    LLAMA3_TABLE5,
    LLAMA3_TABLE5_SOURCE,
    PRECURSORS,
    SIGNAL_EFFECTS,
)
from workers.reliability.risk.traces import Failure
from workers.reliability.telemetry.nvml import XID_DESCRIPTIONS

T0 = 1767225600.0  # 2026-01-01T00:00:00Z


def test_every_published_kind_is_one_pattern_with_its_table5_figures_and_source():
    patterns = failure_patterns()
    assert [p.key for p in patterns] == list(KINDS)
    total = sum(k.count for k in LLAMA3_TABLE5)
    for p, kind in zip(patterns, LLAMA3_TABLE5, strict=True):
        assert (p.component, p.category, p.origin) == (kind.component, kind.category, "published")
        assert p.published.count == kind.count and p.published.percent_printed == kind.percent
        assert p.published.share == pytest.approx(kind.count / total)
        assert p.published.source == LLAMA3_TABLE5_SOURCE and "54 days" in p.published.rate_source
        assert p.observed is None
    # the kinds' rates add up to Table 5's overall rate per node-day
    assert sum(p.published.rate_per_node_day for p in patterns) == pytest.approx(LLAMA3_RATE_PER_NODE_DAY)
    # only the figure Table 5 misprints (Faulty GPU: 30.1% for 148/419 = 35.3%) carries the note
    assert [p.key for p in patterns if p.published.note] == ["faulty_gpu"]


def test_precursors_are_the_simulators_assumptions_with_their_xids_and_telemetry():
    assert set(SIGNAL_NAMES) == set(SIGNAL_EFFECTS) == set(SIGNAL_FEATURES)
    assert {f for features in SIGNAL_FEATURES.values() for f in features} <= set(FEATURE_NAMES)
    for p in failure_patterns():
        shape, pre = PRECURSORS[p.key], p.precursor
        assert pre.assumed and "ASSUMPTION" in pre.source
        assert (pre.share, pre.lead_min_s, pre.lead_max_s, pre.why) == (
            shape.share,
            shape.lead_min_s,
            shape.lead_max_s,
            shape.why,
        )
        assert tuple(s.key for s in pre.signals) == shape.signals
        assert all(s.effect == SIGNAL_EFFECTS[s.key] and s.metrics for s in pre.signals)
        assert [(x.code, x.description) for x in pre.xid_codes] == [
            (c, XID_DESCRIPTIONS[c]) for c in shape.xid_codes
        ]
    hbm = find_pattern(failure_patterns(), "gpu_hbm3")
    sbe = next(s for s in hbm.precursor.signals if s.key == "sbe")
    assert sbe.features == ("ecc_sbe_per_min",) and "gpu.*.ecc_sbe_volatile_count" in sbe.metrics


def test_the_prevention_action_follows_the_precursors_signals():
    by_key = {p.key: p.prevention for p in failure_patterns()}
    assert set(a.action for a in by_key.values()) == set(ACTIONS)
    # the node's own hardware errors ahead of it: snapshot, then take the node out
    for key in ("faulty_gpu", "gpu_hbm3", "gpu_thermal", "nic"):
        assert by_key[key].action == "snapshot-then-drain", key
        assert "drain" in by_key[key].tiers[-1]
    # only slower compute on the host: a straggler, rebalanced or swapped out
    assert by_key["cpu"].action == "rebalance-or-swap" and "slower node" in by_key["cpu"].reason
    # job-wide symptoms name no node to take out
    assert by_key["software_bug"].action == by_key["nccl_watchdog"].action == "snapshot-now"
    # no precursor: nothing to act on ahead of it
    for key, shape in PRECURSORS.items():
        if shape.share == 0:
            assert by_key[key].action == "snapshots-and-recovery", key
            assert shape.why in by_key[key].reason
    # the tiers are the policy's
    assert by_key["gpu_hbm3"].tiers[:2] == ("warn at risk >= 0.6", "snapshot now at risk >= 0.85")
    strict = {p.key: p.prevention for p in failure_patterns(PreventionPolicy(warn_at=0.5, act_at=0.7))}
    assert strict["gpu_hbm3"].tiers[:2] == ("warn at risk >= 0.5", "snapshot now at risk >= 0.7")


@pytest.mark.parametrize(
    ("written", "key"),
    [
        ("gpu_hbm3", "gpu_hbm3"),
        ("GPU HBM3 Memory", "gpu_hbm3"),
        (" gpu-hbm3 ", "gpu_hbm3"),
        ("Gpu_Hbm3", "gpu_hbm3"),
        ("Network Switch/Cable", "network_switch_cable"),
        ("NCCL Watchdog Timeouts", "nccl_watchdog"),
        ("GPU Thermal Interface + Sensor", "gpu_thermal"),
        ("Kernel  panic", "kernel_panic"),
        ("kernel-panic", "kernel_panic"),
        ("---", ""),
    ],
)
def test_kinds_match_whatever_their_case_spaces_and_hyphens(written, key):
    assert pattern_key(written) == key


def test_imported_incidents_add_counts_and_new_patterns():
    catalog = failure_patterns()
    before = [asdict(p) for p in catalog]
    incidents = [
        Failure("node-a", T0 + 600, "gpu_hbm3"),
        Failure("node-b", T0 + 60, "GPU HBM3 Memory"),
        Failure("node-a", T0 + 7200, "gpu-hbm3"),
        Failure("node-c", T0 + 30, "Kernel panic"),
        Failure("node-c", T0 + 90, "kernel-panic"),
        Failure("node-d", T0 + 120, "Kernel panic"),
    ]
    extended = extend_with_incidents(catalog, incidents)

    assert [asdict(p) for p in catalog] == before, "the catalog it extends is left as it was"
    assert [p.key for p in extended] == [*KINDS, "kernel_panic"]
    hbm = find_pattern(extended, "gpu_hbm3")
    assert hbm.published == find_pattern(catalog, "gpu_hbm3").published
    assert (hbm.observed.count, hbm.observed.share) == (3, 0.5)
    assert (hbm.observed.first_seen_unix_s, hbm.observed.last_seen_unix_s) == (T0 + 60, T0 + 7200)
    assert hbm.observed.nodes == ("node-a", "node-b")
    assert hbm.observed.spellings == ("GPU HBM3 Memory", "gpu-hbm3", "gpu_hbm3")
    assert find_pattern(extended, "faulty_gpu").observed is None

    panic = extended[-1]
    assert (panic.origin, panic.note, panic.published, panic.precursor) == (
        "imported",
        IMPORTED_NOTE,
        None,
        None,
    )
    assert panic.component == "Kernel panic"  # its most frequent spelling
    assert panic.observed.count == 3 and panic.observed.nodes == ("node-c", "node-d")
    assert panic.prevention.action == "snapshots-and-recovery"
    assert panic.to_dict()["observed"]["count"] == 3


def test_new_patterns_come_most_frequent_first():
    incidents = [
        Failure("n", T0, "b thing"),
        Failure("n", T0 + 1, "a thing"),
        Failure("n", T0 + 2, "b thing"),
    ]
    extended = extend_with_incidents(failure_patterns(), incidents)
    assert [p.key for p in extended[len(KINDS) :]] == ["b_thing", "a_thing"]


def test_a_pattern_is_found_by_its_key_or_its_kind_as_written():
    patterns = failure_patterns()
    assert find_pattern(patterns, "GPU HBM3 Memory").key == "gpu_hbm3"
    assert find_pattern(patterns, "no such kind") is None
    assert find_pattern(patterns, "") is None


def test_incident_rows_carry_their_line_numbers():
    text = '# exported from the ticket system\nnode,time,kind,ticket\n\nnode-a,2026-01-01T00:10:00Z,gpu_hbm3,T-1\n# a comment\nnode-b,1767225660,"Network Switch/Cable, port 3",T-2\n'
    rows = incident_rows(text, source="tickets.csv")
    assert [(n, f.node, f.time_unix_s, f.kind) for n, f in rows] == [
        (4, "node-a", T0 + 600, "gpu_hbm3"),
        (6, "node-b", T0 + 60, "Network Switch/Cable, port 3"),
    ]
    with pytest.raises(ValueError, match=r"^tickets.csv, line 3: time 'soon' is neither ISO 8601"):
        incident_rows(
            "node,time,kind\nnode-a,2026-01-01T00:10:00Z,nic\nnode-b,soon,nic\n", source="tickets.csv"
        )
