"""Predicted energy and carbon of a plan (workers/planner/energy.py): device power = idle + (TDP - idle) x
the busy share of the step, times the devices and the step time; per 1M tokens from the predicted
tokens/s; facility energy x PUE (the green engine's cited default unless given); carbon only with an
intensity. Every plan the planner costs carries the block under ``predicted["energy"]``; a plan document
without it still loads."""

from __future__ import annotations

import copy

import pytest

from tests.unit.planner_helpers import a100_cluster
from workers import planner
from workers.green.energy import DEFAULT_PUE
from workers.planner.energy import (
    DEFAULT_PUE_REFERENCE,
    NO_IDLE_NOTE,
    UTILISATION_BASIS,
    UTILISATION_BASIS_CONTRACT,
    predict_energy,
)
from workers.planner.examples import contract, small_example
from workers.planner.visual import plan_breakdown
from workers.training.config import strategy_from_plan

H100 = {"name": "H100-SXM5-80GB", "tdp_watts": 700, "tdp_source": "NVIDIA H100 datasheet"}


def hand_plan(step=2.0, tokens_per_s=1000.0, compute=1.5, optimizer=0.1, tp=2, pp=2, dp=2) -> dict:
    """A plan.json with round figures: 8 devices, busy 1.6 s of a 2 s step (utilisation 0.8)."""
    return {
        "strategy": {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "ep": 1,
            "cp": 1,
            "vpp": 1,
            "micro_batch_size": 1,
            "recompute": "none",
            "zero_stage": 1,
            "sequence_parallel": False,
        },
        "feasible": True,
        "reason": "",
        "predicted": {
            "step_time_s": step,
            "tokens_per_s": tokens_per_s,
            "compute_s": compute,
            "optimizer_s": optimizer,
            "bubble_fraction": 0.1,
            "exposed_comm_s": 0.2,
        },
    }


def small_search(monkeypatch, tmp_path, cluster=None, top_k=5):
    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))  # the shipped cpu profile, not a calibration
    docs = small_example()
    model, cluster, training = planner.specs.load_inputs(
        docs["model"], cluster or docs["cluster"], docs["training"]
    )
    return planner.search(model, cluster, training, top_k=top_k, scaling=False), cluster


# ------------------------------------------------------------------------------------ exact arithmetic


def test_energy_of_a_hand_made_plan_is_devices_times_power_times_time():
    e = predict_energy(hand_plan(), {"name": "A100", "tdp_watts": 400, "tdp_source": "datasheet"})
    assert e["method"] == "predicted"
    assert e["devices"] == 8
    assert e["utilisation"] == pytest.approx(0.8, rel=1e-12)  # (1.5 + 0.1) / 2
    assert e["watts_per_device"] == pytest.approx(320.0, rel=1e-12)  # 400 W x 0.8, no idle figure
    # 8 x 320 W x 2 s = 5120 J
    assert e["kwh_per_step"] == pytest.approx(5120 / 3.6e6, rel=1e-12)
    # 8 x 320 W for 1e6 tokens at 1000 tokens/s = 2.56e6 J
    assert e["kwh_per_1m_tokens"] == pytest.approx(2.56e6 / 3.6e6, rel=1e-12)
    assert e["tokens_per_kwh"] == pytest.approx(1000 * 3.6e6 / 2560, rel=1e-12)  # 1,406,250
    assert e["tokens_per_kwh"] * e["kwh_per_1m_tokens"] == pytest.approx(1e6, rel=1e-12)
    assert e["pue"] == DEFAULT_PUE  # the green engine's cited default, reused
    assert e["facility_kwh_per_step"] == pytest.approx(5120 / 3.6e6 * DEFAULT_PUE, rel=1e-12)
    assert e["facility_kwh_per_1m_tokens"] == pytest.approx(2.56e6 / 3.6e6 * DEFAULT_PUE, rel=1e-12)
    assert e["inputs"]["pue_source"] == DEFAULT_PUE_REFERENCE
    assert e["inputs"]["tdp_watts"] == 400 and e["inputs"]["tdp_source"] == "datasheet"
    assert e["inputs"]["step_time_s"] == 2.0 and e["inputs"]["tokens_per_s"] == 1000.0
    assert e["inputs"]["utilisation_basis"] == UTILISATION_BASIS
    assert e["inputs"]["idle_watts"] == 0.0 and NO_IDLE_NOTE in e["notes"]
    assert "not predicted" in e["scope"]


