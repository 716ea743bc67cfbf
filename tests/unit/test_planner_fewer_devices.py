"""A plan may use fewer devices than its cluster has: part of one node or whole nodes, costed on the devices
it takes, saying how many of the cluster's it uses and that the rest stay idle. A count the cluster cannot
give (more devices than it has, or a few nodes and a bit) is still refused, saying why. A scaling
efficiency that was never computed is null with its reason, never 1.0."""

from __future__ import annotations

import dataclasses

import pytest

from workers.planner import ClusterSpec, ModelSpec, SpecError, Strategy, TrainingConfig, evaluate, search
from workers.planner.cli import format_result
from workers.planner.examples import this_machine_cluster
from workers.planner.visual import plan_visuals
from workers.training.examples import example

TRAINING = TrainingConfig.from_dict({"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"})


@pytest.fixture(scope="module")
def tiny():
    return ModelSpec.from_dict(example("tiny-dense.json"))


@pytest.fixture(scope="module")
def cpu():
    """This machine's cpu cluster as the seed stores it (``local_cpu_cluster``): one node, two ranks."""
    cluster = ClusterSpec.from_dict(this_machine_cluster()[0])
    assert (cluster.num_nodes, cluster.devices_per_node) == (1, 2)
    return cluster


def single() -> Strategy:
    return Strategy.from_dict(example("single.json"), partial=False)


def test_a_one_rank_strategy_on_the_two_device_cluster_is_costed_on_one_device(tiny, cpu):
    plan = evaluate(tiny, cpu, TRAINING, single())
    p = plan.predicted
    assert plan.feasible and p["devices_used"] == 1 and p["devices_idle"] == 1
    assert p["idle_note"].startswith("uses 1 of the cluster's 2 devices (part of one node)")
    assert "the other 1 stays idle" in p["idle_note"]
    alone = evaluate(tiny, cpu.with_devices(1), TRAINING, single())
    assert alone.predicted["tokens_per_s"] == p["tokens_per_s"]  # the prediction is the one device's
    assert alone.predicted["energy"] == p["energy"]  # the idle device is not in the predicted energy
    assert "devices_used" not in alone.predicted  # a plan that takes every device says nothing more
    dp2 = evaluate(tiny, cpu, TRAINING, Strategy.from_dict(example("dp2.json"), partial=False))
    assert "devices_used" not in dp2.predicted and "idle_note" not in dp2.predicted


def test_a_search_pinning_fewer_devices_searches_the_part_it_takes(tiny, cpu):
    result = search(tiny, cpu, TRAINING, {"tp": 1, "pp": 1, "dp": 1, "cp": 1}, top_k=3)
    assert result.best is not None and result.stats["devices_used"] == 1
    assert result.stats["nodes_used"] == 1 and "uses 1 of the cluster's 2 devices" in result.stats["note"]
    assert all(p.predicted["devices_used"] == 1 for p in result.top + result.pareto)
    assert "note: uses 1 of the cluster's 2 devices" in format_result(result, tiny, cpu, TRAINING)
    full = search(tiny, cpu, TRAINING, top_k=3)  # the free search keeps to layouts over every device
    s = full.best.strategy
    assert "devices_used" not in full.stats and s.tp * s.pp * s.dp * s.cp == 2


def test_whole_nodes_of_a_larger_cluster_are_a_plan_too(tiny, cpu):
    four_nodes = cpu.with_nodes(4)
    s = dataclasses.replace(single(), dp=4, micro_batch_size=2)  # 4 ranks = 2 of the 4 two-rank nodes
    p = evaluate(tiny, four_nodes, TRAINING, s).predicted
    assert p["devices_used"] == 4 and p["devices_idle"] == 4
    assert "(2 of its 4 nodes); the other 4 stay idle" in p["idle_note"]


@pytest.mark.parametrize(
    ("nodes", "dp", "message"),
    [
        (1, 4, "tp*pp*dp*cp = 4: needs 4 devices; the cluster has 2 (1 x 2)"),
        (4, 3, "3 devices are neither part of one node (at most 2) nor whole nodes (a multiple of 2)"),
    ],
)
def test_a_device_count_the_cluster_cannot_give_is_refused_saying_why(tiny, cpu, nodes, dp, message):
    s = dataclasses.replace(single(), dp=dp, micro_batch_size=1)
    training = TrainingConfig(global_batch_size=12, dtype="fp32")
    with pytest.raises(SpecError) as err:
        evaluate(tiny, cpu.with_nodes(nodes), training, s)
    assert message in err.value.errors["strategy.dp"][0]
    with pytest.raises(SpecError, match="devices"):
        cpu.with_devices(3)


def test_the_visualizer_places_the_ranks_on_the_devices_the_plan_takes(tiny, cpu):
    plan = evaluate(tiny, cpu, TRAINING, single()).to_dict()
    placement = plan_visuals(tiny, cpu, TRAINING, plan)["placement"]
    assert placement["devices_per_node"] == 1 and len(placement["devices"]["rank"]) == 1


def test_a_scaling_efficiency_never_computed_is_null_with_its_reason(tiny, cpu):
    skipped = evaluate(tiny, cpu, TRAINING, single(), scaling=False).predicted
    assert skipped["scaling_efficiency"] is None
    assert skipped["scaling_efficiency_note"].startswith("not computed: the baseline")
    computed = evaluate(tiny, cpu, TRAINING, single()).predicted
    assert 0 < computed["scaling_efficiency"] <= 1.0 and "scaling_efficiency_note" not in computed
    result = search(tiny, cpu, TRAINING, top_k=1, scaling=False)
    assert result.best.predicted["scaling_efficiency"] is None
    text = format_result(result, tiny, cpu, TRAINING)
    assert "scaling efficiency not computed: the baseline" in text and "scaling efficiency 1.0" not in text
