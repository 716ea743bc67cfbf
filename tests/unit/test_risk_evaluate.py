"""The event-level metric both failure predictors are judged by, on hand-built cases."""

from __future__ import annotations

import numpy as np
import pytest

from workers.reliability.risk.evaluate import (
    EventMetrics,
    NodeRisk,
    choose_precise_threshold,
    choose_threshold,
    event_metrics,
    wilson_lower_bound,
)

T0 = 1_767_225_600.0
DAY = 86_400.0


def node(
    name: str, alarms_at_s: list[float], failures_at_s: list[float], *, days: float = 1.0, dt: float = 30.0
):
    """A node sampled every ``dt`` s for ``days``, risk 1 at the given offsets, 0 elsewhere."""
    times = T0 + np.arange(0, days * DAY, dt)
    risk = np.zeros(len(times))
    for a in alarms_at_s:
        risk[int(round(a / dt))] = 1.0
    return NodeRisk(name, times, risk, [T0 + f for f in failures_at_s])


def test_an_alarm_ten_minutes_before_a_failure_catches_it_with_600_s_lead():
    m = event_metrics([node("a", [3600], [3600 + 600])], threshold=0.5, horizon_s=900)
    assert (m.failures, m.caught, m.alarm_episodes, m.false_alarms) == (1, 1, 1, 0)
    assert m.lead_time_s_median == 600
    assert m.precision == 1 and m.recall == 1 and m.f1 == 1


def test_an_alarm_after_the_failure_does_not_count_and_is_a_false_alarm():
    m = event_metrics([node("a", [3600 + 30], [3600])], threshold=0.5, horizon_s=900)
    assert (m.caught, m.alarm_episodes, m.false_alarms) == (0, 1, 1)
    assert m.lead_time_s_median is None
    assert m.precision == 0 and m.recall == 0 and m.f1 == 0


def test_an_alarm_at_the_failure_time_does_not_catch_it():
    m = event_metrics([node("a", [3600], [3600])], threshold=0.5, horizon_s=900)
    assert m.caught == 0 and m.false_alarms == 1


def test_an_alarm_earlier_than_the_horizon_is_false_and_misses():
    m = event_metrics([node("a", [3600], [3600 + 901])], threshold=0.5, horizon_s=900)
    assert (m.caught, m.false_alarms) == (0, 1)
    # at exactly the horizon it counts
    m = event_metrics([node("a", [3600], [3600 + 900])], threshold=0.5, horizon_s=900)
    assert (m.caught, m.false_alarms, m.lead_time_s_median) == (1, 0, 900)


def test_consecutive_alarms_are_one_episode_and_the_lead_is_from_the_first_within_the_horizon():
    # alarms from 20 min to 1 min before the failure: one episode; the earliest alarm inside the 15 min
    # horizon is 15 min before, so the lead is 900 s, and the episode is true
    f = 7200.0
    alarms = list(np.arange(f - 1200, f - 30, 30.0))
    m = event_metrics([node("a", alarms, [f])], threshold=0.5, horizon_s=900)
    assert (m.alarm_episodes, m.false_alarms, m.caught, m.lead_time_s_median) == (1, 0, 1, 900)


def test_an_alarm_on_another_node_does_not_catch_a_failure():
    m = event_metrics([node("a", [], [3600]), node("b", [3000], [])], threshold=0.5, horizon_s=900)
    assert (m.failures, m.caught, m.alarm_episodes, m.false_alarms) == (1, 0, 1, 1)


def test_false_alarms_per_node_day_is_false_episodes_over_observed_node_days():
    # two nodes x one day; three separate false episodes (samples apart) and one true one
    a = node("a", [1000, 5000, 9000], [], days=1)
    b = node("b", [20_000, 40_000], [40_300], days=1)
    m = event_metrics([a, b], threshold=0.5, horizon_s=900)
    assert m.node_days == pytest.approx(2.0)
    assert (m.alarm_episodes, m.false_alarms) == (5, 4)
    assert m.false_alarms_per_node_day == pytest.approx(2.0)
    assert m.precision == pytest.approx(1 / 5)
    assert m.recall == 1.0
    assert m.f1 == pytest.approx(2 * 0.2 * 1 / 1.2)


