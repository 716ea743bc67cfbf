"""Search behaviour: contract shapes, fixed fields, progress/cancel, rejection reporting, specs."""

import json
from pathlib import Path

import pytest

from tests.unit.planner_helpers import full_strategy
from workers.planner import (
    ClusterSpec,
    ModelSpec,
    NothingFits,
    SpecError,
    Strategy,
    TrainingConfig,
    evaluate,
    search,
)
from workers.planner.examples import CONTRACTS  # noqa: E402 - vendored copies of shared/contracts

PLAN_KEYS = set(json.loads((CONTRACTS / "plan.json").read_text())["predicted"])


def load(name):
    return json.loads((CONTRACTS / name).read_text())


@pytest.fixture(scope="module")
def gpt3():
    return (
        ModelSpec.from_dict(load("model.json")),
        ClusterSpec.from_dict(load("cluster.json")),
        TrainingConfig.from_dict(load("training.json")),
    )


def test_plan_has_every_contract_field(gpt3):
    result = search(*gpt3, fixed={"tp": 8, "pp": 8}, top_k=3)
    plan = result.best.to_dict()
    assert set(plan) == {"strategy", "feasible", "reason", "predicted"}
    assert PLAN_KEYS <= set(plan["predicted"])
    assert set(plan["predicted"]["comm_s"]) == {"tp", "pp", "dp", "ep", "cp"}
    assert set(plan["predicted"]["memory_GiB_per_device"]) == {
        "params",
        "grads",
        "optimizer",
        "activations",
        "total",
    }
    assert set(plan["strategy"]) == set(load("strategy.json"))
    assert result.best.strategy.tp == 8 and result.best.strategy.pp == 8
    out = result.to_dict()
    assert set(out) == {"best", "top", "pareto", "search"}
    assert {"evaluated", "feasible", "rejected", "seconds"} <= set(out["search"])


def test_partial_strategy_only_varies_the_open_fields(gpt3):
    result = search(*gpt3, fixed={"tp": 4, "recompute": "full", "zero_stage": 1}, top_k=20, scaling=False)
    assert {(p.strategy.tp, p.strategy.recompute, p.strategy.zero_stage) for p in result.top} == {
        (4, "full", 1)
    }
    assert len({p.strategy.pp for p in result.top}) > 1


def test_progress_is_reported_a_handful_of_times_and_search_can_be_cancelled(gpt3):
    calls = []
    search(*gpt3, progress=lambda e, f, best, frac: calls.append((e, f, best, frac)), scaling=False)
    assert 1 <= len(calls) <= 20
    assert calls[-1][2] is not None and calls[-1][0] >= calls[0][0]
    fractions = [c[3] for c in calls]
    assert fractions == sorted(fractions) and 0 < fractions[0] and fractions[-1] == 1.0
    cancelled = search(*gpt3, should_stop=lambda: True, scaling=False)
    assert cancelled.stats["cancelled"] and cancelled.best is None


def test_candidates_are_compact_and_capped(gpt3):
    result = search(*gpt3, scaling=False)
    cands = result.candidates
    assert 0 < len(cands) <= 3000
    assert set(cands[0]) == {"strategy", "tokens_per_s", "memory_GiB", "comm_share"}


def test_nothing_fits_names_the_tightest_memory_constraint():
    model = ModelSpec.from_dict(load("model.json"))
    small = ClusterSpec.from_dict(load("cluster.json")).with_nodes(1)
    training = TrainingConfig.from_dict(load("training.json"))
    result = search(model, small, training)
    assert result.best is None
    assert result.stats["tightest"].startswith("needs ≥ ")
    assert "the device has 80 GiB" in result.stats["tightest"]
    assert result.stats["rejected"]["exceeds device memory"] > 0
    with pytest.raises(NothingFits) as exc:
        search(model, small, training, raise_if_empty=True)
    assert "GiB" in exc.value.message and exc.value.rejected


def test_evaluate_rejects_an_invalid_layout_naming_the_field(gpt3):
    with pytest.raises(SpecError) as exc:
        evaluate(
            *gpt3,
            # 5*8*80 = 3200 devices: more than the cluster's 3072 (fewer would be a plan leaving some idle)
            full_strategy(tp=5, pp=8, dp=80, recompute="full", zero_stage=1, sequence_parallel=True),
        )
    assert "strategy.tp" in exc.value.errors and "strategy.dp" in exc.value.errors
    assert "the cluster has 3072" in exc.value.errors["strategy.dp"][0]


def test_moe_seed_scenario_uses_expert_parallelism():
    model = ModelSpec.from_dict(load("model-moe.json"))
    cluster = ClusterSpec.from_dict(load("cluster-atlas900.json"))
    result = search(model, cluster, TrainingConfig.from_dict(load("training.json")), top_k=3, scaling=False)
    assert result.best is not None and result.best.strategy.ep > 1
    assert result.best.predicted["comm_s"]["ep"] > 0
    assert result.stats["evaluated"] > 1_000_000


def test_spec_errors_name_field_and_rule():
    bad = dict(load("model.json"), num_layers=0, activation="tanh", num_kv_heads=7)
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_dict(bad)
    errs = exc.value.errors
    assert errs["num_layers"] == ["must be >= 1, got 0"]
    assert "activation" in errs and "gelu" in errs["activation"][0]
    assert "num_kv_heads" in errs
    assert isinstance(exc.value, ValueError) and exc.value.field == "num_layers"
    with pytest.raises(SpecError) as exc:
        ClusterSpec.from_dict(dict(load("cluster.json"), device={"name": "x", "peak_tflops": {"bf16": -1}}))
    assert "device.peak_tflops.bf16" in exc.value.errors and "device.memory_GiB" in exc.value.errors
    with pytest.raises(SpecError) as exc:
        Strategy.from_dict({"tp": 2, "zero_stage": 5, "recompute": "some", "bogus": 1})
    assert set(exc.value.errors) == {"zero_stage", "recompute", "bogus"}


def test_specs_round_trip_the_contracts():
    for name, cls in (
        ("model.json", ModelSpec),
        ("model-moe.json", ModelSpec),
        ("cluster.json", ClusterSpec),
        ("cluster-atlas900.json", ClusterSpec),
        ("training.json", TrainingConfig),
        ("strategy.json", Strategy),
    ):
        d = load(name)
        assert cls.from_dict(d).to_dict() == d, name


def test_planner_hot_path_imports_neither_torch_nor_django():
    import subprocess
    import sys

    code = (
        "import sys, json; from workers.planner import search, ModelSpec, ClusterSpec, TrainingConfig; "
        f"d = '{CONTRACTS}'; "
        "m = ModelSpec.from_dict(json.load(open(d + '/model.json'))); "
        "c = ClusterSpec.from_dict(json.load(open(d + '/cluster.json'))); "
        "t = TrainingConfig.from_dict(json.load(open(d + '/training.json'))); "
        "search(m, c, t, fixed={'tp': 8}, top_k=1, scaling=False); "
        "print(sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'django')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]"
