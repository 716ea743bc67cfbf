"""Submit a job: the request checked (the runtime's own validation, the machine's limits, the restart and
elastic policy, the fault plan), stored, and launched or scheduled."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import transaction
from rest_framework.exceptions import ValidationError

from controlplane.common.api import only_team_of
from controlplane.common.models import JobState
from controlplane.green.models import GreenSchedule
from controlplane.jobs.models import (
    DEFAULT_HANG_TIMEOUT_S,
    DEFAULT_MAX_RESTARTS,
    HANG_TIMEOUT_RANGE_S,
    MAX_RESTARTS_LIMIT,
    TrainingJob,
)
from controlplane.jobs.paths import check_job_paths, path_problem
from controlplane.jobs.selectors import source_plan_of
from controlplane.jobs.services.events import job_event
from controlplane.jobs.services.lifecycle import job_launch, scheduled_message
from controlplane.jobs.services.scheduling import carbon_aware_schedule, check_schedule
from controlplane.jobs.services.user_code import checked_user_run_config, user_run_config_of
from workers.training.entrypoint import is_user_run
from workers.training.options import api_options

# GPUs / NPUs one node may run a job on: 8 on a DGX H100 or an Atlas 800T A2 node, 16 on the densest
# accelerator servers (HGX-2); a worker also checks the devices it really has before it starts the ranks
MAX_DEVICES_PER_NODE = 16


# steps a CPU job may ask for: ~1 day at the 1 s steps of this machine's small models
MAX_CPU_STEPS = 100_000


def validated_config(config: dict) -> dict:
    """The runtime's own validation (one source of truth), as field-level 400s."""
    from workers.training.config import ConfigError, JobConfig

    try:
        return JobConfig.from_dict(config).validate().to_dict()
    except ConfigError as exc:
        raise ValidationError(exc.errors) from exc


def check_fits_this_machine(config: dict, nproc_per_node: int) -> None:
    """A CPU job must fit in this machine's memory, by the planner's memory model (the one rule:
    ``workers.planner.fits``; a node's supervisor asks it again before it starts any rank)."""
    if config.get("device", "auto") not in {"auto", "cpu"}:
        return
    from workers.training.fits import memory_problem

    if problem := memory_problem(config, nproc_per_node, device_kind="cpu", device_memory_GiB=None):
        raise ValidationError({"model": [problem]})


# the run options a job request may set beside its model, strategy and training documents (the snapshot
# directory is the control plane's to choose: ``snapshot_dir_of``)
RUN_OPTIONS = tuple(o.name for o in api_options() if o.name not in ("steps", "device"))


def job_config_of(
    *,
    model: dict,
    strategy: dict,
    training: dict | None,
    steps: int,
    device: str,
    source_plan=None,
    **options,
) -> dict:
    """The runtime's job config for a request: the documents, the run options that were given, and, for a
    job from a stored plan, the planned cluster's inter-node link (it sizes the DDP gradient buckets,
    ``choose_bucket_cap_mb``)."""
    config = {
        "model": model,
        "strategy": strategy,
        "training": training or {},
        "steps": steps,
        "device": device,
    }
    config.update({k: v for k, v in options.items() if k in RUN_OPTIONS and v is not None})
    # energy and carbon are metered for every job: the deployment's grid zone unless the request names one
    config["energy"] = {"zone": settings.GREEN_DEFAULT_ZONE, **(config.get("energy") or {})}
    if source_plan is not None:
        link = (source_plan.cluster_doc or {}).get("inter_node") or {}
        if link.get("bandwidth_GBps"):
            config["inter_node_GBps"] = link["bandwidth_GBps"]
            config["inter_node_latency_us"] = link.get("latency_us", 0.0)
    return config


