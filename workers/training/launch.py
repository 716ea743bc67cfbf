"""Render the ``torchrun`` command that starts the runtime on one node.

The Celery task (multi-node) and ``cann-train train`` (one node) both use :func:`render_torchrun_command`.
Rendezvous is always c10d at an explicit endpoint: restarts (``--max-restarts``) re-formed the group
reliably on these machines only that way, with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in the
environment (``--standalone`` restarts failed to re-form the group); :data:`TORCHRUN_ENV` carries it.
"""

from __future__ import annotations

import os
import socket
import sys

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
) -> list[str]:
    """argv for one node. Run it with ``env={**os.environ, **TORCHRUN_ENV}``. ``hosts_store``: whether this
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
        "-m",
        "workers.training.run",
        "--config",
        str(config_path),
    ]
    if summary_path:
        cmd += ["--summary", str(summary_path)]
    return cmd


def torchrun_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(TORCHRUN_ENV)
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
