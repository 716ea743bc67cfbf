"""The derived MoE load imbalance (workers/planner/moe.py) and how the cost model charges it."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from tests.unit.planner_helpers import a100_cluster, full_strategy
from workers import planner
from workers.planner.costmodel import CostModel, Layouts
from workers.planner.examples import contract
from workers.planner.hardware import efficiency_for
from workers.planner.moe import (
    MeasuredExpertLoad,
    expected_imbalance,
    expected_max_std_normal,
    mean_measured_load,
    rank_shares,
)


def simulated_imbalance(ep, experts, top_k, tokens, load=None, trials=300, seed=0) -> float:
    """Monte-Carlo mean of (busiest EP rank's assignments / mean): ``ep * tokens`` tokens, each routed to
    ``top_k`` distinct experts (uniformly, or with top_k = 1 by the per-expert ``load``), experts held
    contiguously ``experts / ep`` per rank."""
    rng = np.random.default_rng(seed)
    n = ep * tokens
    out = []
    for _ in range(trials):
        if load is None:
            chosen = np.argpartition(rng.random((n, experts)), top_k - 1, axis=1)[:, :top_k]
        else:
            assert top_k == 1
            chosen = rng.choice(experts, size=n, p=np.asarray(load) / np.sum(load))
        per_rank = np.bincount(np.ravel(chosen) // (experts // ep), minlength=ep)
        out.append(per_rank.max() / (tokens * top_k))
    return float(np.mean(out))


@pytest.mark.parametrize(
    ("ep", "experts", "top_k", "tokens"),
    [(2, 8, 2, 256), (4, 16, 2, 512), (8, 64, 4, 256), (16, 64, 2, 256), (8, 8, 1, 1024)],
)
def test_uniform_routing_model_matches_a_monte_carlo_simulation(ep, experts, top_k, tokens):
    simulated = simulated_imbalance(ep, experts, top_k, tokens)
    derived = float(expected_imbalance(ep, experts, top_k, tokens))
    assert derived == pytest.approx(simulated, rel=0.005)
    # the part above 1 (what sampling adds) within 10 %
    assert derived - 1 == pytest.approx(simulated - 1, rel=0.10)


@pytest.mark.parametrize(("ep", "tokens"), [(4, 512), (8, 256)])
def test_measured_load_model_matches_a_monte_carlo_simulation(ep, tokens):
    load = np.linspace(1.0, 2.0, 16)
    simulated = simulated_imbalance(ep, 16, 1, tokens, load=load)
    derived = float(expected_imbalance(ep, 16, 1, tokens, measured_load=load))
    assert derived == pytest.approx(simulated, rel=0.005)


def test_expected_maximum_of_normals_has_its_known_values():
    assert expected_max_std_normal(1) == 0.0
    assert expected_max_std_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-5)
    # tabulated E[max of 10 standard normals] = 1.53875 (David & Nagaraja 2003)
    assert expected_max_std_normal(10) == pytest.approx(1.53875, abs=1e-4)


def test_more_tokens_per_micro_batch_give_less_imbalance():
    tokens = np.array([256, 1024, 4096, 16384])
    uniform = expected_imbalance(8, 64, 2, tokens)
    assert np.all(np.diff(uniform) < 0) and np.all(uniform > 1.0)
    skewed = expected_imbalance(8, 64, 2, tokens, measured_load=np.linspace(1, 1.5, 64))
    assert np.all(np.diff(skewed) < 0)


def test_one_expert_parallel_rank_is_perfectly_balanced():
    assert float(expected_imbalance(1, 64, 2, 128)) == 1.0
    assert float(expected_imbalance(1, 64, 2, 128, measured_load=np.arange(1, 65))) == 1.0


def test_measured_skew_raises_the_imbalance_above_uniform_routing():
    uniform = float(expected_imbalance(8, 64, 2, 4096))
    # a perfectly even measured load is the uniform model again
    even = float(expected_imbalance(8, 64, 2, 4096, measured_load=np.ones(64)))
    assert even == pytest.approx(uniform, rel=1e-3)
    skewed_load = np.r_[np.full(16, 1.5), np.ones(48)]  # the experts of the first two ranks 1.5x as busy
    skewed = float(expected_imbalance(8, 64, 2, 4096, measured_load=skewed_load))
    floor = 8 * rank_shares(skewed_load, 64, 8).max()  # the skew alone, without sampling noise
    assert skewed > floor > uniform  # two equally busy ranks: the busier of the two is above their mean


def test_capacity_factor_caps_the_imbalance_as_dropped_tokens_do():
    skewed_load = np.r_[np.full(8, 3.0), np.ones(56)]
    uncapped = float(expected_imbalance(8, 64, 2, 4096, measured_load=skewed_load))
    capped = float(expected_imbalance(8, 64, 2, 4096, measured_load=skewed_load, capacity_factor=1.25))
    assert uncapped > 1.25 and capped == 1.25
    assert float(expected_imbalance(8, 64, 2, 4096, capacity_factor=1.25)) < 1.25  # not binding


def test_mean_measured_load_normalises_and_skips_runs_of_another_expert_count():
    mean = mean_measured_load([[2, 2, 0, 0], [0.5, 0.5, 0.0, 0.0], [1.0, 1.0], None], 4)
    assert mean == pytest.approx((0.5, 0.5, 0.0, 0.0))
    assert mean_measured_load([[1.0, 1.0]], 4) is None


def moe_model(**moe) -> planner.ModelSpec:
    doc = copy.deepcopy(contract("model-moe.json"))
    doc["moe"].pop("load_imbalance")
    doc["moe"].update(moe)
    return planner.ModelSpec.from_dict(doc)


def cost_model(model, expert_load=None) -> CostModel:
    cluster = planner.ClusterSpec.from_dict(a100_cluster(2))
    training = planner.TrainingConfig.from_dict(contract("training.json"))
    return CostModel(
        model, cluster, training, efficiency_for(cluster.device.name)[1], expert_load=expert_load
    )


EP8 = full_strategy(dp=16, ep=8, micro_batch_size=1, recompute="full", zero_stage=3)


def test_the_cost_models_moe_step_time_grows_with_the_derived_imbalance():
    model = moe_model(capacity_factor=None)
    layouts = Layouts.from_strategies([EP8])
    skew = np.r_[np.full(16, 3.0), np.ones(112)]
    measured = MeasuredExpertLoad(tuple(skew / skew.sum()), runs=3, source="jobs #1, #2, #3")
    uniform_cm, measured_cm = cost_model(model), cost_model(model, measured)
    uniform_load, measured_load = (
        float(uniform_cm.moe_load(layouts)[0]),
        float(measured_cm.moe_load(layouts)[0]),
    )
    assert 1.0 < uniform_load < 1.1 < measured_load
    uniform, skewed = uniform_cm.timing(layouts), measured_cm.timing(layouts)
    assert skewed["ep"][0] > uniform["ep"][0] and skewed["step"][0] > uniform["step"][0]
    assert cost_model(moe_model(capacity_factor=None)).moe_imbalance_origin()["method"] == "uniform routing"
    assert measured_cm.moe_imbalance_origin()["method"] == "measured in 3 runs"


def test_the_derived_imbalance_is_vectorised_over_layouts():
    cm = cost_model(moe_model())
    strategies = [full_strategy(dp=16, ep=ep, micro_batch_size=b) for ep in (1, 2, 8) for b in (1, 4)]
    layouts = Layouts.from_strategies(strategies)
    loads = cm.moe_load(layouts)
    assert loads.shape == (6,)
    for s, value in zip(strategies, loads, strict=True):
        tokens = s.micro_batch_size * cm.model.seq_length
        assert value == pytest.approx(float(expected_imbalance(s.ep, 128, 2, tokens, capacity_factor=1.25)))


def test_a_load_imbalance_in_the_model_document_overrides_the_derived_one_and_the_plan_says_so():
    given = moe_model(load_imbalance=1.2, capacity_factor=None)
    measured = MeasuredExpertLoad(tuple(np.full(128, 1 / 128)), runs=2)
    cm = cost_model(given, measured)
    assert float(cm.moe_load(Layouts.from_strategies([EP8]))[0]) == 1.2
    assert cm.moe_imbalance_origin()["method"] == "given in the model document"
    assert "overrides the expert load measured in 2 runs" in cm.moe_imbalance_origin()["source"]

    cluster = planner.ClusterSpec.from_dict(a100_cluster(2))
    training = planner.TrainingConfig.from_dict(contract("training.json"))
    plan = planner.evaluate(given, cluster, training, EP8, scaling=False)
    assert plan.predicted["moe_imbalance"]["value"] == 1.2
    derived = planner.evaluate(moe_model(), cluster, training, EP8, scaling=False, expert_load=measured)
    block = derived.predicted["moe_imbalance"]
    assert block["method"] == "measured in 2 runs" and 1.0 < block["value"] < 1.25
    dense = planner.ModelSpec.from_dict(contract("model.json"))
    assert "moe_imbalance" not in planner.evaluate(dense, cluster, training, full_strategy(dp=16)).predicted
