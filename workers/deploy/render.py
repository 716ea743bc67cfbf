"""Render a plan as a job for a cluster scheduler: a Kubeflow Training Operator ``PyTorchJob`` (Kubernetes) or
a Slurm batch script. Nothing here submits anything: the control plane submits them through
:mod:`workers.deploy.slurm` / :mod:`workers.deploy.kubernetes` when ``CANN_TRAIN_LAUNCHER`` says so.

Both run what the local launcher runs (:func:`workers.training.launch.render_torchrun_command`): one
``torchrun`` agent per node with ``tp*pp*dp*cp`` ranks in all, c10d rendezvous at an explicit endpoint, the
environment of :data:`~workers.training.launch.TORCHRUN_ENV`, and ``python -m workers.training.run
--config <job config>``. The layout comes from the plan's strategy over the cluster's ``devices_per_node``:
a world that fits in one node runs on one node (``nproc_per_node`` = world size), a larger one on
``world / devices_per_node`` whole nodes (:meth:`~workers.planner.specs.ClusterSpec.devices_problem` is
the rule, the planner's own).

- Kubernetes: a ``ConfigMap`` holding the job config (``job.json``) and a ``PyTorchJob`` of ``nnodes``
  ``Worker`` replicas, mounted at :data:`CONFIG_DIR`. The rendezvous host is ``<name>-worker-0`` (the
  operator gives each replica a headless service of that name) on the operator's default port 23456,
  declared as the container port ``pytorchjob-port`` of the container ``pytorch`` (the names the operator
  looks for). ``elasticPolicy`` (``rdzvBackend: c10d``, min = max replicas) and ``nprocPerNode`` say the
  same to the operator, which sets the matching ``PET_*`` environment (``PET_RDZV_ENDPOINT``,
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ...); the command passes them explicitly, which torchrun prefers.
- Slurm: ``#SBATCH --nodes=<nnodes> --ntasks-per-node=1`` plus the node's devices, the job config written by
  the batch step into ``$SLURM_SUBMIT_DIR`` (a file system every node sees), then ``srun`` one ``torchrun``
  per node; the rendezvous host is the first node of ``$SLURM_JOB_NODELIST``.

A job of a user's own code (:attr:`Deployment.program`, the control plane's ``entrypoint`` jobs,
``workers.deploy.launchers``) runs the same way with the user's script or module in place of
``workers.training.run``: torchrun starts it in its working directory (Slurm: ``srun --chdir``; Kubernetes: the
container's ``workingDir``), with the entrypoint's variables and ``CANN_TRAIN_RUN_CONFIG`` naming the job
config, which is then the SDK's run config (``cann_train.init`` reads it).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workers.planner.specs import ClusterSpec, SpecError
from workers.training.config import ConfigError, JobConfig, ParallelConfig, strategy_from_plan
from workers.training.entrypoint import RUN_CONFIG_ENV
from workers.training.launch import TORCHRUN_ENV, render_torchrun_command

TARGETS = ("k8s", "slurm")
DEVICES = ("cuda", "npu", "cpu")
CONFIG_DIR = "/etc/cann-train"
CONFIG_FILE = "job.json"
DEFAULT_IMAGE = "cann-train:latest"
"""The image ``docker compose build`` makes (CPU torch); a cuda or npu job needs one built on a CUDA or
CANN base with cann-train installed (``--image``)."""
OPERATOR_PORT = 23456
"""The training operator's default ``pytorchjob-port`` (``PytorchJobDefaultPort``)."""
OPERATOR_CONTAINER, OPERATOR_PORT_NAME = "pytorch", "pytorchjob-port"
SLURM_RDZV_PORT = 29500
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 50
"""Kubernetes names the pods' services ``<name>-worker-<i>``: a DNS label of at most 63 characters."""

RESOURCE_FOR = {"cuda": "nvidia.com/gpu", "npu": "huawei.com/Ascend910", "cpu": "cpu"}
"""The resource a node's devices are requested as: the NVIDIA device plugin's, the Ascend device plugin's
(``huawei.com/Ascend910`` for 910 and 910B alike), plain CPUs (one core per rank)."""