def test_an_episode_does_not_run_across_a_gap_in_the_samples():
    times = T0 + np.concatenate([np.arange(0, 3000, 30.0), np.arange(6000, 9000, 30.0)])
    risk = np.ones(len(times))
    m = event_metrics([NodeRisk("a", times, risk, [])], threshold=0.5, horizon_s=900)
    assert m.alarm_episodes == 2


def test_the_threshold_decides_what_is_an_alarm():
    n = node("a", [], [3600])
    n.risk[(3600 - 300) // 30] = 0.7  # 5 min before
    n.risk[20_000 // 30] = 0.4  # a weaker blip much later
    low = event_metrics([n], threshold=0.3, horizon_s=900)
    high = event_metrics([n], threshold=0.6, horizon_s=900)
    assert (low.alarm_episodes, low.false_alarms) == (2, 1)
    assert (high.alarm_episodes, high.false_alarms, high.lead_time_s_median) == (1, 0, 300)
    best = choose_threshold([n], horizon_s=900)
    assert best.f1 == 1.0 and 0.4 < best.threshold <= 0.7


def test_precision_at_another_failure_rate_scales_true_alarms_only():
    m = EventMetrics(0.5, 900, failures=10, caught=5, alarm_episodes=6, false_alarms=1, node_days=10.0)
    # 1 failure/node-day observed; at 0.1/node-day true episodes per day drop from 0.5 to 0.05, false stay 0.1
    assert m.precision == pytest.approx(5 / 6)
    assert m.precision_at_rate(0.1) == pytest.approx(0.05 / (0.05 + 0.1))


def test_the_wilson_bound_is_below_the_point_estimate_and_tightens_with_more_episodes():
    assert wilson_lower_bound(0, 0) == 0.0
    assert wilson_lower_bound(1, 1) < 0.3  # one true alarm says little
    assert wilson_lower_bound(9, 10) < wilson_lower_bound(90, 100) < wilson_lower_bound(900, 1000) < 0.9
    # the Wilson bound L of k in n solves (k/n - L)^2 = z^2 L (1 - L) / n, below k/n
    for k, n in ((81, 100), (42, 45), (3, 7)):
        low, p, z = wilson_lower_bound(k, n), k / n, 1.645
        assert low < p and (p - low) ** 2 == pytest.approx(z * z * low * (1 - low) / n)


def precision_world(strong_true: int, weak_true: int, weak_false: int) -> list[NodeRisk]:
    """One node per alarm: ``strong_true`` alarms of risk 0.9 before a failure, and at risk 0.5
    ``weak_true`` alarms before failures and ``weak_false`` alarms that precede nothing."""
    nodes = []
    for i, (count, level, fails) in enumerate(((strong_true, 0.9, True), (weak_true, 0.5, True),
                                               (weak_false, 0.5, False))):  # fmt: skip
        for j in range(count):
            n = node(f"n{i}-{j}", [3600.0], [3600.0 + 600] if fails else [])
            n.risk[n.risk > 0] = level
            nodes.append(n)
    return nodes


def test_the_precision_point_catches_the_most_failures_its_confident_precision_allows():
    # at 0.9: 60 of 60 alarms true; at 0.5: 90 of 100 (precision 0.9, its 95% lower bound just under 0.84)
    nodes = precision_world(60, 30, 10)
    f1 = choose_threshold(nodes, horizon_s=900)
    assert f1.threshold == 0.5 and f1.recall == 1.0  # F1 takes every catch and its 10 false alarms
    strict = choose_precise_threshold(nodes, horizon_s=900, min_precision=0.84)
    assert strict is not None and strict.threshold == 0.9 and strict.precision == 1.0 and strict.caught == 60
    looser = choose_precise_threshold(nodes, horizon_s=900, min_precision=0.80)
    assert looser is not None and looser.threshold == 0.5 and looser.caught == 90  # the most catches
    # no threshold is confident enough: None, never a silent fallback
    assert choose_precise_threshold(precision_world(3, 0, 0), horizon_s=900, min_precision=0.84) is None
