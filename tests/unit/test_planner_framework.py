"""The runtime's host-side costs in the cost model (``hardware.Framework``, measured by `cann-train
calibrate`): charged exactly as documented where measured, nothing where not (every shipped accelerator)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workers.planner import ClusterSpec, CostModel, Layouts, ModelSpec, TrainingConfig
from workers.planner.costmodel import all_reduce_time
from workers.planner.hardware import Framework, efficiency_for, framework_for, load_profiles
from workers.planner.search import evaluate
from workers.planner.specs import Strategy
from workers.training.examples import example

TINY = ModelSpec.from_dict(example("tiny-dense.json"))
TRAINING = TrainingConfig.from_dict({"global_batch_size": 8, "dtype": "fp32", "optimizer": "adamw"})
CPU = {
    "name": "two cpu ranks",
    "num_nodes": 1,
    "devices_per_node": 2,
    "device": {"name": "cpu", "peak_tflops": {"fp32": 0.15}, "memory_GiB": 8, "memory_bandwidth_GBps": 12},
    "intra_node": {"kind": "loopback", "bandwidth_GBps": 1.0, "latency_us": 150},
    "inter_node": {"kind": "tcp", "bandwidth_GBps": 1.0, "latency_us": 150},
    "tiers": [],
}
FW = Framework(
    layer_pass_s=1e-3,
    edge_pass_s=0.5e-3,
    tp_layer_pass_s=20e-3,
    tp_edge_pass_s=4e-3,
    step_layer_s=0.25e-3,
    tp_step_layer_s=7e-3,
    step_fixed_s=0.3e-3,
    step_collective_s=0.2e-3,
)


def strategy(**fields) -> Strategy:
    base = {"tp": 1, "pp": 1, "dp": 2, "ep": 1, "cp": 1, "vpp": 1, "micro_batch_size": 2}
    rest = {"recompute": "none", "zero_stage": 0, "sequence_parallel": False}
    return Strategy.from_dict({**base, **rest, **fields}, partial=False)


def timing(framework: Framework, s: Strategy) -> dict:
    cm = CostModel(TINY, ClusterSpec.from_dict(CPU), TRAINING, efficiency_for("cpu")[1], framework=framework)
    return {k: float(np.asarray(v).ravel()[0]) for k, v in cm.timing(Layouts.from_strategies([s])).items()}


def test_no_shipped_accelerator_profile_charges_host_costs():
    for name in load_profiles()["profiles"]:
        if name != "cpu":
            assert not framework_for(name).measured, name
    assert not Framework().measured and Framework(compute_scale=3.0).measured is False


def test_dp_host_costs_are_added_as_documented():
    s = strategy()  # dp 2, 2 micro-batches of 2 sequences on each rank, 4 layers on the one stage
    bare, charged = timing(Framework(), s), timing(FW, s)
    micro, layers = 2, 4
    passes = micro * (layers * FW.layer_pass_s + FW.edge_pass_s)
    step = layers * FW.step_layer_s + FW.step_fixed_s + FW.step_collective_s  # 2 ranks: the small all-reduce
    assert charged["framework"] == pytest.approx(passes + step)
    assert charged["optimizer"] - bare["optimizer"] == pytest.approx(step)
    # the passes are on the critical path (no overlap credited); dp's exposed reduction may shrink as the
    # compute it hides behind grows, so the step grows by at most the host costs
    assert charged["compute"] - bare["compute"] == pytest.approx(passes)
    assert bare["step"] < charged["step"] <= bare["step"] + passes + step + 1e-12


def test_one_rank_pays_no_step_collective_and_a_recompute_a_fourth_pass():
    single = strategy(dp=1, micro_batch_size=4)
    assert timing(FW, single)["framework"] == pytest.approx(
        2 * (4 * FW.layer_pass_s + FW.edge_pass_s) + 4 * FW.step_layer_s + FW.step_fixed_s
    )
    for recompute in ("full", "selective"):  # the runtime's selective policy re-runs every op but matmuls
        again = timing(FW, strategy(recompute=recompute))["framework"] - timing(FW, strategy())["framework"]
        assert again == pytest.approx(2 * 4 * FW.layer_pass_s / 3), recompute


def test_tp_uses_its_own_figures_and_keeps_only_the_bandwidth_of_its_collectives():
    s = strategy(tp=2, dp=1, micro_batch_size=4, sequence_parallel=True)
    bare, charged = timing(Framework(), s), timing(FW, s)
    micro, layers = 2, 4
    assert charged["framework"] == pytest.approx(
        micro * (layers * FW.tp_layer_pass_s + FW.tp_edge_pass_s)
        + layers * FW.tp_step_layer_s
        + FW.step_fixed_s
        + FW.step_collective_s
    )
    cm = CostModel(TINY, ClusterSpec.from_dict(CPU), TRAINING, efficiency_for("cpu")[1], framework=FW)
    L = Layouts.from_strategies([s])
    start_up = 4 * float(np.asarray(all_reduce_time(cm.links(L)["tp"], 0.0)).ravel()[0])
    assert start_up > 0
    assert bare["tp"] - charged["tp"] == pytest.approx(micro * layers * start_up)


def test_compute_scale_multiplies_the_modelled_compute_only():
    s = strategy()
    bare = timing(Framework(), s)
    scaled = timing(Framework(layer_pass_s=1e-3, compute_scale=2.0), s)
    host = 2 * 4 * 1e-3
    assert scaled["compute"] - host == pytest.approx(2.0 * bare["compute"])


def test_from_profile_takes_measured_values_and_ignores_bad_ones():
    fw = Framework.from_profile(
        {
            "framework": {
                "layer_pass_s": {"value": 0.002, "source": "measured"},
                "edge_pass_s": {"value": -1.0},
                "step_layer_s": {"value": "fast"},
                "compute_scale": {"value": 0.0},
                "step_fixed_s": {"value": 4e-4},
            }
        }
    )
    assert fw == Framework(layer_pass_s=0.002, step_fixed_s=4e-4)
    assert Framework.from_profile({}) == Framework()


def test_a_plan_reports_its_host_costs_only_where_calibrate_measured_them(tmp_path, monkeypatch):
    cpu = json.loads(json.dumps(load_profiles()["profiles"]["cpu"]))
    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))
    cluster = ClusterSpec.from_dict(CPU)
    plain = evaluate(TINY, cluster, TRAINING, strategy(), scaling=False)
    assert "framework_s" not in plain.predicted  # the shipped cpu default measured nothing
    (tmp_path / "calibration").mkdir()
    cpu["framework"] = {"layer_pass_s": {"value": 0.001, "source": "test"}}
    (tmp_path / "calibration" / "cpu.json").write_text(json.dumps(cpu))
    measured = evaluate(TINY, cluster, TRAINING, strategy(), scaling=False)
    assert measured.predicted["framework_s"] == pytest.approx(2 * 4 * 0.001, rel=1e-3)
    assert measured.predicted["step_time_s"] > plain.predicted["step_time_s"]


def test_ddp_layouts_pay_the_measured_ddp_pass_and_others_the_plain_one():
    fw = Framework(layer_pass_s=1e-3, dp_layer_pass_s=1.5e-3)
    assert timing(fw, strategy())["framework"] == pytest.approx(2 * 4 * 1.5e-3)  # dp 2, zero 0: DDP
    assert timing(fw, strategy(dp=1, micro_batch_size=4))["framework"] == pytest.approx(2 * 4 * 1e-3)
    assert timing(fw, strategy(zero_stage=1))["framework"] == pytest.approx(2 * 4 * 1e-3)  # FSDP2 path


def test_a_recompute_pays_the_figure_measured_for_its_wrapper_and_mode():
    fw = Framework(
        layer_pass_s=1e-3,
        layer_pass_selective_s=6e-3,
        layer_pass_full_s=3e-3,
        dp_layer_pass_s=1.5e-3,
        dp_layer_pass_full_s=4e-3,
    )
    micro, layers = 2, 4
    single = strategy(dp=1, micro_batch_size=4)
    assert timing(fw, strategy(dp=1, micro_batch_size=4, recompute="selective"))["framework"] - timing(
        fw, single
    )["framework"] == pytest.approx(micro * layers * (6e-3 - 1e-3))
    ddp_full = timing(fw, strategy(recompute="full"))["framework"] - timing(fw, strategy())["framework"]
    assert ddp_full == pytest.approx(micro * layers * (4e-3 - 1.5e-3))
    # DDP's selective figure not measured: the plain one; no selective figure at all: the pass and a fourth
    ddp_sel = timing(fw, strategy(recompute="selective"))["framework"] - timing(fw, strategy())["framework"]
    assert ddp_sel == pytest.approx(micro * layers * (6e-3 - 1.5e-3))
    fw = Framework(layer_pass_s=1e-3, dp_layer_pass_s=1.5e-3)
    ddp_sel = timing(fw, strategy(recompute="selective"))["framework"] - timing(fw, strategy())["framework"]
    assert ddp_sel == pytest.approx(micro * layers * 1.5e-3 / 3)


def test_fsdp_zero3_pays_its_passes_and_one_reduce_per_step_and_not_the_gathers_start_up_again():
    fw = Framework(
        layer_pass_s=1e-3,
        edge_pass_s=0.5e-3,
        fsdp_layer_pass_s=5e-3,
        fsdp_edge_pass_s=2e-3,
        fsdp_reduce_layer_s=1e-3,
        fsdp_reduce_fixed_s=0.5e-3,
        fsdp_step_layer_s=1.2e-3,
        fsdp_step_fixed_s=0.9e-3,
        step_collective_s=0.2e-3,
    )
    s = strategy(zero_stage=3)  # dp 2, 2 micro-batches, 4 layers
    micro, layers = 2, 4
    step = layers * (1.2e-3 + 1e-3) + 0.9e-3 + 0.5e-3 + 0.2e-3
    assert timing(fw, s)["framework"] == pytest.approx(micro * (layers * 5e-3 + 2e-3) + step)
    # the measured passes hold FSDP2's gathers: the dp term keeps only their bandwidth, less than unmeasured
    assert timing(fw, s)["dp"] < timing(Framework(layer_pass_s=1e-3), s)["dp"]
    assert timing(fw, strategy())["framework"] == pytest.approx(
        micro * layers * 1e-3 + micro * 0.5e-3 + 0.2e-3
    )


def test_expert_parallel_moe_layers_pay_their_measured_pass_and_not_the_all_to_alls_start_up_again():
    moe = ModelSpec.from_dict(example("tiny-moe.json"))  # 4 layers, the first dense, 3 MoE
    s = strategy(ep=2)

    def moe_timing(fw: Framework) -> dict:
        cm = CostModel(moe, ClusterSpec.from_dict(CPU), TRAINING, efficiency_for("cpu")[1], framework=fw)
        return {
            k: float(np.asarray(v).ravel()[0]) for k, v in cm.timing(Layouts.from_strategies([s])).items()
        }

    dense_only = moe_timing(Framework(dp_layer_pass_s=2e-3))
    with_ep = moe_timing(Framework(dp_layer_pass_s=2e-3, ep_moe_layer_pass_s=6e-3))
    micro = 2
    assert with_ep["framework"] - dense_only["framework"] == pytest.approx(micro * 3 * (6e-3 - 2e-3))
    assert with_ep["ep"] < dense_only["ep"]  # the start-up is in the measured pass


def test_one_process_has_the_machine_to_itself_two_share_it():
    fw = Framework(layer_pass_s=1e-3, edge_pass_s=0.5e-3, step_collective_s=0.2e-3, compute_scale=3.0)
    shared = Framework(**{**fw.__dict__, "two_process_contention": 1.25})
    single = strategy(dp=1, micro_batch_size=4)
    assert timing(shared, single)["framework"] == pytest.approx(timing(fw, single)["framework"] / 1.25)
    bare = timing(Framework(layer_pass_s=1e-3, compute_scale=1.0), single)
    assert timing(shared, single)["compute"] - timing(shared, single)["framework"] == pytest.approx(
        (bare["compute"] - bare["framework"]) * 3.0 / 1.25
    )
    assert timing(shared, strategy())["framework"] == pytest.approx(timing(fw, strategy())["framework"])


def test_ddp_pays_its_measured_reduction_once_per_step_and_not_the_all_reduce_start_up_again():
    fw = Framework(layer_pass_s=1e-3, dp_layer_pass_s=1.5e-3, dp_edge_pass_s=1e-3, dp_reduce_fixed_s=0.8e-3)
    micro, layers = 2, 4
    assert timing(fw, strategy())["framework"] == pytest.approx(micro * (layers * 1.5e-3 + 1e-3) + 0.8e-3)
    assert timing(fw, strategy())["dp"] < timing(Framework(layer_pass_s=1e-3), strategy())["dp"]
