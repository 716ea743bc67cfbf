"""A user's own training code as a job: the entrypoint (a script or a module, its arguments, working directory,
environment variables and processes per node) and the run config its ranks read through the SDK
(``cann_train.init``), instead of our runtime's :class:`~workers.training.config.JobConfig`.

The run config is flat JSON like the runtime's::

    {"entrypoint": {"script": "/data/team/train.py", "args": ["--lr", "3e-4"], "workdir": "/data/team",
                    "env": {"MY_FLAG": "1"}, "nproc_per_node": 2},
     "strategy": {"dp": 2}, "hyperparameters": {"lr": 3e-4}, "steps": 100, "snapshot_every": 10, ...}

``strategy`` (optional; default all ranks data-parallel) is ``strategy.json``, parsed by the planner's parser:
what ``run.strategy`` gives the script, and what its ``DeviceMesh`` is built from. ``hyperparameters`` is any
JSON object the script reads as ``run.hyperparameters``. ``model`` (optional) is a ``model.json`` for the
planner's prediction beside the measured figures. The run options are the runtime's own, the ones that mean
something for code we do not run ourselves (:data:`RUN_OPTIONS`), parsed by the same table. Where files are
(the script, the working directory) is checked by the control plane against the directories its operator
allows; the ranks run with a scrubbed environment (:func:`workers.training.launch.rank_env`) plus ``env``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.training.config import ConfigError, ParallelConfig, parse_model
from workers.training.options import OptionError, by_name

RUN_CONFIG_ENV = "CANN_TRAIN_RUN_CONFIG"
"""The ranks' environment names their node's run config file (this config plus ``job_id``, the job's own
``redis_url``, ``attempt`` and ``summary_path``): what ``cann_train.init`` reads."""
RUN_OPTIONS = (
    "steps",
    "device",
    "seed",
    "job_id",
    "redis_url",
    "publish",
    "snapshot_every",
    "snapshot_dir",
    "snapshot_full_every",
    "snapshot_keep",
    "resume",
    "resume_from",
    "rescale",
    "inject",
    "energy",
    "risk_policy",
    "peak_tflops",
)
"""The runtime's run options a user's run takes (``steps``: how many the script means to run, for its
progress; ``seed``: ``run.seed``); the rest (model, optimizer, data, comm) are the script's own business."""
MAX_ARGS = 200
MAX_ARG_CHARS = 4096
MAX_ENV = 100
MAX_HYPERPARAMETERS_CHARS = 65_536
MAX_PROCS_PER_NODE = 16  # the densest accelerator servers (HGX-2); CPU ranks are bounded lower, per machine
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
RESERVED_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
RESERVED_ENV_PREFIXES = ("CANN_TRAIN_", "TORCHELASTIC_")
"""Variables torchrun and the platform set for the ranks: a job's ``env`` cannot override them."""


@dataclass(frozen=True)
class Entrypoint:
    """What every rank runs: ``python script args...`` or ``python -m module args...`` in ``workdir``."""

    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    nproc_per_node: int = 1

    @classmethod
    def from_dict(cls, d: Any) -> Entrypoint:
        if not isinstance(d, dict):
            raise ConfigError(
                "entrypoint", "must be a JSON object: {script or module, args, workdir, env, nproc_per_node}"
            )
        errors: dict[str, list[str]] = {}

        def fail(name: str, message: str) -> None:
            errors.setdefault(f"entrypoint.{name}", []).append(message)

        known = {"script", "module", "args", "workdir", "env", "nproc_per_node"}
        for key in sorted(set(d) - known):
            fail(key, f"is not a field of an entrypoint (known: {', '.join(sorted(known))})")
        script, module = d.get("script"), d.get("module")
        if (script is None) == (module is None):
            fail("script", "give a script (an absolute path to a .py file) or a module (python -m), not both")
        if script is not None and (not isinstance(script, str) or not script.endswith(".py")):
            fail("script", f"must be the path of a Python file (.py), got {script!r}")
        if module is not None and (not isinstance(module, str) or not MODULE_NAME.fullmatch(module)):
            fail("module", f"must be a dotted module name like mypkg.train, got {module!r}")
        if module is not None and d.get("workdir") is None:
            fail("workdir", "a module entrypoint needs the working directory it is imported from")
        args = d.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            fail("args", "must be a list of strings (each argument as the script receives it)")
        elif len(args) > MAX_ARGS or any(len(a) > MAX_ARG_CHARS for a in args):
            fail("args", f"at most {MAX_ARGS} arguments of at most {MAX_ARG_CHARS} characters each")
        workdir = d.get("workdir")
        if workdir is not None and not isinstance(workdir, str):
            fail("workdir", f"must be a directory's path, got {workdir!r}")
        env = d.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            fail("env", 'must be an object of string values, e.g. {"MY_FLAG": "1"}')
        else:
            if len(env) > MAX_ENV:
                fail("env", f"at most {MAX_ENV} variables, got {len(env)}")
            for name in env:
                if not ENV_NAME.fullmatch(str(name)):
                    fail("env", f"{name!r} is not a variable name (letters, digits and _, not first a digit)")
                elif name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
                    fail(
                        "env", f"{name} is set by torchrun or cann-train for every rank; a job cannot set it"
                    )
        nproc = d.get("nproc_per_node", 1)
        if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= MAX_PROCS_PER_NODE:
            fail("nproc_per_node", f"must be a whole number from 1 to {MAX_PROCS_PER_NODE}, got {nproc!r}")
        if errors:
            raise ConfigError(errors)
        return cls(
            script=script,
            module=module,
            args=tuple(args),
            workdir=workdir,
            env=dict(env),
            nproc_per_node=nproc,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"script": self.script} if self.script else {"module": self.module}
        return {
            **out,
            "args": list(self.args),
            "workdir": self.cwd,
            "env": dict(self.env),
            "nproc_per_node": self.nproc_per_node,
        }

    @property
    def cwd(self) -> str:
        """Where the ranks run: ``workdir``, else the script's directory."""
        return self.workdir or str(Path(self.script or ".").parent)

    def program(self) -> list[str]:
        """What torchrun runs on every rank (its positional arguments)."""
        head = [self.script] if self.script else ["-m", self.module]
        return [*head, *self.args]

    def paths(self) -> dict[str, str]:
        """The paths the control plane checks against the directories its operator allows, by field."""
        out = {"entrypoint.workdir": self.cwd}
        if self.script:
            out["entrypoint.script"] = self.script
        return out