DEVICE_ENV: dict[str, dict[str, str]] = {
    "cuda": {},
    # CANN's default is 120 s (range 120-7200): setting up HCCL links among many nodes can take longer
    "npu": {"HCCL_CONNECT_TIMEOUT": "1200"},
    "cpu": {},
}
"""Set for every job on that device kind, beside ``CANN_TRAIN_DEVICE`` and ``TORCHRUN_ENV``
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0``: the runtime imports ``torch_npu`` itself, ``workers.devices.backend``)."""

OPTIONAL_ENV: dict[str, dict[str, str]] = {
    "cuda": {
        "NCCL_SOCKET_IFNAME": "network interface(s) for NCCL's bootstrap and socket traffic, e.g. eth0 or ^lo,docker",
        "NCCL_IB_HCA": "InfiniBand HCAs NCCL may use, e.g. mlx5_0,mlx5_1 (or ^mlx5_2 to exclude)",
        "NCCL_DEBUG": "INFO to log NCCL's ring/tree setup and transport choice (default WARN)",
    },
    "npu": {
        "HCCL_SOCKET_IFNAME": "network interface(s) for HCCL's host-side initialisation traffic, e.g. eth0",
        "HCCL_IF_IP": "the host IP for HCCL's initialisation traffic (instead of HCCL_SOCKET_IFNAME)",
        "HCCL_EXEC_TIMEOUT": "seconds devices wait for each other in a collective before failing",
    },
    "cpu": {"GLOO_SOCKET_IFNAME": "network interface for gloo, e.g. eth0"},
}
"""Documented, not set: the values are the site's (``--env NAME=VALUE`` sets one). The Slurm script lists
them as commented ``export`` lines."""


class RenderError(ValueError):
    """Input that cannot be rendered; ``field`` names it, ``exit_code`` is the CLI's (2 invalid input, 3 the
    plan does not fit the cluster)."""

    def __init__(self, field: str, message: str, *, exit_code: int = 2):
        # a planner/runtime error's text already starts with its field
        super().__init__(message if message.startswith(f"{field}:") else f"{field}: {message}")
        self.field, self.exit_code = field, exit_code


@dataclass(frozen=True)
class NodeLayout:
    """How the plan's ranks sit on the cluster's nodes."""

    nnodes: int
    nproc_per_node: int
    device: str
    """``cuda|npu|cpu``: ``CANN_TRAIN_DEVICE`` and the resource requested."""
    device_name: str = ""

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclass(frozen=True)
class Deployment:
    """Everything a rendered job needs."""

    name: str
    config: JobConfig | None
    """Our runtime's job config; None for a user's code (:attr:`program`, its config :attr:`run_config`)."""
    layout: NodeLayout
    image: str = DEFAULT_IMAGE
    python: str = "python"
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    """The job's environment: :func:`job_env` (a user's code: with its entrypoint's variables)."""
    program: tuple[str, ...] = ()
    """A user's entrypoint as torchrun takes it (``train.py ARGS`` or ``-m pkg.train ARGS``); empty: our
    runtime on the job config."""
    workdir: str = ""
    """Where a user's code runs (its entrypoint's working directory)."""
    run_config: dict = field(default_factory=dict)
    """A user's code's run config (``workers.training.entrypoint.parse_run_config``): the job config file."""

    @property
    def user_code(self) -> bool:
        return bool(self.program)

    def config_dict(self) -> dict:
        return dict(self.run_config) if self.user_code else self.config.to_dict()

    @property
    def config_json(self) -> str:
        return json.dumps(self.config_dict(), indent=2, sort_keys=True)

    def program_env(self, config_path: str) -> dict[str, str]:
        """What a user's code is told beside the job's environment: where its run config is."""
        return {RUN_CONFIG_ENV: config_path} if self.user_code else {}


def device_of(device_name: str) -> str | None:
    """``cuda``/``npu``/``cpu`` from a cluster.json device name; None when it names none of them."""
    from workers.green.powercap import device_kind

    return {"nvidia": "cuda", "npu": "npu", "cpu": "cpu"}.get(device_kind(device_name))


