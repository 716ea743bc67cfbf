"""Search objectives and user constraints: the ranking follows the objective, the limits reject what they
should and say so, and a bad value is an error naming the field and what is allowed."""

import json

import pytest

from tests.unit.planner_helpers import a100_cluster
from workers.planner import ClusterSpec, ModelSpec, SpecError, TrainingConfig, search
from workers.planner.examples import CONTRACTS
from workers.planner.search import OBJECTIVES, checked_ranking, search_allowing_idle_nodes

# GPT-3 175B on 8 A100 nodes, global batch 64, with cp, vpp and the micro-batch pinned: a couple of hundred
# feasible layouts, so top_k=1000 returns every one of them and "best" can be checked against all
FIXED = {"cp": 1, "vpp": 1, "micro_batch_size": 1}
EVERY_PLAN = 1000


@pytest.fixture(scope="module")
def scenario():
    model = ModelSpec.from_dict(json.loads((CONTRACTS / "model.json").read_text()))
    training = json.loads((CONTRACTS / "training.json").read_text())
    return (
        model,
        ClusterSpec.from_dict(a100_cluster(8)),
        TrainingConfig.from_dict({**training, "global_batch_size": 64}),
    )


@pytest.fixture(scope="module")
def every_plan(scenario):
    """Every feasible plan of the scenario, by objective."""
    out = {}
    for objective in OBJECTIVES:
        result = search(*scenario, fixed=FIXED, top_k=EVERY_PLAN, objective=objective)
        assert len(result.top) == result.stats["feasible"] > 50  # the whole feasible set
        out[objective] = result
    return out


def headroom(plan):
    return plan.predicted["memory_headroom_GiB"]


def volume(plan):
    return plan.predicted["comm_volume_GB_per_device"]


def tokens_per_kwh(plan):
    return plan.predicted["energy"]["tokens_per_kwh"]


def tokens(plan):
    return plan.predicted["tokens_per_s"]


def test_throughput_is_the_default_and_ranks_fastest_first(scenario, every_plan):
    default = search(*scenario, fixed=FIXED, top_k=EVERY_PLAN)
    ranked = every_plan["throughput"]
    assert default.stats["objective"] == "throughput" and default.stats["constraints"] == {}
    assert [p.strategy for p in default.top] == [p.strategy for p in ranked.top]
    assert tokens(ranked.best) == max(tokens(p) for p in ranked.top)


def test_memory_headroom_best_plan_has_the_most_free_memory_of_all_feasible_plans(every_plan):
    result = every_plan["memory_headroom"]
    assert result.stats["objective"] == "memory_headroom"
    assert headroom(result.best) == max(headroom(p) for p in result.top)
    assert headroom(result.best) > headroom(every_plan["throughput"].best)
    figures = [headroom(p) for p in result.top]
    assert figures == sorted(figures, reverse=True)  # (to the rounding of the GiB figure)


def test_communication_volume_best_plan_communicates_the_least(every_plan):
    result = every_plan["communication_volume"]
    assert volume(result.best) == min(volume(p) for p in result.top)
    assert volume(result.best) < volume(every_plan["throughput"].best)
    figures = [volume(p) for p in result.top]
    assert figures == sorted(figures)


def test_energy_best_plan_trains_the_most_tokens_per_kwh(every_plan):
    result = every_plan["energy"]
    best = tokens_per_kwh(result.best)
    # ranked on the unrounded figures; the plan's energy block is computed from rounded ones
    assert best >= max(tokens_per_kwh(p) for p in result.top) * (1 - 1e-4)
    assert best > tokens_per_kwh(every_plan["throughput"].best)
    figures = [tokens_per_kwh(p) for p in result.top]
    assert all(a >= b * (1 - 1e-4) for a, b in zip(figures, figures[1:], strict=False))


def test_ties_of_an_objective_go_to_the_faster_plan(every_plan):
    top = every_plan["communication_volume"].top
    ties = [(a, b) for a, b in zip(top, top[1:], strict=False) if volume(a) == volume(b)]
    assert ties, "the scenario should have plans that communicate the same bytes"
    assert all(a.predicted["step_time_s"] <= b.predicted["step_time_s"] for a, b in ties)


def test_the_pareto_front_does_not_depend_on_the_objective(every_plan):
    fronts = {o: sorted(p.strategy.short_name() for p in r.pareto) for o, r in every_plan.items()}
    assert len({json.dumps(f) for f in fronts.values()}) == 1


def test_memory_limit_rejects_plans_above_it_and_the_stats_name_it(scenario, every_plan):
    everything = every_plan["throughput"]
    limit = sorted(p.predicted["memory_GiB_per_device"]["total"] for p in everything.top)[
        len(everything.top) // 2
    ]
    result = search(
        *scenario, fixed=FIXED, top_k=EVERY_PLAN, constraints={"max_memory_GiB_per_device": limit}
    )
    assert all(p.predicted["memory_GiB_per_device"]["total"] <= limit + 0.01 for p in result.top)
    reason = f"predicted peak memory above max_memory_GiB_per_device ({limit:g} GiB)"
    rejected = result.stats["rejected"][reason]
    assert rejected == result.stats["constraint_rejected"]["max_memory_GiB_per_device"] > 0
    assert result.stats["feasible"] + rejected == everything.stats["feasible"]
    assert result.stats["constraints"] == {"max_memory_GiB_per_device": limit}