def parse_run_config(d: Any, *, world_size: int | None = None) -> dict[str, Any]:
    """A user's run config, checked and completed (the entrypoint's defaults filled in, the strategy the
    planner's and whole, options parsed by the runtime's table); :class:`ConfigError` naming each field.
    ``world_size``: the ranks the job will have (the strategy must use exactly those)."""
    if not isinstance(d, dict):
        raise ConfigError("config", "must be a JSON object")
    known = {"entrypoint", "strategy", "hyperparameters", "model", "attempt", "summary_path", *RUN_OPTIONS}
    unknown = sorted(set(d) - known)
    if unknown:
        message = f"is not a field of a job that runs your code (known: {', '.join(sorted(known))})"
        raise ConfigError({key: [message] for key in unknown})
    out: dict[str, Any] = {"entrypoint": Entrypoint.from_dict(d.get("entrypoint")).to_dict()}
    errors: dict[str, list[str]] = {}
    strategy = d.get("strategy")
    if strategy is None:
        strategy = {"dp": world_size or 1}
    try:
        parsed = ParallelConfig.from_dict(strategy)
    except ConfigError as exc:
        errors.update(exc.errors)
    else:
        out["strategy"] = parsed.to_dict()
        if world_size is not None and parsed.world_size != world_size:
            errors["strategy"] = [
                f"tp*pp*dp*cp = {parsed.world_size} but the job runs {world_size} rank(s) "
                "(nodes x entrypoint.nproc_per_node): make them agree"
            ]
    hyper = d.get("hyperparameters", {})
    if not isinstance(hyper, dict):
        errors["hyperparameters"] = ["must be a JSON object (the script reads it as run.hyperparameters)"]
    elif len(json.dumps(hyper)) > MAX_HYPERPARAMETERS_CHARS:
        errors["hyperparameters"] = [f"at most {MAX_HYPERPARAMETERS_CHARS:,} characters of JSON"]
    else:
        out["hyperparameters"] = hyper
    if d.get("model") is not None:
        try:
            out["model"] = parse_model(d["model"]).to_dict()
        except ConfigError as exc:
            errors.update(exc.errors)
    options = by_name()
    for name in RUN_OPTIONS:
        if name not in d or (d[name] is None and not options[name].nullable):
            continue
        value = d[name]
        if name == "job_id" and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        try:
            out[name] = options[name].parse(value)
        except OptionError as exc:
            errors.setdefault(name, []).append(exc.message)
    if out.get("snapshot_every") and not out.get("snapshot_dir"):
        errors.setdefault("snapshot_dir", []).append("snapshot_every needs a snapshot_dir")
    for key in ("attempt", "summary_path"):
        if key in d:
            out[key] = d[key]
    if errors:
        raise ConfigError(errors)
    return out


def rescaled_strategy(strategy: dict, world_size: int) -> dict:
    """``strategy`` for ``world_size`` ranks, as an elastic job of a user's code runs after its group re-formed
    on fewer or more nodes: tp, pp and cp kept (the script's model layout), dp taking the ranks present (each
    rank's batch is the script's: the global batch follows the ranks). :class:`ConfigError` naming
    ``min_nodes`` when tp*pp*cp does not divide them."""
    parsed = ParallelConfig.from_dict(strategy)
    inner = parsed.tp * parsed.pp * parsed.cp
    if world_size < 1 or world_size % inner:
        raise ConfigError(
            "min_nodes",
            f"{world_size} rank(s) do not split into tp*pp*cp = {inner} (tp {parsed.tp}, pp {parsed.pp}, "
            f"cp {parsed.cp}) times a data-parallel degree: choose node counts whose ranks it divides",
        )
    return {**parsed.to_dict(), "dp": world_size // inner}


def is_user_run(config: Any) -> bool:
    """The job runs a user's entrypoint (not our runtime)."""
    return isinstance(config, dict) and config.get("entrypoint") is not None
