"""Render the ``torchrun`` command that starts the runtime on one node.

The Celery task (multi-node) and ``cann-train train`` (one node) both use :func:`render_torchrun_command`.
Rendezvous is always c10d at an explicit endpoint: restarts (``--max-restarts``) re-formed the group
reliably on these machines only that way, with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in the
environment (``--standalone`` restarts failed to re-form the group); :data:`TORCHRUN_ENV` carries it.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping

LAST_CALL_TIMEOUT_S = 5
"""With ``--nnodes MIN:MAX``: once MIN nodes have joined a rendezvous, how long it waits for more (torch's
default is 30 s, all of it added to the recovery time of a job that lost a node)."""
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


def render_torchrun_command(
    config_path: str,
    nnodes: int,
    nproc_per_node: int,
    node_rank: int | None,
    rdzv_endpoint: str,
    run_id: str,
    max_restarts: int = 0,
    *,
    min_nodes: int | None = None,
    warm: bool = False,
    hosts_store: bool | None = None,
    summary_path: str | None = None,
    python: str | None = None,
    program: list[str] | None = None,
) -> list[str]:
    """argv for one node. Run it with ``env=torchrun_env()``. ``program``: what every rank runs, as torchrun
    takes it (``["train.py", "--lr", "3e-4"]`` or ``["-m", "pkg.train"]``: a user's entrypoint, ``config_path``
    and ``summary_path`` unused); default the runtime on ``config_path``. ``hosts_store``: whether this
    node's agent hosts the rendezvous store (c10d's ``is_host``); None: c10d decides, and on one machine the
    first agent to bind the port does. False lets a node start at once and connect when the host is up.
    ``node_rank`` None: no ``--node-rank`` (c10d assigns the ranks; every node runs the same command, as a
    rendered Kubernetes or Slurm job does, ``workers/deploy``)."""
    if min_nodes is not None and not 1 <= min_nodes <= nnodes:
        raise ValueError(f"bad elastic range: min_nodes={min_nodes} nnodes={nnodes}")
    if nnodes < 1 or nproc_per_node < 1 or (node_rank is not None and not 0 <= node_rank < nnodes):
        raise ValueError(f"bad layout: nnodes={nnodes} nproc_per_node={nproc_per_node} node_rank={node_rank}")
    rdzv_conf = []
    if min_nodes is not None and min_nodes < nnodes:
        # an elastic range: a re-formed group waits this long for more nodes than the minimum, not 30 s
        rdzv_conf.append(f"last_call_timeout={LAST_CALL_TIMEOUT_S}")
    if hosts_store is not None:
        rdzv_conf.append(f"is_host={str(hosts_store).lower()}")
    cmd = [
        python or sys.executable,
        "-m",
        # warm: torchrun's agent forking ranks that skip the import (agent.py); every job of the control
        # plane, cann-train train / elastic and the benches use it. Plain torchrun stays the default of this
        # function for commands a user runs by hand
        "workers.training.supervision.agent" if warm else "torch.distributed.run",
        f"--nnodes={nnodes}"
        if min_nodes is None or min_nodes == nnodes
        else f"--nnodes={min_nodes}:{nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        *([f"--node-rank={node_rank}"] if node_rank is not None else []),
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={run_id}",
        f"--max-restarts={max_restarts}",
        *([f"--rdzv-conf={','.join(rdzv_conf)}"] if rdzv_conf else []),
    ]
    if program is not None:
        return cmd + list(program)
    cmd += ["-m", "workers.training.run", "--config", str(config_path)]
    if summary_path:
        cmd += ["--summary", str(summary_path)]
    return cmd


RANK_ENV_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "TMP", "TEMP",
        "HOSTNAME", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
        "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
    }
)  # fmt: skip
RANK_ENV_PREFIXES = (
    "LC_", "PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_", "CUDA_", "NVIDIA_", "NCCL_", "CUBLAS",
    "CUDNN_", "HCCL_", "ASCEND_", "TORCH", "PYTORCH_", "GLOO_", "TP_SOCKET", "MASTER_", "HF_", "TRANSFORMERS_",
    "TOKENIZERS_", "TRITON_", "CANN_TRAIN_",
)  # fmt: skip
"""What a training process inherits from the worker that launches it: the system's basics and the variables
of the libraries a rank runs (threads, CUDA/NCCL, Ascend/HCCL, torch, Hugging Face) and cann-train's own
non-secret settings. Nothing else: a rank runs a user's code (an entrypoint, a Hugging Face model's
files), and the worker's environment holds the control plane's secrets (``SECRET_KEY``, ``DATABASE_URL``,
``REDIS_URL``, ``METRICS_TOKEN``, the carbon providers' and schedulers' tokens). An allow-list, not a
deny-list: a secret the operator adds under a name we never heard of stays out too."""
SECRET_NAME = re.compile(
    r"SECRET|PASSW|TOKEN|CREDENTIAL|PRIVATE|(^|_)KEY$|_DSN$|DATABASE_URL|REDIS_URL|BROKER"
)
"""Left out even under an allowed prefix (``HF_TOKEN``, ``CANN_TRAIN_TOKEN``, ``CANN_TRAIN_K8S_TOKEN``)."""
RANK_ENV_PASS = "CANN_TRAIN_RANK_ENV"
"""The operator's additions: comma-separated names (``WANDB_MODE``) or prefixes ending in ``*``
(``WANDB_*``) that ranks also inherit, secret-looking names included (the operator chose them)."""


def rank_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) scrubbed for training processes (:data:`RANK_ENV_NAMES`,
    :data:`RANK_ENV_PREFIXES`, :data:`SECRET_NAME`, :data:`RANK_ENV_PASS`)."""
    base = os.environ if base is None else base
    passed = [p.strip() for p in base.get(RANK_ENV_PASS, "").split(",") if p.strip()]

    def chosen(name: str) -> bool:
        return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in passed)

    def allowed(name: str) -> bool:
        default = name in RANK_ENV_NAMES or name.startswith(RANK_ENV_PREFIXES)
        return default and not SECRET_NAME.search(name)

    return {k: v for k, v in base.items() if chosen(k) or allowed(k)}


def torchrun_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a node's torchrun (and so every rank) runs with: :func:`rank_env` plus
    :data:`TORCHRUN_ENV`."""
    env = rank_env(base)
    env.update(TORCHRUN_ENV)
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