def job_submit(
    *,
    user,
    name: str,
    team=None,
    plan_id: int | None = None,
    model: dict | None = None,
    plan: dict | None = None,
    strategy: dict | None = None,
    training: dict | None = None,
    steps: int,
    device: str = "auto",
    nnodes: int | None = None,
    max_nodes: int | None = None,
    min_nodes: int | None = None,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S,
    green_schedule: int | None = None,
    carbon_aware: dict | None = None,
    **options,
) -> TrainingJob:
    """A job request as the API takes it: a stored plan of the user's teams (its strategy, model, training
    and team are the defaults), a plan document, or a strategy; documents given override the plan's.
    ``max_nodes`` is another name for ``nnodes`` (given both, they must agree); ``min_nodes`` below it makes
    the job elastic (``check_node_range``). ``green_schedule`` (a stored schedule of the team) or
    ``carbon_aware`` (schedule it now, ``scheduling.carbon_aware_schedule``) makes it wait for its window
    (``controlplane.jobs.services.scheduling``)."""
    source_plan = None
    if plan_id is not None:
        source_plan = source_plan_of(user, plan_id)
        if source_plan is None:
            raise ValidationError({"plan_id": ["no such plan among your teams'"]})
        plan = plan if plan is not None else {**source_plan.to_contract(), "id": source_plan.pk}
        model = model if model is not None else source_plan.model_doc
        training = training if training is not None else source_plan.training
        team = team or source_plan.team
    if nnodes is not None and max_nodes is not None and nnodes != max_nodes:
        raise ValidationError(
            {
                "max_nodes": [
                    f"max_nodes is the job's nnodes (the most nodes it runs on): got nnodes={nnodes} and "
                    f"max_nodes={max_nodes}; give one of them, or the same number"
                ]
            }
        )
    nnodes = nnodes if nnodes is not None else max_nodes if max_nodes is not None else 1
    entrypoint = options.pop("entrypoint", None)
    if entrypoint is not None:  # the user's own code under the SDK: a model and a strategy are optional
        config = user_run_config_of(
            entrypoint=entrypoint,
            strategy=(plan or {}).get("strategy") or strategy,
            model=model,
            steps=steps,
            device=device,
            **options,
        )
    else:
        options.pop("hyperparameters", None)
        config = _runtime_config(
            model=model,
            plan=plan,
            strategy=strategy,
            training=training,
            steps=steps,
            device=device,
            source_plan=source_plan,
            options=options,
        )
    return _submit_config(
        user=user, name=name, team=team, config=config, plan=plan, source_plan=source_plan, nnodes=nnodes,
        min_nodes=min_nodes, max_restarts=max_restarts, hang_timeout_s=hang_timeout_s,
        green_schedule=green_schedule, carbon_aware=carbon_aware, zone_given=bool((options.get("energy") or {}).get("zone")),
    )  # fmt: skip


def _runtime_config(
    *, model, plan, strategy, training, steps: int, device: str, source_plan, options: dict
) -> dict:
    """Our runtime's job config for a request (its model, strategy and training, or a plan's), or the 400."""
    if model is None and options.get("hf_model"):  # the model of a Hugging Face checkpoint is its config's
        model = model_of_checkpoint(options["hf_model"])
    if model is None:
        raise ValidationError(
            {"model": ["give a model.json (or a plan_id whose model is used, or an hf_model)"]}
        )
    if plan is not None and not isinstance(plan.get("strategy"), dict):
        raise ValidationError({"plan": ["a plan.json must hold a 'strategy' object"]})
    if plan is None and strategy is None:
        raise ValidationError({"strategy": ["give a strategy, or a plan that holds one"]})
    return job_config_of(
        model=model,
        strategy=(plan or {}).get("strategy") or strategy,
        training=training,
        steps=steps,
        device=device,
        source_plan=source_plan,
        **options,
    )


