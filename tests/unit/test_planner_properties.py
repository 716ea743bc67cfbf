"""Properties of the planner that must hold for any input (hypothesis)."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.planner_helpers import a100_cluster
from workers.planner import (
    ClusterSpec,
    CostModel,
    Layouts,
    ModelSpec,
    Strategy,
    TrainingConfig,
    evaluate,
    search,
)
from workers.planner.hardware import efficiency_for
from workers.planner.search import pareto_indices

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def dense_model(layers, heads, head_dim, seq):
    h = heads * head_dim
    return ModelSpec.from_dict(
        {
            "name": "m",
            "num_layers": layers,
            "hidden_size": h,
            "num_attention_heads": heads,
            "num_kv_heads": heads,
            "ffn_hidden_size": 4 * h,
            "vocab_size": 32000,
            "seq_length": seq,
            "activation": "gelu",
            "moe": None,
        }
    )


def cluster(nodes, per_node=8, memory=80):
    return ClusterSpec.from_dict(
        a100_cluster(
            nodes,
            per_node,
            memory_GiB=memory,
            tiers=(("leaf", 4), ("spine", 64)),
            oversubscription=2.0,
            name="c",
        )
    )


layout_strategy = st.fixed_dictionaries(
    {
        "tp": st.sampled_from([1, 2, 4]),
        "pp": st.sampled_from([1, 2, 4]),
        "dp": st.sampled_from([1, 2, 4]),
        "mbs": st.sampled_from([1, 2]),
        "rc": st.sampled_from([0, 1, 2]),
        "zero": st.integers(0, 3),
        "sp": st.integers(0, 1),
    }
)


def memory_of(cm, **f):
    L = Layouts(**{k: np.array([v]) for k, v in dict(ep=1, cp=1, vpp=1, **f).items()})
    return float(cm.memory(L)["total"][0])


@SETTINGS
@given(layout_strategy, st.sampled_from(["tp", "pp", "zero"]))
def test_memory_never_increases_with_more_tp_pp_or_zero(f, knob):
    cm = CostModel(
        dense_model(16, 16, 64, 1024),
        cluster(8),
        TrainingConfig(global_batch_size=64),
        efficiency_for("A100")[1],
    )
    before = memory_of(cm, **f)
    more = dict(f)
    if knob == "zero":
        more["zero"] = min(3, f["zero"] + 1)
    else:
        more[knob] = f[knob] * 2  # doubled degree, everything else fixed (vpp = 1: Korthikanti eq. 5 aside)
    assert memory_of(cm, **more) <= before * (1 + 1e-12)


@SETTINGS
@given(
    st.sampled_from([1, 2, 4]),
    st.sampled_from([8, 16]),
    st.sampled_from([8, 16, 32]),
    st.sampled_from([32, 64, 96]),
    st.sampled_from([16, 40, 80]),
)
def test_every_returned_plan_is_feasible_and_multiplies_to_the_device_count(
    nodes, layers, heads, gbs, memory
):
    model, c = dense_model(layers, heads, 128, 2048), cluster(nodes, memory=memory)
    result = search(model, c, TrainingConfig(global_batch_size=gbs), top_k=5, scaling=False)
    for plan in result.top + result.pareto:
        s = plan.strategy
        assert plan.feasible
        assert s.tp * s.pp * s.dp * s.cp == c.num_devices
        assert plan.predicted["memory_GiB_per_device"]["total"] <= memory
        assert gbs % (s.dp * s.micro_batch_size) == 0
    if result.best is None:
        assert "GiB" in result.stats["tightest"] or "divisib" in result.stats["tightest"]
    else:
        steps = [p.step_time_s for p in result.top]
        assert steps == sorted(steps)


@SETTINGS
@given(
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 2]),
    st.sampled_from(["none", "selective", "full"]),
    st.integers(0, 3),
    st.booleans(),
)
def test_fixing_every_field_returns_exactly_that_plan(tp, pp, mbs, recompute, zero, sp):
    model, c = dense_model(8, 8, 128, 2048), cluster(1)
    training = TrainingConfig(global_batch_size=32)
    strategy = Strategy(
        tp=tp,
        pp=pp,
        dp=8 // (tp * pp),
        ep=1,
        cp=1,
        vpp=1,
        micro_batch_size=mbs,
        recompute=recompute,
        zero_stage=zero,
        sequence_parallel=sp,
    )
    result = search(model, c, training, strategy, scaling=False)
    plan = evaluate(model, c, training, strategy, scaling=False)
    if plan.feasible:
        assert result.stats["feasible"] == 1
        assert result.best.strategy == strategy
        assert result.best.predicted == plan.predicted
    else:
        assert result.best is None


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 400), st.integers(0, 10_000))
def test_pareto_front_matches_brute_force(n, seed):
    rng = np.random.default_rng(seed)
    # coarse values so that ties and duplicates occur
    x, h, c = (rng.integers(0, 12, n).astype(float) for _ in range(3))
    got = set(pareto_indices(x, h, c).tolist())
    dominated = set()
    for i in range(n):
        for j in range(n):
            if (
                i != j
                and x[j] >= x[i]
                and h[j] >= h[i]
                and c[j] <= c[i]
                and (x[j] > x[i] or h[j] > h[i] or c[j] < c[i] or j < i)
            ):
                dominated.add(i)
                break
    front = set(range(n)) - dominated
    # exact duplicates keep one representative; compare the objective triples
    assert {(x[i], h[i], c[i]) for i in got} == {(x[i], h[i], c[i]) for i in front}
    assert len(got) == len({(x[i], h[i], c[i]) for i in got})