def test_carbon_is_facility_energy_times_intensity_and_absent_without_one():
    plan = hand_plan()
    without = predict_energy(plan, H100)
    assert "kgco2e_per_step" not in without and "kgco2e_per_1m_tokens" not in without
    assert "intensity_g_per_kwh" not in without["inputs"]

    e = predict_energy(
        plan,
        H100,
        pue=1.2,
        pue_source="operator's 2024 report",
        intensity_g_per_kwh=250.0,
        intensity_source="UK Carbon Intensity, GB, 2020 average",
    )
    it_w = 8 * 700 * 0.8  # 4480 W
    assert e["pue"] == 1.2 and e["inputs"]["pue_source"] == "operator's 2024 report"
    assert e["kgco2e_per_step"] == pytest.approx(it_w * 2.0 / 3.6e6 * 1.2 * 250 / 1000, rel=1e-12)
    assert e["kgco2e_per_1m_tokens"] == pytest.approx(it_w * 1e6 / 1000 / 3.6e6 * 1.2 * 250 / 1000, rel=1e-12)
    assert e["inputs"]["intensity_g_per_kwh"] == 250.0
    assert e["inputs"]["intensity_source"].startswith("UK Carbon Intensity")
    # a zero-carbon grid is a zero, not an absence
    assert (
        predict_energy(plan, H100, intensity_g_per_kwh=0, intensity_source="contract")["kgco2e_per_step"] == 0
    )


def test_a_cited_idle_power_sits_under_the_busy_share():
    e = predict_energy(
        hand_plan(compute=0.9, optimizer=0.1),
        {**H100, "tdp_watts": 400},
        idle_watts=60,
        idle_source="measured here with nvidia-smi, idle, 2026-01-01",
    )
    assert e["utilisation"] == pytest.approx(0.5, rel=1e-12)
    assert e["watts_per_device"] == pytest.approx(60 + (400 - 60) * 0.5, rel=1e-12)  # 230 W
    assert e["inputs"]["idle_watts"] == 60 and "nvidia-smi" in e["inputs"]["idle_source"]
    assert NO_IDLE_NOTE not in e["notes"]
    # from the device dict too
    d = predict_energy(hand_plan(), {**H100, "idle_watts": 70, "sources": {"idle_watts": "a paper"}})
    assert d["watts_per_device"] == pytest.approx(70 + 630 * 0.8, rel=1e-12)


def test_bare_predicted_figures_need_the_device_count():
    pred = hand_plan()["predicted"]
    with pytest.raises(ValueError, match="num_devices is required"):
        predict_energy(pred, H100)
    assert predict_energy(pred, H100, num_devices=16)["kwh_per_step"] == pytest.approx(
        2 * predict_energy(pred, H100, num_devices=8)["kwh_per_step"], rel=1e-12
    )


# ------------------------------------------------------------------------------------ monotonic sanity


def test_more_devices_at_the_same_step_time_draw_more_energy():
    small = predict_energy(hand_plan(dp=2), H100)
    large = predict_energy(hand_plan(dp=4), H100)  # twice the devices, same step time and throughput
    assert large["devices"] == 2 * small["devices"]
    assert large["kwh_per_step"] > small["kwh_per_step"]
    assert large["kwh_per_1m_tokens"] > small["kwh_per_1m_tokens"]
    assert large["tokens_per_kwh"] < small["tokens_per_kwh"]


@pytest.mark.parametrize("idle", [None, 60.0])
def test_higher_utilisation_draws_more_power(idle):
    kw = {"idle_watts": idle, "idle_source": "test figure"} if idle is not None else {}
    watts = [
        predict_energy(hand_plan(compute=c, optimizer=0.0), H100, **kw)["watts_per_device"]
        for c in (0.2, 0.8, 1.4, 2.0)
    ]
    assert watts == sorted(watts) and len(set(watts)) == 4
    assert watts[-1] == pytest.approx(700.0)  # fully busy: the board power


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("profile", "kwargs", "message"),
    [
        ({"name": "Mystery"}, {}, "has no tdp_watts"),
        ({"tdp_watts": -5}, {}, "tdp_watts must be a finite number > 0"),
        (H100, {"pue": 0.9, "pue_source": "x"}, "pue"),
        (H100, {"pue": 1.3}, "needs its source"),
        (H100, {"pue_source": "x"}, "without a pue"),
        (H100, {"intensity_g_per_kwh": -1, "intensity_source": "x"}, "intensity_g_per_kwh"),
        (H100, {"intensity_g_per_kwh": 300}, "needs its source"),
        (H100, {"idle_watts": 900, "idle_source": "x"}, "must be below tdp_watts"),
        (H100, {"idle_watts": 50}, "idle_watts needs its source"),
        ("H100", {}, "hardware_profile must be"),
    ],
)
def test_inputs_are_checked_with_a_message_that_says_what_to_do(profile, kwargs, message):
    with pytest.raises(ValueError, match=message):
        predict_energy(hand_plan(), profile, **kwargs)