def test_bubble_limit_rejects_plans_above_it_and_the_stats_name_it(scenario, every_plan):
    everything = every_plan["throughput"]
    assert max(p.predicted["bubble_fraction"] for p in everything.top) > 0.1
    result = search(*scenario, fixed=FIXED, top_k=EVERY_PLAN, constraints={"max_bubble_fraction": 0.1})
    assert result.top and all(p.predicted["bubble_fraction"] <= 0.1 + 1e-4 for p in result.top)
    rejected = result.stats["rejected"]["predicted pipeline bubble above max_bubble_fraction (0.1)"]
    assert result.stats["feasible"] + rejected == everything.stats["feasible"]


def test_limits_and_objective_combine(scenario):
    result = search(
        *scenario,
        fixed=FIXED,
        top_k=EVERY_PLAN,
        objective="memory_headroom",
        constraints={"max_bubble_fraction": 0.05, "max_memory_GiB_per_device": None},  # None: no limit
    )
    assert result.stats["constraints"] == {"max_bubble_fraction": 0.05}
    assert all(p.predicted["bubble_fraction"] <= 0.05 + 1e-4 for p in result.top)
    assert headroom(result.best) == max(headroom(p) for p in result.top)


def test_a_limit_nothing_meets_says_which_limit_rejected_how_many_and_what_to_relax(scenario):
    result = search(*scenario, fixed=FIXED, constraints={"max_memory_GiB_per_device": 1})
    assert result.best is None
    n = result.stats["constraint_rejected"]["max_memory_GiB_per_device"]
    why, change = result.stats["tightest"].split(" — ")
    assert why.startswith(f"max_memory_GiB_per_device = 1 rejected {n:,} layouts that fit the device")
    assert change.startswith("raise max_memory_GiB_per_device to at least ")
    leanest = float(change.split("at least ")[1].split(" GiB")[0])
    assert leanest > 1
    # the lowest limit it suggests is met by a plan
    assert search(*scenario, fixed=FIXED, constraints={"max_memory_GiB_per_device": leanest}).best is not None


def test_a_bubble_limit_nothing_meets_names_the_smallest_bubble(scenario):
    result = search(*scenario, fixed={**FIXED, "pp": 8}, constraints={"max_bubble_fraction": 0.01})
    assert result.best is None
    assert result.stats["tightest"].startswith("max_bubble_fraction = 0.01 rejected ")
    assert "the smallest predicted bubble is " in result.stats["tightest"]
    assert "raise max_bubble_fraction to at least " in result.stats["tightest"]


def test_a_user_limit_does_not_send_the_search_to_fewer_nodes(scenario):
    result, cluster = search_allowing_idle_nodes(
        *scenario, fixed=FIXED, constraints={"max_memory_GiB_per_device": 1}
    )
    assert result.best is None and cluster.num_nodes == 8 and "nodes_used" not in result.stats


@pytest.mark.parametrize(
    ("objective", "constraints", "field", "words"),
    [
        ("speed", None, "objective", "must be one of: throughput"),
        (None, {"max_memory_GiB_per_device": -4}, "constraints.max_memory_GiB_per_device", "> 0"),
        (None, {"max_memory_GiB_per_device": "lots"}, "constraints.max_memory_GiB_per_device", "GiB > 0"),
        (None, {"max_memory_GiB_per_device": float("inf")}, "constraints.max_memory_GiB_per_device", "> 0"),
        (None, {"max_bubble_fraction": 1.5}, "constraints.max_bubble_fraction", "between 0 and 1"),
        (None, {"max_bubble_fraction": True}, "constraints.max_bubble_fraction", "between 0 and 1"),
        (None, {"max_step_time_s": 3}, "constraints.max_step_time_s", "allowed: max_memory_GiB_per_device"),
        (None, [0.5], "constraints", "must be an object"),
    ],
)
def test_bad_objective_or_constraint_is_a_value_error_naming_the_field(
    scenario, objective, constraints, field, words
):
    with pytest.raises(ValueError, match=words) as info:
        search(*scenario, fixed=FIXED, objective=objective, constraints=constraints)
    assert isinstance(info.value, SpecError) and field in info.value.errors


def test_energy_needs_the_devices_power():
    cluster = ClusterSpec.from_dict(
        {**a100_cluster(1), "device": {**a100_cluster(1)["device"], "name": "Zeta-Accelerator-9"}}
    )
    with pytest.raises(SpecError, match="energy needs the device's power") as info:
        checked_ranking("energy", None, cluster)
    assert info.value.field == "objective"
    assert checked_ranking("memory_headroom", {"max_bubble_fraction": 0}, cluster) == (
        "memory_headroom",
        {"max_bubble_fraction": 0.0},
    )
