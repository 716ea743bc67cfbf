"""Writes for training jobs: create, launch (fan out to nodes, supervise each node's torchrun), cancel,
relaunch, and settle what the nodes report. The process supervision itself is the engine's
(``workers.training.supervision.supervisor``); this module records what it reports."""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, OperationalError, close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone
from rest_framework.exceptions import APIException, ValidationError

from controlplane.common import logs
from controlplane.common.models import JobState
from controlplane.common.redis import redis_client
from controlplane.jobs.models import (
    DEFAULT_HANG_TIMEOUT_S,
    DEFAULT_MAX_RESTARTS,
    HANG_TIMEOUT_RANGE_S,
    MAX_RESTARTS_LIMIT,
    FailureIncident,
    JobNode,
    TrainingJob,
)
from controlplane.jobs.selectors import NODE_QUEUE_PREFIX, online_node_queues, restarts_left
from controlplane.jobs.tasks import launch_job, run_node
from controlplane.live.feeds import notify_after_commit
from controlplane.live.services import publish, publish_after_commit
from workers.training.supervision import supervisor

log = logging.getLogger(__name__)

# CPU ranks one machine may run per node (torchrun --nproc-per-node); GPUs/NPUs are bounded by the device count
MAX_CPU_RANKS_PER_NODE = int(os.environ.get("CANN_TRAIN_MAX_CPU_RANKS", "4"))
# GPUs / NPUs one node may run a job on: 8 on a DGX H100 or an Atlas 800T A2 node, 16 on the densest
# accelerator servers (HGX-2); a worker also checks the devices it really has before it starts the ranks
MAX_DEVICES_PER_NODE = 16
# work one team may have queued or running at once (a runaway script cannot fill the workers' queues)
MAX_ACTIVE_JOBS_PER_TEAM = int(os.environ.get("CANN_TRAIN_MAX_ACTIVE_JOBS", "20"))
# steps a CPU job may ask for: ~1 day at the 1 s steps of this machine's small models
MAX_CPU_STEPS = 100_000


class TooMuchQueuedWork(APIException):
    status_code = 429
    default_code = "too_much_queued_work"


# a supervisor that has not written a heartbeat for this long is presumed dead
HEARTBEAT_TIMEOUT = timedelta(seconds=float(os.environ.get("CANN_TRAIN_HEARTBEAT_TIMEOUT_S", "20")))


def validated_config(config: dict) -> dict:
    """The runtime's own validation (one source of truth), as field-level 400s."""
    from workers.training.config import ConfigError, JobConfig

    try:
        return JobConfig.from_dict(config).validate().to_dict()
    except ConfigError as exc:
        raise ValidationError(exc.errors) from exc


def _job_event(job: TrainingJob, values: dict) -> None:
    publish_after_commit(job.stream, "event", values)
    if "state" in values:  # open job lists of the team refresh this row (a new job: add it)
        notify_after_commit("jobs", job.team_id, {"id": job.pk, "state": values["state"]})


def check_fits_this_machine(config: dict, nproc_per_node: int) -> None:
    """A CPU job must fit in this machine's memory: weights, gradients and Adam's two moments in fp32
    (16 bytes per parameter, Rajbhandari et al. 2020 §3) per replica, times the ranks of one node."""
    if config.get("device", "auto") not in {"auto", "cpu"}:
        return
    import psutil

    from workers.planner import ModelSpec, SpecError

    try:
        params = ModelSpec.from_dict(config["model"]).parameter_count()["total"]
    except SpecError as exc:
        raise ValidationError({f"model.{k}": v for k, v in exc.errors.items()}) from exc
    need = params * 16 * nproc_per_node
    have = psutil.virtual_memory().total
    if need > 0.8 * have:
        name = config["model"].get("name", "this model")
        raise ValidationError(
            {
                "model": [
                    f"{name} has {params / 1e9:.3g} B parameters: training it on {nproc_per_node} CPU rank(s) needs about "
                    f"{need / 2**30:,.0f} GiB, this machine has {have / 2**30:,.0f} GiB. "
                    "Launch it on a GPU/NPU cluster, or use a smaller model here."
                ]
            }
        )


