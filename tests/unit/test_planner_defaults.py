"""Training flags a document leaves out follow its framework (issue 37): a plan with nothing set is costed
as that framework runs today, says which defaults it assumed, and a flag that is given is kept."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.planner_helpers import a100_cluster, full_strategy
from workers.planner import ClusterSpec, ModelSpec, SpecError, TrainingConfig, evaluate
from workers.planner.specs.training import FRAMEWORK_DEFAULTS

GPT = ModelSpec.from_dict(
    {
        "name": "gpt-1.3b",
        "num_layers": 24,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 16,
        "ffn_hidden_size": 8192,
        "vocab_size": 51200,
        "seq_length": 4096,
    }
)
CLUSTER = ClusterSpec.from_dict(a100_cluster(2))


def plan(training: dict):
    t = TrainingConfig.from_dict({"global_batch_size": 64, **training})
    return evaluate(GPT, CLUSTER, t, full_strategy(dp=16, micro_batch_size=1), scaling=False)


def test_a_plan_with_nothing_set_is_costed_as_cann_train_runs():
    t = TrainingConfig(global_batch_size=8)
    assert t.setting("flash_attention") is True  # torch's scaled_dot_product_attention
    assert t.setting("overlap_grad_reduce") is True  # DDP / FSDP2 reduce during the backward
    default = plan({})
    explicit = plan({"flash_attention": True, "overlap_grad_reduce": True})
    assert default.predicted["step_time_s"] == explicit.predicted["step_time_s"]
    assert default.predicted["memory_GiB_per_device"] == explicit.predicted["memory_GiB_per_device"]


def test_the_2021_layout_stores_the_scores_and_waits_for_the_reduction():
    old = plan({"flash_attention": False, "overlap_grad_reduce": False}).predicted
    new = plan({}).predicted
    assert old["memory_GiB_per_device"]["activations"] > new["memory_GiB_per_device"]["activations"]
    assert old["dp_exposed_s"] > new["dp_exposed_s"]
    assert old["step_time_s"] > new["step_time_s"]


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_DEFAULTS))
def test_each_framework_default_is_sourced_and_applied(framework):
    t = TrainingConfig.from_dict({"global_batch_size": 8, "framework": framework})
    for name, (value, source) in FRAMEWORK_DEFAULTS[framework].items():
        assert t.setting(name) is value and len(source) > 40
    assumed = t.assumed_defaults()
    assert assumed["framework"] == framework
    assert assumed["flash_attention"]["value"] is FRAMEWORK_DEFAULTS[framework]["flash_attention"][0]


def test_megatron_core_does_not_overlap_the_reduction_unless_asked():
    t = TrainingConfig.from_dict({"global_batch_size": 8, "framework": "megatron-lm"})
    assert t.setting("flash_attention") is True and t.setting("overlap_grad_reduce") is False


def test_the_plan_says_which_defaults_it_assumed():
    assumed = plan({"overlap_grad_reduce": False}).predicted["assumed_defaults"]
    assert set(assumed) == {"framework", "flash_attention"}
    assert assumed["flash_attention"]["value"] is True
    assert "scaled_dot_product_attention" in assumed["flash_attention"]["source"]
    assert "assumed_defaults" not in plan({"flash_attention": False, "overlap_grad_reduce": True}).predicted


def test_a_given_flag_is_kept_and_a_left_one_stays_left_to_the_framework():
    given = TrainingConfig.from_dict({"global_batch_size": 8, "flash_attention": False})
    assert given.to_dict() == {
        "global_batch_size": 8,
        "dtype": "bf16",
        "optimizer": "adam",
        "flash_attention": False,
    }
    assert TrainingConfig.from_dict(given.to_dict()) == given
    # a flag left out follows a later change of framework
    moved = dataclasses.replace(given, framework="deepspeed")
    assert moved.setting("overlap_grad_reduce") is False and moved.setting("flash_attention") is False
    assert TrainingConfig.from_dict({"global_batch_size": 8, "flash_attention": None}).flash_attention is None


def test_a_flag_that_is_not_a_boolean_is_refused_naming_it():
    with pytest.raises(SpecError) as err:
        TrainingConfig.from_dict({"global_batch_size": 8, "overlap_grad_reduce": "yes"})
    assert err.value.field == "overlap_grad_reduce"
