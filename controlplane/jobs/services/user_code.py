"""A job that runs a user's own training code (an ``entrypoint``) under the SDK instead of our runtime: its
request checked (``workers.training.entrypoint``: the entrypoint, the strategy for its ranks, the run
options that apply), its files under the directories the operator allows for code (``CODE_ROOTS``), and the
same restart policy, fault plan, snapshots and energy metering as every job."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from rest_framework.exceptions import ValidationError

from controlplane.jobs.paths import path_problem

USER_RUN_FIELDS = ("hyperparameters",)
"""Request fields a job of a user's code takes besides the shared ones (the entrypoint, a strategy)."""


def user_run_config_of(
    *, entrypoint: dict, strategy: dict | None, model: dict | None, steps: int, device: str, **options
) -> dict:
    """The run config of a request (not yet checked: :func:`checked_user_run_config`)."""
    from workers.training.entrypoint import RUN_OPTIONS

    config: dict = {"entrypoint": entrypoint, "steps": steps, "device": device}
    if strategy is not None:
        config["strategy"] = strategy
    if model is not None:
        config["model"] = model
    for key in (*RUN_OPTIONS, *USER_RUN_FIELDS):
        if options.get(key) is not None and key not in config:
            config[key] = options[key]
    config["energy"] = {"zone": settings.GREEN_DEFAULT_ZONE, **(config.get("energy") or {})}
    return config


def checked_user_run_config(config: dict, *, nnodes: int) -> tuple[dict, int]:
    """The run config checked and completed, and its ranks per node; each problem a field's 400 (paths under
    the code directories, resolved as the nodes open them, the script a file and the working directory a
    directory)."""
    from workers.training.config import ConfigError
    from workers.training.entrypoint import Entrypoint, parse_run_config

    try:
        entry = Entrypoint.from_dict(config.get("entrypoint"))
    except ConfigError as exc:
        raise ValidationError(exc.errors) from exc
    errors = {}
    for field, path in entry.paths().items():
        if problem := path_problem(path, code=True):
            errors[field] = [problem]
        elif field == "entrypoint.script" and not Path(path).is_file():
            errors[field] = [f"{path} is not a file"]
        elif field == "entrypoint.workdir" and not Path(path).is_dir():
            errors[field] = [f"{path} is not a directory"]
    if errors:
        raise ValidationError(errors)
    nproc = entry.nproc_per_node
    if config.get("device", "auto") in {"auto", "cpu"} and nproc > settings.MAX_CPU_RANKS_PER_NODE:
        raise ValidationError(
            {
                "entrypoint.nproc_per_node": [
                    f"{nproc} CPU ranks per node; at most {settings.MAX_CPU_RANKS_PER_NODE} fit one node here "
                    "(CANN_TRAIN_MAX_CPU_RANKS). Use more nodes."
                ]
            }
        )
    try:
        return parse_run_config(config, world_size=nnodes * nproc), nproc
    except ConfigError as exc:
        raise ValidationError(exc.errors) from exc


def check_user_run_request(given: dict) -> None:
    """The request fields a job of a user's code cannot take (our runtime's model, optimizer, data and comm
    options, a training document), named in one 400 (``given``: the request's own fields)."""
    from workers.training.entrypoint import RUN_OPTIONS
    from workers.training.options import OPTIONS

    runtime_only = {o.name for o in OPTIONS if o.api} - set(RUN_OPTIONS)
    wrong = sorted((runtime_only | {"training"}) & set(given))
    if wrong:
        raise ValidationError(
            {
                name: [
                    "is an option of cann-train's own runtime; a job that runs your code (entrypoint) sets it in "
                    "its script, or passes it in hyperparameters or the entrypoint's args"
                ]
                for name in wrong
            }
        )
    if "hyperparameters" in given and "entrypoint" not in given:
        raise ValidationError({"hyperparameters": ["only a job that runs your code (entrypoint) takes them"]})


def user_code_outcome(job, failed_node) -> str:
    """What a person is told about an attempt of their own code that ended (``failed_node``: the first node
    that failed, None when every node ended well): in words, which of the usual mistakes it was (the
    script stopped before its first ``run.report``, or after some steps; no snapshot before a fault);
    "" for a run that reported and ended well."""
    from controlplane.live.models import StreamEvent

    reported = StreamEvent.objects.filter(stream=job.stream, kind="train", values__attempt=job.attempts)
    last = reported.order_by("-seq").values_list("step", flat=True).first()
    faults = list(job.faults.filter(attempt=job.attempts).order_by("pk"))
    unsaved = [f for f in faults if not f.resumed_from_step and f.step]
    snapshot_note = (
        f" It had written no snapshot before its fault at step {unsaved[0].step}, so the ranks began again at "
        "step 0: call run.snapshot(step, state) when run.snapshot_due(step) says so (set snapshot_every)."
        if unsaved
        else ""
    )
    if failed_node is None:
        if last is None:
            return (
                "Your script ended well but never called run.report(step, loss=..., tokens=...): the job has no "
                "live figures, throughput, step times or energy per token." + snapshot_note
            )
        return snapshot_note.strip()
    code = failed_node.exit_code
    if last is None:
        return (
            f"Your script exited with code {code} on node {failed_node.node_rank} before its first run.report(): "
            "it did not start training (the log tail below says why: a missing file, an import error, bad "
            "arguments). Fix it and relaunch." + snapshot_note
        )
    return (
        f"Your script exited with code {code} on node {failed_node.node_rank} after step {last}; the log tail "
        "below says why. Fix it and relaunch"
        + (", and it resumes from its newest snapshot." if job.snapshots_enabled else ".")
        + snapshot_note
    )
