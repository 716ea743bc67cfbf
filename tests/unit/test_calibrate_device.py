"""``cann-train calibrate --device``: an accelerator's achievable matmul fraction measured on the device
replaces the cited figure of its profile (and the plan says so); a device that is not here is refused
with the reason. The measurement itself runs for real on the cpu (the mechanics); cuda/npu where present."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workers.devices.backend import probe_cuda
from workers.planner.hardware import (
    achievable_compute,
    device_calibration_path,
    efficiency_for,
    model_constants,
)
from workers.training.calibrate import calibrate_device, measure_matmul


@pytest.fixture
def var_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))
    return tmp_path


def test_measured_matmul_fraction_replaces_the_cited_one(var_dir):
    cited = efficiency_for("Ascend-910B")[1].gemm_max
    path = device_calibration_path("Ascend-910B")
    path.parent.mkdir(parents=True)
    source = "measured by `cann-train calibrate --device npu` on Ascend910B3 (test document)"
    path.write_text(
        json.dumps({"achievable_matmul": {"value": 0.61, "confidence": "measured", "source": source}})
    )
    eff = efficiency_for("Ascend-910B")[1]
    assert eff.gemm_max == pytest.approx(model_constants()["gemm_of_mamf"] * 0.61)
    assert eff.gemm_max != pytest.approx(cited)
    shown = achievable_compute("Ascend-910B")
    assert shown["confidence"] == "measured" and shown["source"] == source
    # a damaged or implausible file is ignored, never moves the plans
    for bad in ("{not json", json.dumps({"achievable_matmul": {"value": 7.0}}), json.dumps([])):
        path.write_text(bad)
        os.utime(path, ns=(1, len(bad)))  # a new version of the file for the read cache
        assert efficiency_for("Ascend-910B")[1].gemm_max == pytest.approx(cited)


def test_calibrate_device_measures_for_real(var_dir):
    found = measure_matmul("cpu", [(128, 128, 128), (256, 128, 256)], warmup=1, iterations=3)
    assert found["kind"] == "cpu" and len(found["points"]) == 2
    assert found["best"]["tflops"] == max(p["tflops"] for p in found["points"]) > 0
    doc, path = calibrate_device("cpu", shapes=[(128, 128, 128)], quick=True)
    written = json.loads(open(path).read())
    assert written["achievable_matmul"]["value"] == doc["achievable_matmul"]["value"] > 0
    assert "calibrate --device cpu" in written["achievable_matmul"]["source"]


@pytest.mark.skipif(probe_cuda()[0] > 0, reason="a GPU is present: the refusal path does not apply")
def test_absent_device_is_refused_with_the_reason(var_dir):
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from workers.cli import main; raise SystemExit(main())",
            "calibrate",
            "--device",
            "cuda",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        timeout=120,
    )
    assert out.returncode != 0
    assert "cuda requested but unavailable" in out.stderr
    assert not list(var_dir.rglob("device-*.json"))