def test_a_plan_without_a_step_time_is_refused():
    plan = hand_plan()
    plan["predicted"]["step_time_s"] = 0
    with pytest.raises(ValueError, match="step_time_s must be a finite number > 0"):
        predict_energy(plan, H100)


# ------------------------------------------------------------------------------------ plans the planner costs


def test_every_plan_of_a_small_search_carries_the_energy_block(monkeypatch, tmp_path):
    result, cluster = small_search(monkeypatch, tmp_path)
    plans = result.top + result.pareto
    assert plans
    for plan in plans:
        e = plan.to_dict()["predicted"]["energy"]
        assert e["method"] == "predicted"
        assert e["devices"] == cluster.num_devices
        assert 0 < e["utilisation"] <= 1
        assert 0 < e["watts_per_device"] <= cluster.device.tdp_watts
        assert e["kwh_per_step"] > 0 and e["kwh_per_1m_tokens"] > 0 and e["tokens_per_kwh"] > 0
        assert e["inputs"]["tdp_source"] == "cluster.json device.tdp_watts"
        assert "kgco2e_per_step" not in e  # no intensity in a search
        # re-verifiable: the block is predict_energy of the plan's own stored figures
        plain = {k: v for k, v in plan.predicted.items() if k != "energy"}
        assert predict_energy({**plan.to_dict(), "predicted": plain}, cluster.device) == e


def test_a_what_if_plan_carries_it_too(monkeypatch, tmp_path):
    result, cluster = small_search(monkeypatch, tmp_path, top_k=1)
    docs = small_example()
    model, cluster, training = planner.specs.load_inputs(docs["model"], docs["cluster"], docs["training"])
    plan = planner.evaluate(model, cluster, training, result.best.strategy, scaling=False)
    assert plan.predicted["energy"] == result.best.predicted["energy"]


def test_a_cluster_without_tdp_takes_the_hardware_profiles(monkeypatch, tmp_path):
    doc = a100_cluster(1, 2)
    assert "tdp_watts" not in doc["device"]
    result, _cluster = small_search(monkeypatch, tmp_path, cluster=doc, top_k=1)
    e = result.best.predicted["energy"]
    assert e["inputs"]["tdp_watts"] == 400
    assert "hardware_profiles.json profile A100-SXM4-80GB" in e["inputs"]["tdp_source"]


def test_a_device_of_unknown_power_gets_a_block_that_says_why(monkeypatch, tmp_path):
    doc = copy.deepcopy(a100_cluster(1, 2))
    doc["device"]["name"] = "MysteryChip-9000"
    result, _cluster = small_search(monkeypatch, tmp_path, cluster=doc, top_k=1)
    e = result.best.predicted["energy"]
    assert e["method"] == "predicted" and "tokens_per_kwh" not in e
    assert "MysteryChip-9000" in e["unavailable"] and "device.tdp_watts" in e["unavailable"]


# ------------------------------------------------------------------------------------ back-compat


def test_a_plan_document_without_the_block_still_loads_and_can_be_costed():
    plan = contract("plan.json")  # the seed contract: no compute_s, no energy
    assert "energy" not in plan["predicted"]
    assert strategy_from_plan(plan)["tp"] == 8
    assert plan_breakdown(plan["predicted"], 80)["step_time"]["step_time_s"] == 21.4
    e = predict_energy(plan, contract("cluster.json")["device"])
    p = plan["predicted"]
    u = 1 - p["bubble_fraction"] - p["exposed_comm_s"] / p["step_time_s"]
    assert e["inputs"]["utilisation_basis"] == UTILISATION_BASIS_CONTRACT
    assert e["utilisation"] == pytest.approx(u, rel=1e-12)
    assert e["devices"] == 8 * 8 * 16
    assert e["tokens_per_kwh"] == pytest.approx(147000 * 3.6e6 / (1024 * 400 * u), rel=1e-12)


def test_a_plan_with_too_few_figures_says_to_re_cost_it():
    with pytest.raises(ValueError, match="re-cost the plan"):
        predict_energy({"step_time_s": 1.0, "tokens_per_s": 10.0}, H100, num_devices=1)