def _submit_config(
    *,
    user,
    name: str,
    team,
    config: dict,
    plan: dict | None,
    source_plan,
    nnodes: int,
    min_nodes: int | None,
    max_restarts: int,
    hang_timeout_s: float,
    green_schedule: int | None,
    carbon_aware: dict | None,
    zone_given: bool,
) -> TrainingJob:
    """A job's config stored, scheduled (a stored green schedule, or carbon-aware now) or launched."""
    team = team or only_team_of(user)
    if green_schedule is not None and carbon_aware is not None:
        raise ValidationError(
            {"carbon_aware": ["give a stored green_schedule or carbon_aware (schedule it now), not both"]}
        )
    with transaction.atomic():
        schedule = None
        if carbon_aware is not None:
            if is_user_run(config):  # a bad job is told so before it is scheduled
                checked_user_run_config(config, nnodes=nnodes)
            else:  # the snapshot directory is the control plane's, given when the job is stored
                validated_config(with_stand_in_snapshot_dir(config))
            schedule = carbon_aware_schedule(
                team=team, user=user, name=name, config=config, plan=plan, request=carbon_aware
            )
        elif green_schedule is not None:
            schedule = GreenSchedule.objects.select_for_update().filter(pk=green_schedule).first()
        if schedule is not None or green_schedule is not None:
            config = check_schedule(
                schedule=schedule,
                team=team,
                config=config,
                zone_given=zone_given and carbon_aware is None,
            )
        return job_create(
            team=team,
            name=name,
            config=config,
            plan=plan,
            nnodes=nnodes,
            min_nodes=min_nodes,
            created_by=user,
            source_plan=source_plan,
            max_restarts=max_restarts,
            hang_timeout_s=hang_timeout_s,
            allow_kill_worker=False,
            green_schedule=schedule,
        )


def model_of_checkpoint(hf_model: str, seq_length: int | None = None) -> dict:
    """``model.json`` of a Hugging Face model directory (under the allowed directories), or the 400."""
    from workers.planner.specs import SpecError
    from workers.planner.specs.hf import spec_from_hf_config

    if problem := path_problem(str(hf_model)):
        raise ValidationError({"hf_model": [problem]})
    try:
        return spec_from_hf_config(hf_model, seq_length=seq_length).to_dict()
    except SpecError as exc:
        raise ValidationError(exc.prefixed("hf_model").errors) from exc


def hf_export_dir_of(job: TrainingJob) -> Path:
    """Where a Hugging Face model's job writes its trained model at the end (``save_hf``): its Export."""
    return Path(settings.VAR_DIR) / "jobs" / str(job.pk) / f"hf-export-{job.files_stamp}"


def check_inputs(config: dict) -> None:
    """The runtime's own checks of a run's inputs before any rank starts (the checkpoint is the model's, the
    tokenizer fits it, the corpus has its field), as field-level 400s."""
    from workers.training.config import ConfigError, JobConfig
    from workers.training.run_inputs import check_run_inputs

    try:
        check_run_inputs(JobConfig.from_dict(config))
    except ConfigError as exc:
        raise ValidationError(exc.errors) from exc


def takes_own_snapshot_dir(config) -> bool:
    """A job that snapshots (``snapshot_every`` > 0) without naming a directory gets the control plane's
    (``snapshot_dir_of``, once it has an id)."""
    return (
        isinstance(config, dict)
        and not config.get("snapshot_dir")
        and isinstance(config.get("snapshot_every"), int)
        and config["snapshot_every"] > 0
    )


def with_stand_in_snapshot_dir(config: dict) -> dict:
    """``config`` as the runtime validates it before the job has an id: a job that takes the control plane's
    snapshot directory holds a stand-in for it (the runtime requires one with ``snapshot_every``)."""
    if not takes_own_snapshot_dir(config):
        return config
    return {**config, "snapshot_dir": str(Path(settings.VAR_DIR) / "jobs" / "new" / "snapshots")}


def snapshot_dir_of(job: TrainingJob) -> Path:
    """Where a job's ranks write their snapshots: one directory for all its attempts, so a relaunch (or a
    restore) finds what the attempts before it wrote; named after the job's creation too (``files_stamp``),
    so it never holds another database's job's snapshots (a run refuses a directory that does)."""
    return Path(settings.VAR_DIR) / "jobs" / str(job.pk) / f"snapshots-{job.files_stamp}"


