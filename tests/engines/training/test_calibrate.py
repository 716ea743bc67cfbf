"""`cann-train calibrate` measures this machine and writes a profile + cluster the planner accepts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workers.planner import ClusterSpec, ModelSpec, TrainingConfig, search
from workers.training.examples import example

pytestmark = pytest.mark.slow

TINY = example("tiny-dense.json")


@pytest.mark.long
def test_calibrate_writes_a_measured_profile_the_planner_uses(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "workers.cli", "calibrate", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    profile = json.loads((tmp_path / "cpu.json").read_text())
    assert profile["confidence"] == "measured"
    assert profile["peak_tflops"]["fp32"] > 0 and profile["memory_bandwidth_GBps"] > 0
    link = profile["measured"]["allreduce"]
    assert link["bus_bandwidth_GBps"] > 0 and link["latency_us"] > 0
    assert all("measured by `cann-train calibrate`" in profile["sources"][k] for k in ("peak_tflops.fp32",))
    # the runtime's own host-side costs, each with how it was measured (hardware.Framework reads them)
    from workers.planner.hardware import Framework

    host = profile["framework"]
    assert (
        host["layer_pass_s"]["value"] > 0 and host["tp_layer_pass_s"]["value"] > host["layer_pass_s"]["value"]
    )
    assert host["step_collective_s"]["value"] > 0 and host["compute_scale"]["value"] > 0
    # each of the runtime's wrappers, built by its own parallelize: FSDP2 ZeRO-3 and expert parallel too
    assert host["fsdp_layer_pass_s"]["value"] > 0 and host["ep_moe_layer_pass_s"]["value"] > 0
    assert host["tp_layer_pass_selective_s"]["value"] > 0 and host["fsdp_reduce_layer_s"]["value"] >= 0
    assert all(
        "measured by `cann-train calibrate`" in v["source"] and "probe" in v["source"] for v in host.values()
    )
    assert Framework.from_profile(profile).measured
    cluster = ClusterSpec.from_dict(json.loads((tmp_path / "cluster-cpu.json").read_text()))
    result = search(
        ModelSpec.from_dict(TINY),
        cluster,
        TrainingConfig.from_dict({"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"}),
    )
    assert result.best is not None and result.best.predicted["step_time_s"] > 0
