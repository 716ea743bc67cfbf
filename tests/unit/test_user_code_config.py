"""What a user's code runs with: the scrubbed environment every training process gets
(``workers.training.launch.rank_env``) and the run config of a job that names an entrypoint
(``workers.training.entrypoint``), every problem named by its field."""

from __future__ import annotations

import pytest

from workers.training.config import ConfigError
from workers.training.entrypoint import Entrypoint, parse_run_config, rescaled_strategy
from workers.training.launch import rank_env, torchrun_env

WORKER_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "SECRET_KEY": "s3cret",
    "DATABASE_URL": "postgres://cp:pw@db/cp",
    "REDIS_URL": "redis://:pw@redis:6379/0",
    "METRICS_TOKEN": "m",
    "ELECTRICITYMAPS_TOKEN": "e",
    "WATTTIME_PASSWORD": "w",
    "CANN_TRAIN_TOKEN": "ct_x",
    "CANN_TRAIN_K8S_TOKEN": "k",
    "HF_TOKEN": "hf_x",
    "AWS_SECRET_ACCESS_KEY": "a",
    "SENTRY_DSN": "https://x@sentry",
    "DJANGO_SETTINGS_MODULE": "controlplane.settings",
    "CANN_TRAIN_DEVICE": "cpu",
    "CANN_TRAIN_NODE": "node-a",
    "OMP_NUM_THREADS": "1",
    "NCCL_DEBUG": "INFO",
    "HCCL_CONNECT_TIMEOUT": "600",
    "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    "HF_HOME": "/data/hf",
    "PYTHONPATH": "/srv",
    "WANDB_MODE": "offline",
    "WANDB_API_KEY": "wb",
}


def test_training_processes_get_no_control_plane_secret():
    env = rank_env(WORKER_ENV)
    kept = {"PATH", "HOME", "LANG", "LC_ALL", "CANN_TRAIN_DEVICE", "CANN_TRAIN_NODE", "OMP_NUM_THREADS", "NCCL_DEBUG",
            "HCCL_CONNECT_TIMEOUT", "TORCH_DEVICE_BACKEND_AUTOLOAD", "HF_HOME", "PYTHONPATH"}  # fmt: skip
    assert set(env) == kept, set(env) ^ kept
    assert torchrun_env(WORKER_ENV)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "SECRET_KEY" not in torchrun_env(WORKER_ENV)


def test_the_operator_passes_more_by_name_or_prefix():
    env = rank_env({**WORKER_ENV, "CANN_TRAIN_RANK_ENV": "WANDB_*, SENTRY_DSN"})
    assert {"WANDB_MODE", "WANDB_API_KEY", "SENTRY_DSN"} <= set(env) and "SECRET_KEY" not in env


def test_an_entrypoint_and_its_run_config_are_completed():
    entry = Entrypoint.from_dict({"script": "/code/train.py", "args": ["--lr", "1e-3"], "nproc_per_node": 2})
    assert entry.cwd == "/code" and entry.program() == ["/code/train.py", "--lr", "1e-3"]
    module = Entrypoint.from_dict({"module": "pkg.train", "workdir": "/code"})
    assert module.program() == ["-m", "pkg.train"]
    config = parse_run_config(
        {
            "entrypoint": entry.to_dict(),
            "snapshot_every": 5,
            "snapshot_dir": "/s",
            "hyperparameters": {"lr": 1e-3},
        },
        world_size=4,
    )
    assert (
        config["strategy"]["dp"] == 4
        and config["snapshot_every"] == 5
        and config["hyperparameters"] == {"lr": 1e-3}
    )


@pytest.mark.parametrize(
    "doc, field, words",
    [
        ({"entrypoint": {"script": "/c/t.sh"}}, "entrypoint.script", "Python file"),
        ({"entrypoint": {}}, "entrypoint.script", "script"),
        ({"entrypoint": {"module": "a b", "workdir": "/c"}}, "entrypoint.module", "dotted"),
        ({"entrypoint": {"script": "/c/t.py", "args": "--lr 1"}}, "entrypoint.args", "list of strings"),
        ({"entrypoint": {"script": "/c/t.py", "env": {"RANK": "3"}}}, "entrypoint.env", "torchrun"),
        ({"entrypoint": {"script": "/c/t.py", "env": {"1X": "3"}}}, "entrypoint.env", "variable name"),
        ({"entrypoint": {"script": "/c/t.py", "nproc_per_node": 0}}, "entrypoint.nproc_per_node", "1 to 16"),
        ({"entrypoint": {"script": "/c/t.py", "shell": True}}, "entrypoint.shell", "not a field"),
        ({"entrypoint": {"script": "/c/t.py"}, "lr": 0.1}, "lr", "not a field of a job that runs your code"),
        ({"entrypoint": {"script": "/c/t.py"}, "strategy": {"tp": 2}}, "strategy", "runs 1 rank"),
        ({"entrypoint": {"script": "/c/t.py"}, "snapshot_every": 2}, "snapshot_dir", "needs a snapshot_dir"),
        ({"entrypoint": {"script": "/c/t.py"}, "hyperparameters": [1]}, "hyperparameters", "JSON object"),
        ({"entrypoint": {"script": "/c/t.py"}, "inject": "explode@step=1"}, "inject", "explode"),
    ],
)
def test_a_run_config_that_cannot_run_names_the_field(doc, field, words):
    with pytest.raises(ConfigError) as caught:
        parse_run_config(doc, world_size=1)
    assert field in caught.value.errors, caught.value.errors
    assert any(words in m for m in caught.value.errors[field]), caught.value.errors


def test_an_elastic_run_keeps_its_model_layout_and_gives_dp_the_ranks_present():
    plan = {"tp": 2, "pp": 2, "dp": 4, "micro_batch_size": 3}
    assert {k: rescaled_strategy(plan, 8)[k] for k in ("tp", "pp", "dp", "micro_batch_size")} == {
        "tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 3,
    }  # fmt: skip
    assert rescaled_strategy(plan, 24)["dp"] == 6
    with pytest.raises(ConfigError, match="6 rank\\(s\\) do not split into tp\\*pp\\*cp = 4"):
        rescaled_strategy(plan, 6)
