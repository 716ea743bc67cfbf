"""The example that runs here (``workers/planner/data/examples``): the ``this-machine-cpu`` cluster is the
``cpu`` device profile on one node, and a search of ``tiny-gpt`` on it gives a best plan that fits this
machine's CPU-rank cap and that the training runtime accepts as it is. And a search that fails because of
its global batch says so, naming the batch and batches that would work, not the rule that fired most."""

from __future__ import annotations

from workers import planner
from workers.planner.examples import SMALL_EXAMPLE, contract, small_example
from workers.planner.hardware import load_profiles
from workers.training.config import JobConfig


def test_this_machine_cluster_is_the_cpu_profile_on_one_node(monkeypatch, tmp_path):
    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))  # no calibration: the shipped file
    doc = small_example()["cluster"]
    cpu = load_profiles()["profiles"]["cpu"]
    assert doc["name"] == "this-machine-cpu" and doc["num_nodes"] == 1 and 2 <= doc["devices_per_node"] <= 4
    assert doc["device"]["name"] == "cpu"
    for key in ("peak_tflops", "memory_GiB", "memory_bandwidth_GBps", "tdp_watts"):
        assert doc["device"][key] == cpu[key], key
    assert (SMALL_EXAMPLE / "tiny-gpt.json").exists()


def test_search_on_the_small_example_gives_a_plan_the_runtime_runs_here(monkeypatch, tmp_path):
    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))
    docs = small_example()
    model, cluster, training = planner.specs.load_inputs(docs["model"], docs["cluster"], docs["training"])
    result = planner.search(model, cluster, training, top_k=5)
    assert result.best is not None and result.stats["feasible"] > 0
    s = result.best.strategy
    assert s.tp * s.pp * s.dp * s.cp == cluster.num_devices <= 4  # CANN_TRAIN_MAX_CPU_RANKS' default
    assert model.parameter_count()["total"] < 5e6
    JobConfig.from_dict(
        {
            "model": docs["model"],
            "strategy": s.to_dict(),
            "training": docs["training"],
            "steps": 2,
            "device": "cpu",
        }
    )


def test_a_batch_no_data_parallel_degree_divides_is_named_as_the_batch():
    # 3072 devices = 2^10 * 3: the factor 3 fits no tp (64 heads) or cp (seq 4096), and pp is pinned to 1
    # (uneven pipeline stages would take it: pp = 24 over 64 layers), so it must go to dp — and 7 sequences
    # split over no dp that has it
    model = planner.ModelSpec.from_dict(contract("model-moe.json"))
    cluster = planner.ClusterSpec.from_dict(contract("cluster.json"))
    training = planner.TrainingConfig.from_dict({**contract("training.json"), "global_batch_size": 7})
    result = planner.search(model, cluster, training, fixed={"pp": 1})
    assert result.best is None and result.stats["evaluated"] == 0
    tightest = result.stats["tightest"]
    assert tightest.startswith("global_batch_size 7 is not divisible by any data-parallel degree")
    assert "dp ∈ {3, 6, 12" in tightest and "e.g. 6 or 9" in tightest
    # the count the page shows: every rejection, whatever rule fired
    assert sum(result.stats["rejected"].values()) > 0
    # a batch that works is not blamed
    ok = planner.TrainingConfig.from_dict({**contract("training.json"), "global_batch_size": 9})
    assert planner.search(model, cluster, ok, fixed={"pp": 1}, top_k=1, scaling=False).best is not None
