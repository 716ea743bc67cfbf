"""Each parallel dimension on gloo matches a single-process reference run: same data order, same seed,
same loss at step 1 (within 1e-4) and within 1% after 10 steps.

Every run goes through ``cann-train train``'s own path (config file -> torchrun with c10d rendezvous ->
``python -m workers.training.run``), with tiny models (4 layers, hidden 64, seq 32) so the whole module
takes about two minutes on two CPU cores.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import tiered
from tests.engines.training.harness import EXAMPLES, STEPS, job, train
from workers.training.parallel.dims import ParallelDims

pytestmark = pytest.mark.slow

STEP1_ATOL = 1e-4
FINAL_RTOL = 0.01


@pytest.fixture(scope="module")
def reference() -> dict[str, dict]:
    single = {"micro_batch_size": 4}
    return {m: train(job(m, single)) for m in ("tiny-dense.json", "tiny-moe.json")}


def assert_matches(run: dict, ref: dict) -> None:
    print(
        f"\n{run['strategy']}: step-1 |d|={abs(run['loss_first'] - ref['loss_first']):.2e} "
        f"step-{STEPS} rel={abs(run['loss_last'] - ref['loss_last']) / ref['loss_last']:.2e} "
        f"tokens/s={run['tokens_per_s']:.0f} (ref {ref['tokens_per_s']:.0f})"
    )
    assert run["steps"] == ref["steps"] == STEPS
    assert abs(run["loss_first"] - ref["loss_first"]) < STEP1_ATOL, (run["loss_first"], ref["loss_first"])
    assert abs(run["loss_last"] - ref["loss_last"]) < FINAL_RTOL * ref["loss_last"], (
        run["losses"],
        ref["losses"],
    )
    assert ref["loss_last"] < ref["loss_first"] - 0.5  # the reference does learn in 10 steps
    # the global gradient norm (it drives clipping) counts every replicated or sharded piece once
    assert run["grad_norm_last"] == pytest.approx(ref["grad_norm_last"], rel=FINAL_RTOL)


CASES = {
    "dp2-ddp": ("tiny-dense.json", {"dp": 2, "micro_batch_size": 2}),
    "dp2-fsdp2-zero3-full-recompute": (
        "tiny-dense.json",
        {"dp": 2, "micro_batch_size": 2, "zero_stage": 3, "recompute": "full"},
    ),
    "tp2-sequence-parallel-selective-recompute": (
        "tiny-dense.json",
        {"tp": 2, "micro_batch_size": 4, "sequence_parallel": True, "recompute": "selective"},
    ),
    "pp2-1f1b": ("tiny-dense.json", {"pp": 2, "micro_batch_size": 2}),
    "tp2-pp2-interleaved-1f1b": (
        "tiny-dense.json",
        {"tp": 2, "pp": 2, "vpp": 2, "micro_batch_size": 2, "sequence_parallel": True},
    ),
    "ep2-dp2-moe": ("tiny-moe.json", {"dp": 2, "ep": 2, "micro_batch_size": 2}),
    "ep2-dp4-zero1-moe": ("tiny-moe.json", {"dp": 4, "ep": 2, "micro_batch_size": 1, "zero_stage": 1}),
    "cp2-dp2-ddp": ("tiny-dense.json", {"cp": 2, "dp": 2, "micro_batch_size": 2}),
    "cp2-tp2-sequence-parallel-zero3": (
        "tiny-dense.json",
        {"cp": 2, "tp": 2, "micro_batch_size": 4, "sequence_parallel": True, "zero_stage": 3},
    ),
    "cp2-pp2-1f1b": ("tiny-dense.json", {"cp": 2, "pp": 2, "micro_batch_size": 2}),
    "cp2-ep2-moe": ("tiny-moe.json", {"cp": 2, "ep": 2, "micro_batch_size": 4}),
}


@pytest.mark.parametrize(
    "case", tiered(CASES, long={"tp2-pp2-interleaved-1f1b", "cp2-tp2-sequence-parallel-zero3"})
)
def test_parallel_run_matches_single_process(case, reference):
    model, strategy = CASES[case]
    run = train(job(model, strategy))
    assert run["world_size"] in (2, 4)
    assert_matches(run, reference[model])
    if "moe" in model:
        assert run["expert_load"] == pytest.approx(reference[model]["expert_load"], abs=1e-3)
    if case == "ep2-dp4-zero1-moe":
        # ZeRO shards every weight once over the 4 ranks: the dense ones over dp, each expert set over
        # the 2 ranks holding it (experts whole on every rank would be ~40% more)
        assert run["parameters_rank0"] == pytest.approx(run["parameters_total"] / 4, rel=0.03)


# Each strategy trained in the default placement (tp-cp-ep-dp-pp) and in one the planner can recommend
# that moves the groups: dp innermost (its FSDP shards and the dp_cp flattening), pipeline stages inside
# the replicas, EP groups carved from a dp-first block.
ORDER_CASES = {
    "tp2-dp2-dp-innermost": ("tiny-dense.json", {"tp": 2, "dp": 2, "micro_batch_size": 2}, "dp-tp-cp-ep-pp"),
    "cp2-dp2-zero3-dp-before-cp": (
        "tiny-dense.json",
        {"cp": 2, "dp": 2, "micro_batch_size": 2, "zero_stage": 3},
        "tp-dp-cp-ep-pp",
    ),
    "pp2-dp2-stages-inside-replicas": (
        "tiny-dense.json",
        {"pp": 2, "dp": 2, "micro_batch_size": 1},
        "tp-cp-ep-pp-dp",
    ),
    "cp2-dp2-ep2-moe-dp-before-cp": (
        "tiny-moe.json",
        {"cp": 2, "dp": 2, "ep": 2, "micro_batch_size": 2},
        "tp-dp-cp-ep-pp",
    ),
}
ORDER_STEPS = 3
DEGREES = {"tp": 1, "cp": 1, "dp": 1, "pp": 1, "ep": 1}


@pytest.mark.parametrize(
    "case",
    tiered(
        ORDER_CASES,
        long={"tp2-dp2-dp-innermost", "cp2-dp2-zero3-dp-before-cp", "pp2-dp2-stages-inside-replicas"},
    ),
)
def test_a_rank_order_trains_as_the_default_one(case):
    """The placement moves ranks between groups, not the arithmetic: the same losses and gradient norms
    (every group's members sit in coordinate order, so even the reduction order is the same)."""
    model, strategy, order = ORDER_CASES[case]
    default = train(job(model, strategy, steps=ORDER_STEPS))
    placed = train(job(model, {**strategy, "order": order}, steps=ORDER_STEPS))
    assert (default["strategy_config"]["order"], placed["strategy_config"]["order"]) == (
        "tp-cp-ep-dp-pp",
        order,
    )
    assert default["steps"] == placed["steps"] == ORDER_STEPS
    worst = max(abs(a - b) / abs(b) for a, b in zip(placed["losses"], default["losses"], strict=True))
    print(f"\n{case}: {order} vs default, worst relative loss difference {worst:.1e}")
    assert placed["losses"] == pytest.approx(default["losses"], rel=1e-5)
    assert placed["grad_norm_last"] == pytest.approx(default["grad_norm_last"], rel=1e-5)
    assert placed["parameters_rank0"] == default["parameters_rank0"]  # rank 0 holds the same pieces
    # ... in other groups: rank 0's as the layout places them
    world = default["world_size"]
    for run, o in ((default, "tp-cp-ep-dp-pp"), (placed, order)):
        degrees = {**DEGREES, **{k: v for k, v in strategy.items() if k in DEGREES}}
        dims = ParallelDims(world_size=world, order=o, **degrees)
        assert run["groups"] == dims.groups(0)
    assert placed["groups"] != default["groups"]
    if "moe" in model:
        assert placed["expert_load"] == pytest.approx(default["expert_load"], abs=1e-5)


def test_a_different_data_order_is_caught(reference):
    """The tolerance is tight enough to tell a wrong data order apart (so the tests above can fail)."""
    run = train(
        job(
            "tiny-dense.json",
            {"dp": 2, "micro_batch_size": 2},
            seed=0,
            data=None,
            lr=3e-3,
            warmup_steps=2,
            start_step=1,
            steps=STEPS,
        )
    )
    ref = reference["tiny-dense.json"]
    assert abs(run["loss_first"] - ref["loss_first"]) > STEP1_ATOL


def test_cli_json_output_has_the_summary_fields(capsys):
    from workers.cli import main

    code = main(
        [
            "train",
            "--model",
            str(EXAMPLES / "tiny-moe.json"),
            "--strategy",
            str(EXAMPLES / "ep2-dp2.json"),
            "--steps",
            "3",
            "--profile-every",
            "2",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("world_size", "strategy", "steps", "tokens_per_s", "step_time_s", "loss_first", "loss_last"):
        assert key in out
    assert out["world_size"] == 2 and out["steps"] == 3 and out["tokens_per_s"] > 0
    assert out["comm_s"] > 0 and out["compute_s"] > 0  # measured on the profiled step
    assert len(out["expert_load"]) == 4 and sum(out["expert_load"]) == pytest.approx(1.0, abs=1e-3)