# the run options a job request may set beside its model, strategy and training documents (the snapshot
# directory is the control plane's to choose: ``snapshot_dir_of``)
RUN_OPTIONS = (
    "lr",
    "seed",
    "comm_hook",
    "profile_every",
    "bucket_cap_mb",
    "snapshot_every",
    "snapshot_full_every",
    "snapshot_delta",
    "snapshot_keep",
    "snapshot_memory_every",
    "inject",
    "energy",
    "risk_policy",
)


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
    (``controlplane.jobs.scheduling``)."""
    from controlplane.common.api import only_team_of
    from controlplane.jobs.selectors import source_plan_of

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
    if model is None:
        raise ValidationError({"model": ["give a model.json (or a plan_id whose model is used)"]})
    if plan is not None and not isinstance(plan.get("strategy"), dict):
        raise ValidationError({"plan": ["a plan.json must hold a 'strategy' object"]})
    if plan is None and strategy is None:
        raise ValidationError({"strategy": ["give a strategy, or a plan that holds one"]})
    config = job_config_of(
        model=model,
        strategy=(plan or {}).get("strategy") or strategy,
        training=training,
        steps=steps,
        device=device,
        source_plan=source_plan,
        **options,
    )
    team = team or only_team_of(user)
    if green_schedule is not None and carbon_aware is not None:
        raise ValidationError(
            {"carbon_aware": ["give a stored green_schedule or carbon_aware (schedule it now), not both"]}
        )
    with transaction.atomic():
        schedule = None
        if carbon_aware is not None:
            from controlplane.jobs.scheduling import carbon_aware_schedule

            validated_config(config)  # a bad job is told so before it is scheduled
            schedule = carbon_aware_schedule(
                team=team, user=user, name=name, config=config, plan=plan, request=carbon_aware
            )
        elif green_schedule is not None:
            from controlplane.green.models import GreenSchedule

            schedule = GreenSchedule.objects.select_for_update().filter(pk=green_schedule).first()
        if schedule is not None or green_schedule is not None:
            from controlplane.jobs.scheduling import check_schedule

            config = check_schedule(
                schedule=schedule,
                team=team,
                config=config,
                zone_given=bool((options.get("energy") or {}).get("zone")) and carbon_aware is None,
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
    ``scheduled``: ``controlplane.jobs.scheduling``). A job that snapshots (``snapshot_every`` > 0) without a
    ``snapshot_dir`` gets the control plane's (``snapshot_dir_of``). ``allow_kill_worker``: whether its
    ``inject`` may kill the supervising worker (not through the API: ``check_injectable``). ``min_nodes``
    (default ``nnodes``) below ``nnodes`` makes it elastic: its config gets ``rescale`` (the runtime lays
    the job out again for the ranks it has, ``JobConfig.rescale``) and ``resume``."""
    check_restart_policy(max_restarts=max_restarts, hang_timeout_s=hang_timeout_s)
    min_nodes = nnodes if min_nodes is None else min_nodes
    if isinstance(nnodes, int) and nnodes >= 1:
        check_node_range(min_nodes=min_nodes, nnodes=nnodes)
    elastic = isinstance(nnodes, int) and isinstance(min_nodes, int) and min_nodes < nnodes
    if elastic:
        check_elastic_policy(config, min_nodes=min_nodes, nnodes=nnodes, max_restarts=max_restarts)
        # every start of its ranks continues from the newest snapshot, at the world size it has then: a
        # group that re-forms for a node that joins restarts its ranks without a failure (torchrun's restart
        # count stays), and a first start would refuse the snapshot directory it already wrote to
        config = {**config, "rescale": True, "resume": True}
    own_dir = (
        isinstance(config, dict)
        and not config.get("snapshot_dir")
        and isinstance(config.get("snapshot_every"), int)
        and config["snapshot_every"] > 0
    )
    if own_dir:  # validated with a stand-in; the real directory is named after the job's id below
        config = {**config, "snapshot_dir": str(Path(settings.VAR_DIR) / "jobs" / "new" / "snapshots")}
    config = validated_config(config)
    world = 1
    for key in ("tp", "pp", "dp", "cp"):
        world *= int(config["strategy"].get(key, 1))
    if nnodes < 1 or world % nnodes:
        raise ValidationError({"nnodes": [f"must divide the world size tp*pp*dp*cp = {world}, got {nnodes}"]})
    nproc = world // nnodes
    if config.get("device", "auto") in {"auto", "cpu"} and nproc > MAX_CPU_RANKS_PER_NODE:
        raise ValidationError(
            {
                "nnodes": [
                    f"{world} ranks on {nnodes} node(s) is {nproc} CPU ranks per node; at most {MAX_CPU_RANKS_PER_NODE} "
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
    check_fits_this_machine(config, nproc)
    check_injectable(config, world, allow_kill_worker=allow_kill_worker)
    if elastic:
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
            job.save(update_fields=["config"])
        if green_schedule is not None:
            _job_event(
                job, {"state": "scheduled", "attempt": 0, "message": scheduled_message(green_schedule)}
            )
        elif launch:
            job_launch(job=job)
    return job


def scheduled_message(schedule) -> str:
    """What a job waiting for its carbon-aware window says."""
    from controlplane.jobs.scheduling import _utc, slots_of

    slots = slots_of(schedule)
    result = schedule.result
    saving = result.get("saving_pct")
    parts = [f"Waits for its carbon-aware window: starts at {_utc(slots[0][0])}"]
    if len(slots) > 1:
        parts.append(f"in {len(slots)} slots, pausing between them")
    if isinstance(saving, int | float):
        parts.append(f"predicted {saving:.1f}% less CO2e than starting at once (schedule #{schedule.pk})")
    return ", ".join(parts) + "."


def job_launch(
    *,
    job: TrainingJob,
    resume_from: str | None = None,
    automatic: bool = False,
    why: str = "",
    scheduled_slot_end=None,
) -> TrainingJob:
    """Queue a (re)launch. Only a new job, or a failed / cancelled one, can be launched; a job that
    snapshots continues from its newest good snapshot (``resume``), or from ``resume_from`` exactly (a
    restore, which a succeeded job may do too). ``automatic``: the reaper resuming a job whose worker was
    lost (it is recovering; no quota check: it held its slot all along; its faults keep counting against
    ``max_restarts``). ``why`` goes into the "queued" event. A scheduled job may be launched: by the
    scheduler when its slot opens (``scheduled_slot_end``: when the slot ends, or None past its window), or
    by a person at once (it then runs to the end)."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        allowed = {JobState.FAILED, JobState.CANCELLED, JobState.SCHEDULED}
        if automatic:
            allowed.add(JobState.RECOVERING)
        if resume_from:
            allowed.add(JobState.SUCCEEDED)
        if (job.attempts or job.state == JobState.SCHEDULED) and job.state not in allowed:
            raise ValidationError({"state": [f"a {job.state} job cannot be launched again; cancel it first"]})
        active = (
            TrainingJob.objects.filter(
                team_id=job.team_id, attempts__gt=0, state__in=(JobState.QUEUED, *TrainingJob.ACTIVE_STATES)
            )
            .exclude(pk=job.pk)
            .count()
        )
        if not automatic and active >= MAX_ACTIVE_JOBS_PER_TEAM:
            raise TooMuchQueuedWork(
                f"Your team has {active} jobs queued or running, the most one team may have at once "
                f"(CANN_TRAIN_MAX_ACTIVE_JOBS={MAX_ACTIVE_JOBS_PER_TEAM}). Wait for some to finish, or cancel some."
            )
        from controlplane.jobs.recovery import resume_plan

        job.config, resume = resume_plan(job, resume_from=resume_from)
        job.attempts += 1
        if not automatic:  # a person launched it: the restart budget starts again
            job.restart_budget_from = job.attempts
        job.state = JobState.QUEUED
        job.cancel_requested = job.pause_requested = False
        job.slot_end_at = scheduled_slot_end
        job.cancelled_by = None
        job.error = job.human_readable_error = ""
        job.progress = 0.0
        job.measured = None  # the run summary is the new attempt's to write
        job.goodput = None
        job.started_at = job.finished_at = job.heartbeat_at = None
        job.save()
        attempt = job.attempts
        values = {"state": "queued", "attempt": attempt}
        if resume is not None:
            values["resume"] = resume
            values["message"] = " ".join(filter(None, [why, resume["message"]]))
        elif why:
            values["message"] = why
        if automatic:
            values["automatic"] = True
        # on_commit callbacks run in order: the "queued" event goes out before any worker can answer
        _job_event(job, values)
        transaction.on_commit(lambda: launch_job.apply_async((job.pk, attempt), queue="training"))
    return job


def cancelled_message(job: TrainingJob) -> str:
    """What a cancelled job says instead of an error: who asked for it."""
    return f"Cancelled by {job.cancelled_by.get_username()}." if job.cancelled_by_id else "Cancelled."


def job_cancel(*, job: TrainingJob, user=None) -> TrainingJob:
    """Ask the job to stop (``user`` is remembered: the job then says who cancelled it)."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if job.is_finished:
            raise ValidationError({"state": [f"the job already ended ({job.state})"]})
        job.cancel_requested = True
        job.pause_requested = False  # a person's cancel wins over a pause at the end of a slot
        job.cancelled_by = user if user is not None and user.is_authenticated else None
        if job.state in (JobState.QUEUED, JobState.SCHEDULED):  # nothing started: no supervisor to tell
            job.state = JobState.CANCELLED
            job.finished_at = timezone.now()
            job.human_readable_error, job.error = cancelled_message(job), ""
            job.nodes.filter(attempt=job.attempts, state=JobState.QUEUED).update(state=JobState.CANCELLED)
            _job_event(
                job, {"state": "cancelled", "attempt": job.attempts, "message": job.human_readable_error}
            )
        elif job.launcher != "local":  # its scheduler stops it (and the follower settles it when it has)
            from controlplane.jobs.external import cancel_external

            transaction.on_commit(lambda: cancel_external(job_id=job.pk))
        job.save()
    return job


MAX_TAGS, TAG_MAX_CHARS, NOTES_MAX_CHARS = 20, 40, 10_000


def _bad_characters(text: str, allowed: str = "") -> list[str]:
    """Control characters (Unicode Cc) and lone surrogates (Cs: no database stores them) in ``text``."""
    import unicodedata

    bad = {c for c in text if c not in allowed and unicodedata.category(c) in ("Cc", "Cs")}
    return [f"U+{ord(c):04X}" for c in sorted(bad)]


def clean_tags(tags: list) -> list[str]:
    """At most 20 labels of 1-40 characters, no control characters; surrounding spaces stripped, repeats
    dropped (first kept)."""
    if not isinstance(tags, list):
        raise ValidationError({"tags": ["must be a list of strings"]})
    out: list[str] = []
    for i, tag in enumerate(tags):
        if not isinstance(tag, str):
            raise ValidationError({"tags": [f"tag {i + 1} must be a string, got {type(tag).__name__}"]})
        tag = tag.strip()
        if not 1 <= len(tag) <= TAG_MAX_CHARS:
            raise ValidationError(
                {"tags": [f"tag {i + 1} has {len(tag)} characters; a tag has 1 to {TAG_MAX_CHARS}"]}
            )
        if bad := _bad_characters(tag):
            raise ValidationError({"tags": [f"tag {i + 1} contains control characters ({', '.join(bad)})"]})
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise ValidationError({"tags": [f"{len(out)} tags; a job carries at most {MAX_TAGS}"]})
    return out


def clean_notes(notes: str) -> str:
    """Free text of at most 10,000 characters; line breaks and tabs are fine, other control characters
    are not."""
    if not isinstance(notes, str):
        raise ValidationError({"notes": ["must be a string"]})
    if len(notes) > NOTES_MAX_CHARS:
        raise ValidationError({"notes": [f"{len(notes):,} characters; at most {NOTES_MAX_CHARS:,}"]})
    if bad := _bad_characters(notes, allowed="\n\r\t"):
        raise ValidationError({"notes": [f"contains control characters ({', '.join(bad)})"]})
    return notes


def job_annotate(*, job: TrainingJob, tags: list | None = None, notes: str | None = None) -> TrainingJob:
    """Set a job's tags and/or notes (each replaces what was there); open job lists of the team refresh."""
    changed = []
    if tags is not None:
        job.tags = clean_tags(tags)
        changed.append("tags")
    if notes is not None:
        job.notes = clean_notes(notes)
        changed.append("notes")
    if changed:
        job.save(update_fields=[*changed, "updated_at"])
        notify_after_commit("jobs", job.team_id, {"id": job.pk, "annotated": changed})
    return job


def job_fail(*, job_id: int, human: str, error: str = "") -> None:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.is_finished:
            return
        job.state = JobState.FAILED
        job.human_readable_error = human
        job.error = error
        job.finished_at = timezone.now()
        job.save()
        job.nodes.filter(attempt=job.attempts).exclude(state__in=TrainingJob.TERMINAL_STATES).update(
            state=JobState.FAILED, finished_at=job.finished_at
        )
        _job_event(job, {"state": "failed", "message": human, "attempt": job.attempts})


def node_started(*, node: JobNode, pid: int) -> None:
    now = timezone.now()
    with transaction.atomic():
        JobNode.objects.filter(pk=node.pk).update(
            state=JobState.RUNNING, pid=pid, started_at=now, heartbeat_at=now
        )
        job = TrainingJob.objects.select_for_update().get(pk=node.job_id)
        if job.state in (JobState.QUEUED, JobState.LAUNCHING):
            job.state = JobState.RUNNING
            job.started_at = job.started_at or now
            job.heartbeat_at = now
            job.save()
            nodes = job.nodes.filter(attempt=job.attempts).count() if job.elastic else job.nnodes
            _job_event(
                job,
                {
                    "state": "running",
                    "attempt": job.attempts,
                    "nodes": nodes,
                    "ranks": nodes * job.nproc_per_node,
                },
            )


def heartbeat(*, node: JobNode) -> bool:
    """Record a sign of life; returns True when the node's run should stop: the job wants to be cancelled,
    or (elastic) the control plane already gave this node up as lost (``reap_lost_nodes``: its heartbeats
    stopped for a while; the group went on without it, so its agent must not linger in it)."""
    now = timezone.now()
    JobNode.objects.filter(pk=node.pk).update(heartbeat_at=now)
    TrainingJob.objects.filter(pk=node.job_id).update(heartbeat_at=now)
    if TrainingJob.objects.filter(pk=node.job_id, cancel_requested=True).exists():
        return True
    return JobNode.objects.filter(
        pk=node.pk, state=JobState.FAILED, job__min_nodes__lt=F("job__nnodes")
    ).exists()


def node_finished(
    *,
    node: JobNode,
    exit_code: int,
    cancelled: bool,
    log_tail: str,
    summary: dict | None,
    elastic: dict | None = None,
) -> None:
    """Store a node's outcome; the last node to finish settles the job. ``elastic`` is the recovery
    engine's report of the node (``ElasticWatch.report()``): its snapshots and goodput are kept. A node of
    an elastic job that fails while other nodes of its attempt go on is a ``node-lost`` fault, not the end
    of the job (``record_node_lost``). A node of an earlier attempt settles nothing."""
    from controlplane.jobs.recovery import record_node_lost, store_elastic_report

    now = timezone.now()
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=node.job_id)
        state = (
            JobState.CANCELLED if cancelled else (JobState.SUCCEEDED if exit_code == 0 else JobState.FAILED)
        )
        given_up = JobNode.objects.filter(pk=node.pk, state=JobState.FAILED).exists()
        if job.elastic and given_up:  # recorded lost before it reported: it stays so (it was stopped for it)
            state = JobState.FAILED
        JobNode.objects.filter(pk=node.pk).update(state=state, exit_code=exit_code, finished_at=now)
        job.exit_codes = [
            *job.exit_codes,
            {"attempt": node.attempt, "node_rank": node.node_rank, "code": exit_code},
        ]
        if node.node_rank == 0 or not job.log_tail:
            job.log_tail = log_tail
        if summary is not None:
            job.measured = summary
        goodput = None
        # a node the elastic job gave up (lost, drained) reports the ranks stopped for that: no fault of the
        # job's, which goes on without it, and no goodput of the job's either
        dropped = job.elastic and given_up
        if (
            elastic
            and not dropped
            and node.attempt == job.attempts
            and (node.node_rank == 0 or job.goodput is None)
        ):
            goodput = store_elastic_report(job=job, attempt=node.attempt, report=elastic)
        elif job.goodput and summary is not None:  # another node's summary: the goodput stays in it
            job.measured = {**job.measured, "goodput": job.goodput}
        nodes = list(job.nodes.filter(attempt=node.attempt))
        current = node.attempt == job.attempts and not job.is_finished
        if current and job.elastic and state == JobState.FAILED and not given_up and not job.cancel_requested:
            going_on = [n for n in nodes if n.pk != node.pk and _alive(n, now)]
            if going_on:
                record_node_lost(
                    job=job,
                    node=next(n for n in nodes if n.pk == node.pk),
                    message=(
                        f"torchrun on node {node.node_rank} exited with code {exit_code}; the job goes on on "
                        f"{len(going_on)} node(s)"
                    ),
                )
        if not current or any(n.state not in TrainingJob.TERMINAL_STATES for n in nodes):
            job.save()
            if goodput is not None:
                _job_event(job, {"goodput": goodput, "attempt": node.attempt})
            return
        settle_attempt(job=job, nodes=nodes, log_tail=log_tail, now=now)


def _alive(node: JobNode, now, stale_after: timedelta | None = None) -> bool:
    """The node's supervisor runs (picked up, its heartbeats fresh: ``stale_after``, default
    ``HEARTBEAT_TIMEOUT``), or its run ended well."""
    if node.state == JobState.SUCCEEDED:
        return True
    return (
        node.state not in TrainingJob.TERMINAL_STATES
        and node.heartbeat_at is not None
        and node.heartbeat_at >= now - (stale_after or HEARTBEAT_TIMEOUT)
    )


def settle_attempt(*, job: TrainingJob, nodes: list[JobNode], log_tail: str, now) -> None:
    """Every node of the job's current attempt has ended: the job ends (inside the caller's transaction,
    ``job`` locked). An elastic job leaves out the nodes it lost (``node-lost`` faults): it succeeded when
    the nodes that went on to the end did."""
    from controlplane.jobs.models import WITHOUT_THE_NODE

    if job.elastic:
        lost = set(
            job.faults.filter(attempt=job.attempts, kind__in=WITHOUT_THE_NODE).values_list(
                "node_rank", flat=True
            )
        )
        nodes = [n for n in nodes if n.node_rank not in lost] or nodes
    states = {n.state for n in nodes}
    paused = job.pause_requested and states != {JobState.SUCCEEDED}
    if paused:  # stopped at the end of its carbon-aware slot: it waits for the next one
        from controlplane.jobs.scheduling import _utc, next_slot, slots_of

        job.state = JobState.SCHEDULED
        job.cancel_requested = job.pause_requested = False
        job.human_readable_error = job.error = ""
        upcoming = next_slot(slots_of(job.green_schedule), now) if job.green_schedule_id else None
        job.save()
        _job_event(
            job,
            {
                "state": "scheduled",
                "attempt": job.attempts,
                "exit_codes": [n.exit_code for n in nodes],
                "message": "Paused between carbon-aware slots"
                + (f": continues from its newest snapshot at {_utc(upcoming[0])}." if upcoming else "."),
            },
        )
        return
    if job.cancel_requested or JobState.CANCELLED in states:
        job.state = JobState.CANCELLED
        # a clean end: who asked for it, not the traceback torchrun prints when it is stopped
        job.human_readable_error, job.error = cancelled_message(job), ""
    elif states == {JobState.SUCCEEDED}:
        job.state = JobState.SUCCEEDED
        job.progress = 1.0
    else:
        job.state = JobState.FAILED
        bad = [n for n in nodes if n.state == JobState.FAILED]
        job.human_readable_error = (
            f"torchrun on node {bad[0].node_rank} exited with code {bad[0].exit_code}; the log tail below says why. "
            "Fix the cause and relaunch."
        )
        if job.faults.filter(attempt=job.attempts).exists() and restarts_left(job) == 0:
            job.human_readable_error += (
                f" It was not recovered again: it had used its {job.max_restarts} automatic recoveries "
                "(max_restarts)"
                + (
                    ", and a relaunch resumes from its newest good snapshot."
                    if job.snapshots_enabled
                    else "."
                )
            )
        job.error = log_tail[-2000:]
    job.finished_at = now
    job.save()
    values = {"state": job.state, "attempt": job.attempts, "exit_codes": [n.exit_code for n in nodes]}
    if job.state == JobState.CANCELLED:
        values["message"] = job.human_readable_error
    if job.measured:
        values["measured"] = {k: job.measured.get(k) for k in ("step_time_s", "tokens_per_s", "loss_last")}
    if job.goodput:
        values["goodput"] = job.goodput
    _job_event(job, values)
    # (an elastic job that ended on fewer nodes than its plan's measured another layout than the plan's)
    if (
        job.state == JobState.SUCCEEDED
        and job.source_plan_id
        and job.measured
        and job.measured.get("world_size") in (None, job.world_size)
    ):
        record_measurement(job=job)


def job_fan_out(*, job_id: int, attempt: int) -> str:
    """Give each node of a queued attempt its ``run_node`` task: any training worker for a one-node job,
    the ``node.<name>`` queues of live node workers for a multi-node one. An elastic job starts on as many
    as are online, from ``min_nodes`` up to its ``max_nodes`` (``nnodes``)."""
    job = TrainingJob.objects.get(pk=job_id)
    if job.attempts != attempt or job.state != JobState.QUEUED:
        return "skipped"
    if settings.JOB_LAUNCHER != "local":  # Slurm or Kubernetes runs it (controlplane.jobs.external)
        from controlplane.jobs.external import launch_attempt

        return launch_attempt(job_id=job_id, attempt=attempt)
    if job.nnodes == 1:
        queues = ["training"]
    else:
        online = online_node_queues()
        if len(online) < job.min_nodes:
            needs = (
                f"at least {job.min_nodes} of its {job.nnodes} nodes (min_nodes)"
                if job.elastic
                else f"{job.nnodes} nodes"
            )
            job_fail(
                job_id=job.pk,
                human=(
                    f"This job needs {needs} but {len(online)} node worker(s) are online "
                    f"({', '.join(online) or 'none'}). Start a worker per node with "
                    "CANN_TRAIN_NODE=<name> celery -A controlplane worker -Q training,node.<name>, then relaunch."
                ),
            )
            return "failed"
        queues = online[: job.nnodes]
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.QUEUED:  # cancelled meanwhile
            return "skipped"
        job.state = JobState.LAUNCHING
        job.heartbeat_at = timezone.now()
        # (an earlier attempt may have run through Slurm / Kubernetes)
        job.launcher, job.external_id, job.external_state = "local", "", ""
        job.save()
        for rank in range(len(queues)):
            JobNode.objects.create(
                job=job,
                attempt=attempt,
                node_rank=rank,
                node_name=queues[rank].removeprefix(NODE_QUEUE_PREFIX) if job.nnodes > 1 else "",
            )
        values = {"state": "launching", "attempt": attempt, "nodes": queues}
        if job.elastic:
            values["message"] = (
                f"Starting on {len(queues)} of its {job.nnodes} nodes (elastic: it goes on with at least "
                f"{job.min_nodes}"
                + (", and grows when more node workers come online" if len(queues) < job.nnodes else "")
                + ")."
            )
        _job_event(job, values)
        for rank, queue in enumerate(queues):
            transaction.on_commit(lambda r=rank, q=queue: run_node.apply_async((job_id, attempt, r), queue=q))
    return f"launched on {', '.join(queues)}"


def job_dir(job: TrainingJob, attempt: int) -> Path:
    path = Path(settings.VAR_DIR) / "jobs" / str(job.pk) / f"attempt-{attempt}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def node_run(*, job_id: int, attempt: int, node_rank: int) -> str:
    """Run one node's ``torchrun`` agent for a job attempt inside this worker and record what happens:
    started, heartbeats (answering a cancel), exit code, log tail and run summary."""
    from workers.training.launch import render_torchrun_command, torchrun_env

    close_old_connections()
    job = TrainingJob.objects.get(pk=job_id)
    node = JobNode.objects.filter(job=job, attempt=attempt, node_rank=node_rank).first()
    if node is None or job.attempts != attempt or job.is_finished or node.state != JobState.QUEUED:
        log.info(
            "job %s attempt %s node %s: nothing to do (stale or repeated delivery)",
            job_id,
            attempt,
            node_rank,
        )
        return "skipped"
    # picked up: from now on this node's heartbeats say whether its supervisor lives (a node still waiting
    # in the queue for a free worker slot has none, and the reaper leaves its job alone)
    picked_at = timezone.now()
    JobNode.objects.filter(pk=node.pk).update(node_name=supervisor.node_name(), heartbeat_at=picked_at)
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=picked_at)
    from workers.devices.backend import device_memory_GiB, devices_missing, select_device
    from workers.training.fits import memory_problem

    requested = job.config.get("device", "auto")
    problem = devices_missing(requested, job.nproc_per_node)
    if not problem:  # the devices are there: will the job's ranks fit in their memory?
        kind = select_device(requested).kind
        problem = memory_problem(
            job.config, job.nproc_per_node, device_kind=kind, device_memory_GiB=device_memory_GiB(kind)
        )
    if problem:
        job_fail(job_id=job.pk, human=problem)
        return "failed"
    workdir = job_dir(job, attempt)
    try:
        endpoint = supervisor.rendezvous_endpoint(
            redis_client(),
            f"cann:rdzv:job/{job.pk}/{attempt}",
            node_rank,
            address=supervisor.node_address(),
            on_wait=lambda: heartbeat(node=node),
        )
    except TimeoutError as exc:
        job_fail(job_id=job.pk, human=f"Job {job.pk}: {exc}")
        return "failed"
    config_path = workdir / f"config-node{node_rank}.json"
    # ``attempt`` labels every event the run publishes (the job page draws each attempt as its own trace)
    config_path.write_text(
        json.dumps({**job.config, "job_id": str(job.pk), "redis_url": settings.REDIS_URL, "attempt": attempt})
    )
    # torchrun's c10d rendezvous hands out global ranks in joining order and ignores --node-rank, so global
    # rank 0 (the one that writes the summary) may run under any node's agent: every node asks for one.
    summary_path = workdir / f"summary-node{node_rank}.json"
    from controlplane.jobs.recovery import elastic_watch_for

    # the recovery engine: watches the ranks (progress, hangs), fires injected faults, reports faults,
    # recoveries and snapshots (recorded as they come) and the goodput at the end
    try:
        watch = elastic_watch_for(job, attempt, node_rank, workdir)
    except ValueError as exc:  # a fault plan that does not fit the job (checked at submit; kept safe)
        job_fail(job_id=job.pk, human=f"Fault injection: {exc}")
        return "failed"
    # torchrun restarts the node's ranks from the newest good snapshot, as often as the job has restarts
    # left (a job that takes no snapshots would start over from step 0: it is not restarted)
    max_restarts = restarts_left(job) if watch is not None and job.snapshots_enabled else 0
    cmd = render_torchrun_command(
        str(config_path),
        job.nnodes,
        job.nproc_per_node,
        # a node that joins a running elastic attempt has a new row past the first nnodes; c10d ignores
        # --node-rank (see above), torchrun only checks it is below --nnodes
        min(node_rank, job.nnodes - 1),
        endpoint,
        run_id=f"job{job.pk}-a{attempt}",
        max_restarts=max_restarts,
        summary_path=str(summary_path),
        # an elastic range: --nnodes MIN:MAX, so the agents re-form the group on the nodes left (and with a
        # node that comes back)
        min_nodes=job.min_nodes if job.elastic else None,
        # warm agents (workers.training.supervision.agent) for every job: the ranks fork from one import of the runtime
        # (~4 s of CPU per rank saved at each start and restart here). With plain torchrun the shrink and
        # regrow of tests/engines/reliability/test_elastic_scaling.py timed out. A killed Celery worker's job once
        # settled ~100 s later with them (test_chaos); re-measured after the ranks' OpenMP pool fix: 36 s,
        # against 45 s with plain torchrun.
        warm=True,
        # node 0 hosts the rendezvous store, never another node (c10d lets the first agent to bind the port
        # host it): the group must not lose its store with a node it can lose (reap_lost_nodes)
        hosts_store=False if job.elastic and node_rank != 0 else None,
    )
    log.info("job %s node %s: %s", job.pk, node_rank, " ".join(cmd))

    def beat() -> bool:
        close_old_connections()
        try:
            wants_cancel = heartbeat(node=node)
        except DatabaseError:  # a database blip must not stop the training: the next beat retries
            log.warning("job %s node %s: heartbeat not recorded", job.pk, node_rank, exc_info=True)
            return False
        if wants_cancel:
            log.info("job %s node %s: cancel requested, stopping the process group", job.pk, node_rank)
        return wants_cancel

    from controlplane.jobs.recovery import risk_watch_for

    # the fault-risk loop: this node's telemetry and its ranks' straggler scores, live on the job's stream
    risk = risk_watch_for(job, attempt, node_rank, watch, local_ranks=job.nproc_per_node) if watch else None

    def poll() -> None:
        try:
            watch.poll()
        finally:  # each watch goes on when the other fails
            risk.poll()

    if risk is not None:
        risk.start()
    try:
        outcome = supervisor.supervise(
            cmd,
            log_path=workdir / f"node{node_rank}.log",
            cwd=settings.BASE_DIR,
            # CANN_TRAIN_REQUEST_ID: the request that launched it, on the runtime's lifecycle events
            env={**torchrun_env(), **(watch.env if watch is not None else {}), **logs.runtime_env()},
            on_poll=poll if watch is not None else None,
            on_start=lambda pid: _until_the_database_answers(
                lambda: node_started(node=node, pid=pid),
                what=f"record that job {job.pk} node {node_rank} started",
            ),
            on_heartbeat=beat,
            # the heartbeat thread closes its own connection (resolved there: `connection` is per thread)
            after_heartbeats=lambda: connection.close(),
            # the live log: new lines (noise filtered, batched by the supervisor) as events on the job's stream
            on_output=lambda lines: publish(
                job.stream, "event", {"log": lines, "node": node_rank, "attempt": attempt}
            ),
        )
    finally:
        if risk is not None:
            try:
                risk.stop()
            except Exception:  # noqa: BLE001 - the run's outcome is recorded without its last samples
                log.warning(
                    "job %s node %s: the risk watch did not stop cleanly", job.pk, node_rank, exc_info=True
                )
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    report = None
    if watch is not None:
        try:
            watch.finish()  # the last progress the ranks wrote, and the end of the goodput clock
            report = watch.report()
        except Exception:  # noqa: BLE001 - the run's outcome is recorded without it
            log.warning("job %s node %s: no recovery report", job.pk, node_rank, exc_info=True)
    _until_the_database_answers(
        lambda: node_finished(
            node=node,
            exit_code=outcome.exit_code,
            cancelled=outcome.cancelled,
            log_tail=outcome.log_tail,
            summary=summary,
            elastic=report,
        ),
        what=f"record how job {job.pk} node {node_rank} ended",
    )
    return "cancelled" if outcome.cancelled else f"exit {outcome.exit_code}"


# how long a node's supervisor keeps trying to record the end of its run while the database is away
DATABASE_RETRY_S = 300.0


def _until_the_database_answers(write, *, what: str):
    """Run ``write`` (one transaction), retrying on a fresh connection while the database is unreachable (a
    restart takes seconds): the outcome of a run that already happened must not be lost."""
    deadline = time.monotonic() + DATABASE_RETRY_S
    delay = 0.5
    while True:
        close_old_connections()
        try:
            return write()
        except OperationalError:
            if time.monotonic() > deadline:
                raise
            log.warning("database unreachable; will %s again in %.1f s", what, delay, exc_info=True)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


# the run summary's figures that sit beside a plan's prediction
MEASURED_KEYS = (
    "step_time_s",
    "tokens_per_s",
    "loss_first",
    "loss_last",
    "world_size",
    "device",
    "steps",
    "tokens_per_step",
    "strategy",
)


def record_measurement(*, job: TrainingJob) -> None:
    """The knowledge base learns: the measured figures go beside the source plan's prediction."""
    from controlplane.planning.services import plan_record_measurement

    measured = {k: job.measured[k] for k in MEASURED_KEYS if k in job.measured}
    plan_record_measurement(plan=job.source_plan, measured=measured, source=f"job/{job.pk}")


def job_progress_from_events(stream: str, events: list[dict]) -> None:
    """A running job's progress is its newest trained step over the steps it was asked for (the relay
    calls this with every stored batch)."""
    kind, _, pk = stream.partition("/")
    steps = [e["step"] for e in events if e.get("kind") == "train" and isinstance(e.get("step"), int)]
    if kind != "job" or not steps or not pk.isdigit():
        return
    from controlplane.jobs.recovery import settle_worker_lost

    settle_worker_lost(job_id=int(pk), events=events)
    job = TrainingJob.objects.filter(pk=int(pk), state__in=TrainingJob.ACTIVE_STATES).only("config").first()
    total = int((job.config or {}).get("steps") or 0) if job else 0
    if total > 0:
        TrainingJob.objects.filter(pk=job.pk, state__in=TrainingJob.ACTIVE_STATES).update(
            progress=round(min(1.0, max(steps) / total), 4)
        )


def reap_orphans(
    *, now=None, stale_after: timedelta | None = None, node_name: str | None = None, human: str | None = None
) -> list[int]:
    """Settle jobs whose supervising worker stopped sending heartbeats (it died or was stopped), instead of
    leaving them "running" forever. A job that snapshots and has restarts left (``max_restarts``) records a
    ``worker-lost`` fault and resumes from its newest good snapshot as a new attempt; any other is failed,
    saying why it was not resumed, and can be relaunched. A job no supervisor has picked up yet (its node
    tasks wait for a free worker slot) has sent no heartbeat and is left alone. ``node_name`` limits it to
    jobs with a running node of that name (``make run`` stopping its own worker: ``human`` is then its
    reason, and those jobs are failed, not resumed); ``stale_after`` defaults to ``HEARTBEAT_TIMEOUT``.
    Returns the ids it settled. First, without ``node_name``: the elastic jobs that lost one node while
    others go on (``reap_lost_nodes``: not settled, they go on)."""
    from controlplane.jobs.recovery import reap_lost_nodes, resume_after_worker_lost

    now = now or timezone.now()
    if node_name is None:
        reap_lost_nodes(now=now, stale_after=stale_after)
    stale = TrainingJob.objects.filter(
        state__in=TrainingJob.ACTIVE_STATES,
        # a job Slurm / Kubernetes runs lives as long as the scheduler says (controlplane.jobs.external)
        launcher="local",
        heartbeat_at__lt=now - (stale_after or HEARTBEAT_TIMEOUT),
        # only jobs a supervisor picked up: one whose nodes wait in the queue for a worker slot is queued
        nodes__attempt=F("attempts"),
        nodes__heartbeat_at__isnull=False,
    ).distinct()
    if node_name is not None:
        stale = _with_running_node(stale, node_name)
    settled = []
    for job in stale:
        cause = (
            f"The Celery worker supervising this job stopped answering (last heartbeat "
            f"{job.heartbeat_at:%H:%M:%S} UTC); its training processes were stopped with it."
        )
        why_not = ""
        if human is None:  # (a worker stopped on purpose, with its reason, fails its jobs: no resume)
            why_not = resume_after_worker_lost(job_id=job.pk, cause=cause)
            if not why_not:
                settled.append(job.pk)
                continue
        job_fail(
            job_id=job.pk,
            human=human or f"{cause} It was not resumed: {why_not}",
            error="heartbeat timeout",
        )
        settled.append(job.pk)
    return settled


def running_on_node(node_name: str) -> bool:
    """Whether a job still has a running node of that name (its supervisor may be alive or just gone)."""
    return _with_running_node(
        TrainingJob.objects.filter(state__in=TrainingJob.ACTIVE_STATES), node_name
    ).exists()


def _with_running_node(jobs, node_name: str):
    """The jobs whose current attempt has a running node called ``node_name``."""
    return jobs.filter(
        nodes__attempt=F("attempts"), nodes__node_name=node_name, nodes__state=JobState.RUNNING
    ).distinct()


# --- the failure-pattern knowledge base: a team's imported incidents ---------------------------------
MAX_INCIDENT_CSV_CHARS = 1_000_000  # ~20,000 incidents of ~50 characters: a large cluster's years of history
MAX_INCIDENTS_PER_TEAM = 100_000
MAX_LISTED_PROBLEMS = 10
# the times an incident may have: Unix time's start to the year 2100 (a typo guard; the database holds them)
INCIDENT_TIME_RANGE_S = (0.0, 4_102_444_800.0)


def incidents_import(*, team, text: str, source: str, created_by=None) -> dict:
    """Store the incidents of an incident list (CSV ``node,time,kind``, ``workers.reliability.risk.history``)
    for the team. Every problem is a ``ValueError`` naming the line and what is wrong, and nothing is
    stored; an incident the team already has (same node, time and kind) is counted once. Returns what was
    imported: rows, imported, duplicates, and the incidents per pattern."""
    from workers.planner.specs import name_problem
    from workers.reliability.risk.history import incident_rows
    from workers.reliability.risk.patterns import pattern_key

    if len(text) > MAX_INCIDENT_CSV_CHARS:
        raise ValueError(
            f"{source}: {len(text):,} characters, more than the {MAX_INCIDENT_CSV_CHARS:,} one import takes: "
            "split the list"
        )
    rows = incident_rows(text, source=source)
    if not rows:
        raise ValueError(f"{source}: a header but no incident (one line per incident: node,time,kind)")
    problems, incidents = [], {}
    low, high = INCIDENT_TIME_RANGE_S
    for lineno, failure in rows:
        problem = ""
        for what, value in (("node", failure.node), ("kind", failure.kind)):
            if why := name_problem(value):
                problem = f"{what} {why}"
                break
        else:
            if not pattern_key(failure.kind):
                problem = f"kind {failure.kind!r} has no letter or digit"
            elif not low <= failure.time_unix_s < high:
                problem = f"time {failure.time_unix_s:g} (Unix seconds) is not between 1970 and 2100"
        if problem:
            problems.append(f"{source}, line {lineno}: {problem}")
            continue
        when = datetime.fromtimestamp(failure.time_unix_s, UTC)
        incidents.setdefault((failure.node, when, failure.kind), lineno)
    if problems:
        more = len(problems) - MAX_LISTED_PROBLEMS
        listed = problems[:MAX_LISTED_PROBLEMS] + ([f"... and {more} more"] if more > 0 else [])
        raise ValueError("\n".join(listed))

    with transaction.atomic():
        times = [when for _, when, _ in incidents]
        existing = set(
            FailureIncident.objects.filter(
                team=team, occurred_at__gte=min(times), occurred_at__lte=max(times)
            ).values_list("node", "occurred_at", "kind")
        )
        new = {key: lineno for key, lineno in incidents.items() if key not in existing}
        held = FailureIncident.objects.filter(team=team).count()
        if held + len(new) > MAX_INCIDENTS_PER_TEAM:
            raise ValueError(
                f"{source}: {len(new):,} new incidents would make the team's {held + len(new):,}, more than the "
                f"{MAX_INCIDENTS_PER_TEAM:,} it may hold"
            )
        source_name = source[:200]
        FailureIncident.objects.bulk_create(
            [
                FailureIncident(
                    team=team,
                    node=node,
                    occurred_at=when,
                    kind=kind,
                    source=source_name,
                    line=lineno,
                    created_by=created_by,
                )
                for (node, when, kind), lineno in new.items()
            ],
            ignore_conflicts=True,  # a concurrent import of the same list: each incident once
            batch_size=1000,
        )
    per_pattern: dict[str, int] = {}
    for _node, _when, kind in new:
        key = pattern_key(kind)
        per_pattern[key] = per_pattern.get(key, 0) + 1
    return {
        "team": team.slug,
        "source": source_name,
        "rows": len(rows),
        "imported": len(new),
        "duplicates": len(rows) - len(new),
        "patterns": dict(sorted(per_pattern.items(), key=lambda kv: (-kv[1], kv[0]))),
    }