def check_restart_policy(*, max_restarts, hang_timeout_s) -> None:
    """The restart policy's bounds (``TrainingJob.max_restarts`` / ``hang_timeout_s``), as 400s."""
    errors = {}
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int):
        errors["max_restarts"] = [f"must be a whole number, got {max_restarts!r}"]
    elif not 0 <= max_restarts <= MAX_RESTARTS_LIMIT:
        errors["max_restarts"] = [f"must be 0 to {MAX_RESTARTS_LIMIT}, got {max_restarts}"]
    low, high = HANG_TIMEOUT_RANGE_S
    if isinstance(hang_timeout_s, bool) or not isinstance(hang_timeout_s, int | float):
        errors["hang_timeout_s"] = [f"must be a number of seconds, got {hang_timeout_s!r}"]
    elif not low <= hang_timeout_s <= high:
        errors["hang_timeout_s"] = [f"must be {low:g} to {high:g} seconds, got {hang_timeout_s:g}"]
    if errors:
        raise ValidationError(errors)


def check_node_range(*, min_nodes, nnodes: int) -> None:
    """``min_nodes`` is a whole number from 1 to the job's ``nnodes`` (its ``max_nodes``), as a 400."""
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, int):
        raise ValidationError({"min_nodes": [f"must be a whole number of nodes, got {min_nodes!r}"]})
    if not 1 <= min_nodes <= nnodes:
        raise ValidationError(
            {
                "min_nodes": [
                    f"must be 1 to max_nodes (nnodes) = {nnodes}, got {min_nodes}: the job runs on at most "
                    f"{nnodes} node(s) and goes on while at least min_nodes of them are left"
                ]
            }
        )


def check_elastic_policy(config: dict, *, min_nodes: int, nnodes: int, max_restarts: int) -> None:
    """What an elastic node range (``min_nodes`` < ``nnodes``) needs, as 400s a person can act on: snapshots
    (the nodes left continue from the newest one, resharded) and restarts (they re-form the group by a
    torchrun restart)."""
    range_ = f"an elastic node range ({min_nodes}-{nnodes} nodes)"
    errors = {}
    snapshot_every = config.get("snapshot_every") if isinstance(config, dict) else None
    if not (isinstance(snapshot_every, int) and snapshot_every > 0):
        errors["snapshot_every"] = [
            f"{range_} needs snapshots: when a node is lost the nodes left continue from the newest one, "
            "resharded to their number of ranks. Set snapshot_every > 0, or min_nodes = max_nodes."
        ]
    if max_restarts < 1:
        errors["max_restarts"] = [
            f"{range_} needs max_restarts > 0: the nodes left re-form the group by a torchrun restart. "
            "Set max_restarts to 1 or more, or min_nodes = max_nodes."
        ]
    if errors:
        raise ValidationError(errors)


def check_user_elastic_layout(config: dict, *, min_nodes: int, nnodes: int, nproc: int) -> None:
    """An elastic job of a user's code: on every node count of its range the strategy's tp*pp*cp must divide
    the ranks (dp takes the rest, ``workers.training.entrypoint.rescaled_strategy``; the SDK lays
    ``run.strategy`` out so), as a 400 naming ``min_nodes``."""
    from workers.training.config import ConfigError
    from workers.training.entrypoint import rescaled_strategy

    for nodes in range(min_nodes, nnodes + 1):
        try:
            rescaled_strategy(config.get("strategy") or {"dp": nnodes * nproc}, nodes * nproc)
        except ConfigError as exc:
            raise ValidationError(
                {"min_nodes": [f"on {nodes} node(s): {exc.errors['min_nodes'][0]}"]}
            ) from exc


