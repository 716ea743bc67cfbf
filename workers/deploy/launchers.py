"""What the external launchers (:mod:`~workers.deploy.slurm`, :mod:`~workers.deploy.kubernetes`) share: the
state vocabulary a scheduler's job is reported in, and a control-plane job's runtime config as a
:class:`~workers.deploy.render.Deployment` whose rendered job config carries what the control plane adds
beside it (``job_id``, ``redis_url``, ``attempt``: the ranks publish their events on the job's stream).

No Django, no scheduler client here: plain data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from workers.deploy.render import DEFAULT_IMAGE, Deployment, NodeLayout, job_env
from workers.training.config import ConfigError, JobConfig
from workers.training.entrypoint import Entrypoint, is_user_run, parse_run_config

# the vocabulary: the control plane's own job states, plus GONE (the scheduler no longer knows the id)
QUEUED, LAUNCHING, RUNNING = "queued", "launching", "running"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
GONE = "gone"
UNKNOWN = "unknown"
"""A state this code does not know (a newer scheduler's): the job is left as it is, and the state logged."""
FINISHED = (SUCCEEDED, FAILED, CANCELLED)


class SchedulerError(RuntimeError):
    """The scheduler could not be asked (down, refused the request, not configured): ``str()`` says what it
    said. Transient for a state query (asked again at the next poll); final for a submission."""


@dataclass(frozen=True)
class ExternalState:
    """One answer of a scheduler about one job."""

    state: str
    """One of the vocabulary above."""
    detail: str
    """The scheduler's own words, e.g. ``PENDING (Resources)`` or ``Failed: PyTorchJob x has failed ...``."""
    reason: str = ""
    """Why it is in that state, as the scheduler says it (Slurm's ``Reason``, the condition's ``message``)."""
    exit_code: int | None = None
    """The batch step's / job's exit code once it ended (128 + N for a signal N), when the scheduler says."""
    log_path: str = ""
    """Where the job's output goes (Slurm's ``StdOut``), when it is a file."""
    nodes: str = ""
    """The nodes it runs on, as the scheduler names them (Slurm's ``NodeList``)."""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


@dataclass(frozen=True)
class JobDeployment(Deployment):
    """A :class:`Deployment` whose job config also carries ``extra`` (the run's ``attempt``, which the
    runtime reads beside its :class:`JobConfig`, ``workers.training.run``)."""

    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def config_json(self) -> str:
        return json.dumps({**self.config_dict(), **self.extra}, indent=2, sort_keys=True)


def job_deployment(
    config: dict,
    *,
    name: str,
    job_id: int,
    attempt: int,
    redis_url: str,
    nnodes: int,
    nproc_per_node: int,
    device: str,
    python: str = "python",
    image: str = "",
    max_restarts: int = 0,
    env: dict[str, str] | None = None,
) -> JobDeployment:
    """A stored job's runtime config (a :class:`JobConfig` dict, as the control plane keeps it; or a user's
    code's run config, with its ``entrypoint``) laid out on ``nnodes`` x ``nproc_per_node`` ``device`` ranks,
    publishing on stream ``job/<job_id>`` of ``redis_url``. Raises
    :class:`~workers.training.config.ConfigError` naming the field."""
    if device not in ("cuda", "npu", "cpu"):
        raise ConfigError("device", f"an external launch needs cuda, npu or cpu, got {device!r}")
    resolved = {**config, "device": device, "job_id": str(job_id), "redis_url": redis_url}
    if is_user_run(config):
        # a user's code: its script or module under torchrun, in its working directory, with its variables
        # (never one the job's environment sets) and the run config the SDK reads
        run_config = parse_run_config(resolved, world_size=nnodes * nproc_per_node)
        entry = Entrypoint.from_dict(run_config["entrypoint"])
        own = dict(config=None, program=tuple(entry.program()), workdir=entry.cwd, run_config=run_config)
        env = {**entry.env, **job_env(device, env)}
    else:
        own = dict(config=JobConfig.from_dict(resolved))
        env = job_env(device, env)
    return JobDeployment(
        name=name,
        layout=NodeLayout(nnodes, nproc_per_node, device),
        image=image or DEFAULT_IMAGE,
        python=python,
        max_restarts=max_restarts,
        env=env,
        extra={"attempt": attempt},
        **own,
    )
