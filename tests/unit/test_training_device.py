"""Device selection says why a backend is unavailable and never silently falls back when one is asked for."""

from __future__ import annotations

import pytest

from workers.devices import backend as device_mod
from workers.devices.backend import DeviceUnavailable, select_device


def test_cpu_is_gloo():
    choice = select_device("cpu")
    assert (choice.kind, choice.backend, choice.unavailable) == ("cpu", "gloo", {})
    assert choice.device_for_local_rank(3).type == "cpu"


def test_auto_falls_back_to_cpu_and_explains_every_skipped_backend(monkeypatch):
    monkeypatch.setattr(
        device_mod, "PROBES", {"npu": lambda: (0, "", "no npu here"), "cuda": lambda: (0, "", "no gpu")}
    )
    choice = select_device("auto")
    assert choice.kind == "cpu"
    assert choice.unavailable == {"npu": "no npu here", "cuda": "no gpu"}
    assert "npu unavailable: no npu here" in choice.explain()


def test_env_variable_selects_the_device(monkeypatch):
    monkeypatch.setenv("CANN_TRAIN_DEVICE", "cpu")
    assert select_device().kind == "cpu"
    monkeypatch.setenv("CANN_TRAIN_DEVICE", "tpu")
    with pytest.raises(DeviceUnavailable, match="auto|cpu|cuda|npu"):
        select_device()


def test_explicit_cuda_without_gpu_raises_with_the_reason():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceUnavailable, match="cuda requested but unavailable: .*(CUDA|GPU)"):
        select_device("cuda")


def test_npu_without_torch_npu_says_how_to_install(monkeypatch):
    monkeypatch.setattr(device_mod.importlib.util, "find_spec", lambda name: None)
    count, _, why = device_mod.probe_npu()
    assert count == 0 and "torch_npu is not installed" in why


def test_npu_installed_but_cann_runtime_missing_is_explained(monkeypatch):
    monkeypatch.setattr(device_mod.importlib.util, "find_spec", lambda name: object())

    def broken_import(name):
        raise ImportError("libhccl.so: cannot open shared object file")

    monkeypatch.setattr(device_mod.importlib, "import_module", broken_import)
    count, _, why = device_mod.probe_npu()
    assert count == 0 and "CANN runtime" in why and "libhccl.so" in why
    with pytest.raises(DeviceUnavailable, match="npu requested but unavailable"):
        select_device("npu")


def test_prepare_environment_disables_backend_autoload(monkeypatch):
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    device_mod.prepare_environment()
    import os

    assert os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_is_nccl_when_a_gpu_is_present():
    choice = select_device("cuda")
    assert choice.backend == "nccl" and choice.device_for_local_rank(0).type == "cuda"


def test_a_node_without_the_requested_devices_says_so_before_starting_ranks():
    import torch

    from workers.devices.backend import devices_missing

    assert devices_missing("cpu", 4) == ""
    if not torch.cuda.is_available():
        problem = devices_missing("cuda", 8)
        assert problem.startswith("This node cannot run the job: cuda requested but unavailable")
    else:
        assert "device(s)" in devices_missing("cuda", torch.cuda.device_count() + 1)