def check_elastic_layout(config: dict, *, min_nodes: int, nproc: int) -> None:
    """A layout for the ranks of ``min_nodes`` nodes (``workers.training.scaling``: the strategy's dp
    rescaled with the global batch kept, else the planner's best), as a 400; the node counts between are
    the runtime's to lay out the same way."""
    from workers.training.config import ConfigError, JobConfig
    from workers.training.scaling import replan

    ranks = min_nodes * nproc
    try:
        replan(JobConfig.from_dict(config), ranks)
    except ConfigError as exc:
        said = "; ".join(f"{k}: {v}" for k, v in exc.errors.items())
        raise ValidationError(
            {
                "min_nodes": [
                    f"on {min_nodes} node(s) the job would have {ranks} rank(s), and no layout runs it there "
                    f"({said}). Raise min_nodes, or change the strategy or the global batch."
                ]
            }
        ) from exc


def check_injectable(config: dict, world_size: int, *, allow_kill_worker: bool) -> None:
    """The faults a job injects (``inject``) must fit it: ranks it has, snapshots to corrupt. A request
    through the API may inject a rank killed or hung, its newest snapshot corrupted; not ``kill-worker``
    (``allow_kill_worker``): a Celery worker supervises other jobs too, other teams' among them. Never
    ``drop-link``: a job's ranks run on the machine's own network, not in the emulated one's namespaces."""
    if not config.get("inject"):
        return
    from workers.training.supervision.fault_plan import DROP_LINK_NEEDS_NETEM, parse_faults

    try:
        faults = parse_faults(config["inject"])
    except ValueError as exc:
        raise ValidationError({"inject": [str(exc)]}) from exc
    for f in faults:
        if f.rank is not None and f.rank >= world_size:
            raise ValidationError({"inject": [f"{f}: the job has ranks 0-{world_size - 1}"]})
        if f.kind == "corrupt-snapshot" and not int(config.get("snapshot_every") or 0):
            raise ValidationError({"inject": [f"{f}: the job takes no snapshots (set snapshot_every)"]})
        if f.kind == "drop-link":
            raise ValidationError(
                {"inject": [f"{f}: {DROP_LINK_NEEDS_NETEM}; a job runs on its nodes' own network"]}
            )
    if not allow_kill_worker and any(f.kind == "kill-worker" for f in faults):
        raise ValidationError(
            {
                "inject": [
                    "kill-worker would stop every job the worker supervises, other teams' too: inject it with "
                    "`cann-train elastic`, or kill a worker of your own"
                ]
            }
        )


