"""A prediction says what its efficiency constants rest on: on the cpu cluster without `cann-train
calibrate` the planner uses a shipped placeholder, and every plan it costs carries a note saying so
(stored with the plan, shown by the plan and job pages)."""

from __future__ import annotations

import json

import pytest

from workers.planner import ClusterSpec, ModelSpec, Strategy, TrainingConfig, evaluate
from workers.planner.hardware import UNCALIBRATED_NOTE, load_profiles, profile_origin
from workers.training.examples import example


def cpu_cluster() -> dict:
    cpu = load_profiles()["profiles"]["cpu"]
    link = {"kind": "gloo-loopback", "bandwidth_GBps": 2, "latency_us": 50}
    return {
        "name": "this machine",
        "num_nodes": 1,
        "devices_per_node": 2,
        "device": {
            "name": "cpu",
            "peak_tflops": cpu["peak_tflops"],
            "memory_GiB": 16,
            "memory_bandwidth_GBps": 10,
        },
        "intra_node": link,
        "inter_node": link,
        "tiers": [],
    }


def predicted_on(cluster: dict) -> dict:
    plan = evaluate(
        ModelSpec.from_dict(example("tiny-dense.json")),
        ClusterSpec.from_dict(cluster),
        TrainingConfig.from_dict({"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"}),
        Strategy.from_dict(example("dp2.json")),
    )
    return plan.to_dict()["predicted"]


@pytest.fixture
def no_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))
    return tmp_path / "calibration"


def test_an_uncalibrated_cpu_prediction_says_so(no_calibration):
    origin = predicted_on(cpu_cluster())["efficiency_profile"]
    assert origin["name"] == "cpu" and origin["confidence"] == "default"
    assert origin["note"] == UNCALIBRATED_NOTE == "uncalibrated: run `cann-train calibrate`"


def test_after_calibrate_the_note_is_gone_and_the_file_is_named(no_calibration):
    no_calibration.mkdir()
    measured = no_calibration / "cpu.json"
    measured.write_text(json.dumps(load_profiles()["profiles"]["cpu"]))
    origin = predicted_on(cpu_cluster())["efficiency_profile"]
    assert origin == {"name": "cpu", "origin": str(measured), "confidence": "measured"}


def test_an_accelerator_prediction_names_its_shipped_profile(no_calibration):
    origin = profile_origin("H100-SXM5-80GB")
    assert (
        origin["name"] == "H100-SXM5-80GB"
        and origin["origin"] == "data/hardware_profiles.json"
        and "note" not in origin
    )
    assert origin["confidence"] == load_profiles()["profiles"][origin["name"]]["confidence"]
