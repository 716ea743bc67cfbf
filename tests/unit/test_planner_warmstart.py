"""Correction factors from measured runs: per hardware profile and layout family, the geometric mean of
measured / predicted step time, falling back to the profile's, never taken from another device."""

from __future__ import annotations

import math

import pytest

from workers.planner.warmstart import MeasuredRun, layout_family, measurement_corrections

A100, H100 = "A100-SXM4-80GB", "H100-SXM5-80GB"
TP_DP = {"tp": 8, "pp": 1, "dp": 4, "ep": 1, "cp": 1, "zero_stage": 1, "recompute": "none"}
TP_PP_DP = {**TP_DP, "pp": 4}


def run(strategy: dict, profile: str, predicted: float, measured: float) -> MeasuredRun:
    return MeasuredRun(strategy, profile, predicted, measured)


def test_layout_family_is_the_dimensions_above_one_zero3_and_recompute():
    assert layout_family(TP_DP) == "tp+dp, zero<3, recompute none"
    assert (
        layout_family({**TP_PP_DP, "zero_stage": 3, "recompute": "full"}) == "tp+pp+dp, zero3, recompute full"
    )
    assert layout_family({"tp": 1}) == "single device, zero<3, recompute none"
    # the degrees do not matter, only which dimensions are used
    assert layout_family({**TP_DP, "tp": 2, "dp": 64}) == layout_family(TP_DP)


def test_factor_is_the_geometric_mean_of_measured_over_predicted_with_its_count():
    corrections = measurement_corrections(
        [run(TP_DP, A100, 1.0, 2.0), run({**TP_DP, "dp": 8}, A100, 2.0, 1.0)]
    )
    c = corrections.for_plan(TP_DP, A100)
    assert c.scope == "layout family" and c.runs == 2 and c.profile == A100
    assert c.factor == pytest.approx(1.0)  # sqrt(2 * 0.5), not the arithmetic 1.25
    three = measurement_corrections([run(TP_DP, A100, 1.0, r) for r in (1.1, 1.2, 1.5)])
    assert three.for_plan(TP_DP, A100).factor == pytest.approx((1.1 * 1.2 * 1.5) ** (1 / 3))


def test_factors_are_per_family():
    corrections = measurement_corrections([run(TP_DP, A100, 1.0, 1.2), run(TP_PP_DP, A100, 1.0, 2.0)])
    assert corrections.for_plan(TP_DP, A100).factor == pytest.approx(1.2)
    assert corrections.for_plan(TP_PP_DP, A100).factor == pytest.approx(2.0)
    assert corrections.for_plan(TP_PP_DP, A100).runs == 1


def test_a_family_with_no_runs_falls_back_to_the_profile_wide_factor():
    corrections = measurement_corrections([run(TP_DP, A100, 1.0, 1.2), run(TP_PP_DP, A100, 1.0, 2.0)])
    c = corrections.for_plan({**TP_DP, "zero_stage": 3}, A100)
    assert c.scope == "profile" and c.runs == 2
    assert c.factor == pytest.approx(math.sqrt(1.2 * 2.0))
    assert c.family == "tp+dp, zero3, recompute none"  # the plan's own family, which had no run


def test_no_factor_from_another_device():
    corrections = measurement_corrections([run(TP_DP, A100, 1.0, 1.5)])
    assert corrections.for_plan(TP_DP, H100) is None
    assert measurement_corrections([]).for_plan(TP_DP, A100) is None


def test_runs_without_a_positive_prediction_or_measurement_are_left_out():
    bad = [run(TP_DP, A100, 0.0, 1.0), run(TP_DP, A100, 1.0, None), run(TP_DP, "", 1.0, 1.0)]
    corrections = measurement_corrections([*bad, run(TP_DP, A100, 2.0, 3.0)])
    c = corrections.for_plan(TP_DP, A100)
    assert c.runs == 1 and c.factor == pytest.approx(1.5)
    assert corrections.runs == 1


def test_applied_correction_keeps_the_model_figures_and_says_how_far_off_they_were():
    c = measurement_corrections([run(TP_DP, A100, 1.0, 1.23), run(TP_DP, A100, 2.0, 2.46)]).for_plan(
        TP_DP, A100
    )
    doc = c.applied({"step_time_s": 3.0, "tokens_per_s": 1000.0})
    assert doc["factor"] == pytest.approx(1.23) and doc["runs"] == 2
    assert doc["corrected_step_time_s"] == pytest.approx(3.69)
    assert doc["corrected_tokens_per_s"] == pytest.approx(1000 / 1.23)
    assert doc["summary"].startswith("measured 1.23x slower in 2 runs of this layout family on this device")
    assert doc["summary"].endswith("corrected 3.69 s/step")
    faster = measurement_corrections([run(TP_DP, A100, 2.0, 1.0)]).for_plan(TP_DP, A100)
    assert "2.00x faster in 1 run of" in faster.applied({"step_time_s": 1.0})["summary"]