def job_create(
    *,
    team,
    name: str,
    config: dict,
    plan: dict | None = None,
    nnodes: int = 1,
    created_by=None,
    launch: bool = True,
    source_plan=None,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S,
    allow_kill_worker: bool = True,
    min_nodes: int | None = None,
    green_schedule=None,
) -> TrainingJob:
    """Store a job (and queue its first attempt; with a ``green_schedule``, wait for its first slot in
    ``scheduled``: ``controlplane.jobs.services.scheduling``). A job that snapshots (``snapshot_every`` > 0) without a
    ``snapshot_dir`` gets the control plane's (``snapshot_dir_of``). ``allow_kill_worker``: whether its
    ``inject`` may kill the supervising worker (not through the API: ``check_injectable``). ``min_nodes``
    (default ``nnodes``) below ``nnodes`` makes it elastic: its config gets ``rescale`` (the runtime lays
    the job out again for the ranks it has, ``JobConfig.rescale``) and ``resume``."""
    check_restart_policy(max_restarts=max_restarts, hang_timeout_s=hang_timeout_s)
    min_nodes = nnodes if min_nodes is None else min_nodes
    if isinstance(nnodes, int) and nnodes >= 1:
        check_node_range(min_nodes=min_nodes, nnodes=nnodes)
    elastic = isinstance(nnodes, int) and isinstance(min_nodes, int) and min_nodes < nnodes
    user_run = is_user_run(config)
    if elastic:
        check_elastic_policy(config, min_nodes=min_nodes, nnodes=nnodes, max_restarts=max_restarts)
        # every start of its ranks continues from the newest snapshot, at the world size it has then: a
        # group that re-forms for a node that joins restarts its ranks without a failure (torchrun's restart
        # count stays), and a first start would refuse the snapshot directory it already wrote to
        config = {**config, "rescale": True, "resume": True}
    own_dir = takes_own_snapshot_dir(config)
    if own_dir:  # validated with a stand-in; the real directory is named after the job's id below
        config = with_stand_in_snapshot_dir(config)
    if isinstance(config, dict):
        check_job_paths(config)  # before the runtime reads any of them
    hf_export = isinstance(config, dict) and bool(config.get("hf_model")) and not user_run
    if (
        hf_export
    ):  # a Hugging Face model goes back out at the end (the job's export, named after its id below)
        config = {**config, "save_hf": str(Path(settings.VAR_DIR) / "jobs" / "new" / "hf-export")}
    if user_run:
        config, nproc = checked_user_run_config(config, nnodes=nnodes)
        world = nproc * nnodes
    else:
        config = validated_config(config)
        check_inputs(config)
        world = 1
        for key in ("tp", "pp", "dp", "cp"):
            world *= int(config["strategy"].get(key, 1))
        if nnodes < 1 or world % nnodes:
            raise ValidationError(
                {"nnodes": [f"must divide the world size tp*pp*dp*cp = {world}, got {nnodes}"]}
            )
        nproc = world // nnodes
    if (
        not user_run
        and config.get("device", "auto") in {"auto", "cpu"}
        and nproc > settings.MAX_CPU_RANKS_PER_NODE
    ):
        raise ValidationError(
            {
                "nnodes": [
                    f"{world} ranks on {nnodes} node(s) is {nproc} CPU ranks per node; at most {settings.MAX_CPU_RANKS_PER_NODE} "
                    "fit one node here (CANN_TRAIN_MAX_CPU_RANKS). Use more nodes or a smaller strategy."
                ]
            }
        )
    if config.get("device", "auto") in {"cuda", "npu"} and nproc > MAX_DEVICES_PER_NODE:
        raise ValidationError(
            {
                "nnodes": [
                    f"{world} ranks on {nnodes} node(s) is {nproc} {config['device']} devices per node; no node "
                    f"has more than {MAX_DEVICES_PER_NODE}. Use more nodes."
                ]
            }
        )
    if config.get("device", "auto") in {"auto", "cpu"} and int(config.get("steps") or 0) > MAX_CPU_STEPS:
        raise ValidationError(
            {
                "steps": [
                    f"at most {MAX_CPU_STEPS:,} steps for a CPU job (about a day here); got {config['steps']:,}"
                ]
            }
        )
    if not user_run:
        check_fits_this_machine(config, nproc)
    check_injectable(config, world, allow_kill_worker=allow_kill_worker)
    if elastic and user_run:
        check_user_elastic_layout(config, min_nodes=min_nodes, nnodes=nnodes, nproc=nproc)
    elif elastic:
        check_elastic_layout(config, min_nodes=min_nodes, nproc=nproc)
    with transaction.atomic():
        job = TrainingJob.objects.create(
            team=team,
            name=name,
            config=config,
            plan=plan,
            nnodes=nnodes,
            min_nodes=min_nodes,
            nproc_per_node=nproc,
            created_by=created_by,
            source_plan=source_plan,
            max_restarts=max_restarts,
            hang_timeout_s=hang_timeout_s,
            green_schedule=green_schedule,
            state=JobState.SCHEDULED if green_schedule is not None else JobState.QUEUED,
        )
        if own_dir:
            job.config = {**job.config, "snapshot_dir": str(snapshot_dir_of(job))}
        if hf_export:
            job.config = {**job.config, "save_hf": str(hf_export_dir_of(job))}
        if own_dir or hf_export:
            job.save(update_fields=["config"])
        if green_schedule is not None:
            job_event(job, {"state": "scheduled", "attempt": 0, "message": scheduled_message(green_schedule)})
        elif launch:
            job = job_launch(job=job)  # its instance: a launch the broker could not take yet marks it
    return job