def node_layout(world_size: int, cluster: ClusterSpec, device: str | None = None) -> NodeLayout:
    """The plan's ``world_size`` ranks on ``cluster`` (a :class:`RenderError` with exit code 3 when they do
    not fit: more ranks than devices, or neither part of one node nor whole nodes)."""
    if problem := cluster.devices_problem(world_size):
        raise RenderError("plan.strategy", f"tp*pp*dp*cp = {world_size} ranks: {problem}", exit_code=3)
    kind = device or device_of(cluster.device.name)
    if kind is None:
        raise RenderError(
            "--device",
            f"cannot tell cuda, npu or cpu from the cluster's device name {cluster.device.name!r}; give --device",
        )
    if kind not in DEVICES:
        raise RenderError("--device", f"must be one of {', '.join(DEVICES)}, got {kind!r}")
    per_node = min(world_size, cluster.devices_per_node)
    return NodeLayout(world_size // per_node, per_node, kind, cluster.device.name)


def job_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every rank of a rendered job gets; ``extra`` (``--env``) last, so it overrides."""
    return {"CANN_TRAIN_DEVICE": device, **TORCHRUN_ENV, **DEVICE_ENV[device], **(extra or {})}


def load_document(path: str | Path, what: str) -> Any:
    """A JSON (or YAML: the API's ``?format=yaml``) document; :class:`RenderError` naming ``what``."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise RenderError(what, f"file not found: {path}") from None
    except OSError as exc:
        raise RenderError(what, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        json_error = f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    if not isinstance(doc, dict):
        raise RenderError(what, f"{json_error}, nor a YAML mapping")
    return doc


def default_name(model: dict) -> str:
    """``cann-train-<model name>`` as a DNS label."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(model.get("name") or "job").lower()).strip("-") or "job"
    return f"cann-train-{slug}"[:MAX_NAME].rstrip("-")


def build_deployment(
    plan: Any,
    *,
    model: Any = None,
    cluster: Any = None,
    training: Any = None,
    steps: int = 100,
    name: str | None = None,
    image: str = DEFAULT_IMAGE,
    python: str = "python",
    device: str | None = None,
    max_restarts: int = 0,
    snapshot_dir: str | None = None,
    snapshot_every: int | None = None,
    env: dict[str, str] | None = None,
) -> Deployment:
    """A plan.json (the contract's, or the API's ``plan-json`` export) and the documents it was planned for.
    A plan that carries ``model``/``cluster``/``training`` objects supplies them; an argument overrides.
    Raises :class:`RenderError` (naming the field) on anything that would not run."""
    if not isinstance(plan, dict):
        raise RenderError("plan", f"must be a plan.json object, got {type(plan).__name__}")
    try:
        strategy = strategy_from_plan(plan)
    except ConfigError as exc:
        raise RenderError(exc.field, str(exc)) from None
    model = model if model is not None else plan.get("model")
    cluster = cluster if cluster is not None else plan.get("cluster")
    training = training if training is not None else plan.get("training")
    if not isinstance(model, dict):
        raise RenderError("--model", "required (the plan has no 'model' object)")
    if not isinstance(cluster, dict):
        raise RenderError("--cluster", "required (the plan has no 'cluster' object)")
    try:
        cluster_spec = ClusterSpec.from_dict(cluster)
    except SpecError as exc:
        exc = exc.prefixed("cluster")
        raise RenderError(exc.field, str(exc)) from None
    config: dict[str, Any] = {
        "model": model,
        "strategy": strategy,
        "training": training or {},
        "steps": steps,
    }
    try:
        # whether the ranks fit the cluster first: the plan's own question, before the runtime's layout rules
        layout = node_layout(ParallelConfig.from_dict(strategy).world_size, cluster_spec, device)
        config["device"] = layout.device
        peak = cluster_spec.device.peak_tflops.get(JobConfig.from_dict(config).training.dtype)
        if peak:  # the runtime reports mfu against it
            config["peak_tflops"] = peak
        if layout.nnodes > 1:  # sizes the DDP gradient buckets, as the control plane's jobs do
            config["inter_node_GBps"] = cluster_spec.inter_node.bandwidth_GBps
            config["inter_node_latency_us"] = cluster_spec.inter_node.latency_us
        if snapshot_dir:
            config.update(snapshot_dir=snapshot_dir, resume=True)
        if snapshot_every is not None:
            config["snapshot_every"] = snapshot_every
        job_config = JobConfig.from_dict(config)
    except ConfigError as exc:
        raise RenderError(exc.field, str(exc)) from None
    name = name or default_name(model)
    if len(name) > MAX_NAME or not NAME_RE.match(name):
        raise RenderError(
            "--name",
            f"must be lowercase letters, digits and '-', start with a letter, at most {MAX_NAME} characters "
            f"(Kubernetes names the pods' services <name>-worker-<i>), got {name!r}",
        )
    if max_restarts < 0:
        raise RenderError("--max-restarts", f"must be >= 0, got {max_restarts}")
    return Deployment(
        name=name,
        config=job_config,
        layout=layout,
        image=image,
        python=python,
        max_restarts=max_restarts,
        env=job_env(layout.device, env),
    )


def torchrun_argv(dep: Deployment, *, rdzv_endpoint: str, run_id: str, config_path: str) -> list[str]:
    """The launcher's own command for every node (no ``--node-rank``: c10d assigns the ranks)."""
    layout = dep.layout
    return render_torchrun_command(
        config_path,
        nnodes=layout.nnodes,
        nproc_per_node=layout.nproc_per_node,
        node_rank=None,
        rdzv_endpoint=rdzv_endpoint,
        run_id=run_id,
        max_restarts=dep.max_restarts,
        python=dep.python,
        program=list(dep.program) or None,
    )


def _labels(dep: Deployment) -> dict[str, str]:
    return {"app.kubernetes.io/name": "cann-train", "app.kubernetes.io/instance": dep.name}


def render_kubernetes(dep: Deployment) -> list[dict]:
    """``[ConfigMap, PyTorchJob]`` (kubeflow.org/v1), in the order ``kubectl apply`` needs them."""
    layout, config_map = dep.layout, f"{dep.name}-config"
    config_path = f"{CONFIG_DIR}/{CONFIG_FILE}"
    command = torchrun_argv(
        dep, rdzv_endpoint=f"{dep.name}-worker-0:{OPERATOR_PORT}", run_id=dep.name, config_path=config_path
    )
    resource = {RESOURCE_FOR[layout.device]: str(layout.nproc_per_node)}
    container = {
        "name": OPERATOR_CONTAINER,
        "image": dep.image,
        "command": command,
        "env": [{"name": k, "value": v} for k, v in {**dep.env, **dep.program_env(config_path)}.items()],
        "ports": [{"name": OPERATOR_PORT_NAME, "containerPort": OPERATOR_PORT, "protocol": "TCP"}],
        # devices are requested as limits (extended resources cannot be overcommitted); CPUs as requests
        "resources": {"requests": resource} if layout.device == "cpu" else {"limits": resource},
        "volumeMounts": [
            {"name": "job-config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    if dep.workdir:  # a user's code runs in its own working directory (in the image)
        container["workingDir"] = dep.workdir
    pod_template = {
        "metadata": {"labels": _labels(dep)},
        "spec": {
            "containers": [container],
            "volumes": [
                {"name": "job-config", "configMap": {"name": config_map}},
                # the container runtime's 64 MiB /dev/shm is too small for NCCL/HCCL and the data loader
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map, "labels": _labels(dep)},
        "data": {CONFIG_FILE: dep.config_json},
    }
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": dep.name, "labels": _labels(dep)},
        "spec": {
            "nprocPerNode": str(layout.nproc_per_node),
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "rdzvId": dep.name,
                "minReplicas": layout.nnodes,
                "maxReplicas": layout.nnodes,
                "maxRestarts": dep.max_restarts,
            },
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": layout.nnodes,
                    "restartPolicy": "OnFailure" if dep.max_restarts else "Never",
                    "template": pod_template,
                }
            },
        },
    }
    return [cm, job]


class _ManifestDumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's job.json) as ``|`` blocks, so the file reads as JSON."""


_ManifestDumper.add_representer(
    str,
    lambda dumper, s: dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def kubernetes_yaml(dep: Deployment) -> str:
    header = f"# {describe(dep)}\n# kubectl apply -f this file (needs the Kubeflow Training Operator)\n"
    docs = render_kubernetes(dep)
    return header + yaml.dump_all(docs, Dumper=_ManifestDumper, sort_keys=False, width=120)


def _sh(arg: str) -> str:
    """One shell word: double quotes where it expands a variable (no other specials appear there)."""
    return f'"{arg}"' if "$" in arg else shlex.quote(arg)


def render_slurm(dep: Deployment) -> str:
    """A batch script: ``sbatch`` it from a directory every node sees (the job config is written there)."""
    layout = dep.layout
    per_node = layout.nproc_per_node
    devices = {
        "cuda": [f"#SBATCH --gpus-per-node={per_node}"],
        # the generic resource name the site's gres.conf gives its Ascend NPUs
        "npu": [f"#SBATCH --gres=npu:{per_node}"],
        "cpu": [f"#SBATCH --cpus-per-task={per_node}"],
    }[layout.device]
    command = torchrun_argv(
        dep, rdzv_endpoint="${HEAD_NODE}:${RDZV_PORT}", run_id="${SLURM_JOB_ID}", config_path="${CONFIG}"
    )
    exports = [f"export {k}={shlex.quote(v)}" for k, v in dep.env.items()]
    optional = [
        f"# export {k}=...  # {doc}" for k, doc in OPTIONAL_ENV[layout.device].items() if k not in dep.env
    ]
    marker = "CANN_TRAIN_JOB_CONFIG"
    lines = [
        "#!/bin/bash",
        f"# {describe(dep)}",
        "# sbatch this script from a directory every node can read: the job config is written there.",
        f"#SBATCH --job-name={dep.name}",
        f"#SBATCH --nodes={layout.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        *devices,
        f"#SBATCH --output={dep.name}-%j.out",
        "set -euo pipefail",
        "",
        *exports,
        *optional,
        "",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"RDZV_PORT=${{RDZV_PORT:-{SLURM_RDZV_PORT}}}",
        f'CONFIG="${{SLURM_SUBMIT_DIR:-$PWD}}/{dep.name}-${{SLURM_JOB_ID}}.json"',
        # the job config holds the job's own Redis credential: made readable by the job's user alone first
        'install -m 600 /dev/null "$CONFIG"',
        f"cat > \"$CONFIG\" <<'{marker}'",
        dep.config_json,
        marker,
        *([f'export {RUN_CONFIG_ENV}="$CONFIG"'] if dep.user_code else []),
        "",
        "# one torchrun agent per node; c10d rendezvous on the first node"
        + ("; your code in its working directory" if dep.workdir else ""),
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 "
        + (f"--chdir={shlex.quote(dep.workdir)} " if dep.workdir else "")
        + "\\",
        "  " + " ".join(_sh(a) for a in command),
        "",
    ]
    return "\n".join(lines)


def describe(dep: Deployment) -> str:
    layout = dep.layout
    where = f"{layout.world_size} ranks on {layout.nnodes} node(s) x {layout.nproc_per_node} {layout.device}"
    if dep.user_code:
        return f"cann-train {dep.name}: your code ({shlex.join(dep.program)[:200]}) = {where}"
    s = dep.config.strategy
    return (
        f"cann-train {dep.name}: {dep.config.model.name}, tp={s.tp} pp={s.pp} dp={s.dp} cp={s.cp} ep={s.ep} = "
        f"{layout.world_size} ranks on {layout.nnodes} node(s) x {layout.nproc_per_node} {layout.device}"
        + (f" ({layout.device_name})" if layout.device_name else "")
    )


def render(dep: Deployment, target: str) -> dict[str, str]:
    """``{file name: text}`` for ``target`` (``k8s``: one multi-document YAML; ``slurm``: the script)."""
    if target == "k8s":
        return {f"{dep.name}.yaml": kubernetes_yaml(dep)}
    if target == "slurm":
        return {f"{dep.name}.sbatch": render_slurm(dep)}
    raise RenderError("--target", f"must be one of {', '.join(TARGETS)}, got {target!r}")
