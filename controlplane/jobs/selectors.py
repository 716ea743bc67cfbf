"""Reads for the job pages: the list rows, one job's history, faults and snapshots, the series the compare
page overlays."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from django.db.models import Count, F, Max, Q, QuerySet

from controlplane.accounts.selectors import scoped
from controlplane.common.models import JobState
from controlplane.jobs.models import NOT_RESTARTS, JobFault, JobSnapshot, TrainingJob
from controlplane.live.models import StreamEvent
from controlplane.live.selectors import stored_events
from controlplane.planning.models import StoredPlan
from workers import planner
from workers.planner.specs import OWN_FAMILY
from workers.planner.warmstart import MeasuredRun
from workers.training import examples

EXAMPLES_DIR = examples.DIR
# events rendered into the detail page; the page pages on through the events API when there are more
HISTORY_PAGE = 5000
# jobs one compare chart overlays
MAX_COMPARED = 5


def jobs_of(user) -> QuerySet[TrainingJob]:
    return scoped(TrainingJob.objects.all(), user).select_related("team")


def job_of(user, pk: int) -> TrainingJob | None:
    """The job when it belongs to one of the user's teams; None for another team's job or no job."""
    return jobs_of(user).filter(pk=pk).first()


def model_label(config: dict) -> str:
    """What a job trains, in a word: its model's name, or the script (module) of a job that runs a user's code."""
    if name := (config.get("model") or {}).get("name"):
        return name
    entry = config.get("entrypoint") or {}
    if entry.get("script"):
        return Path(entry["script"]).name
    return entry.get("module") or "—"


def strategy_short(strategy: dict | None) -> str:
    """``tp1-pp1-dp2-ep1`` (the planner's one short name, ``strategy_short_name``), or ``—`` for a config
    without a (valid) strategy."""
    from workers.planner.specs import SpecError, strategy_short_name

    if not strategy:
        return "—"
    try:
        return strategy_short_name(strategy)
    except SpecError:
        return "—"


# rows the jobs page lists (newest first)
LIST_LIMIT = 200
# steps averaged into a running (or stopped) job's figures: the job page's STEADY_WINDOW (job_series.js)
STEADY_WINDOW = 10
# newest events read per stream to find them (profiled steps and lifecycle events fall in between)
STEADY_TAIL = 4 * STEADY_WINDOW


@dataclass
class SteadyFigures:
    """A job's live figures as its page computes them (``JobSeries`` in job_series.js): the mean step time and
    tokens/s over the latest ``STEADY_WINDOW`` steady steps of the latest run segment, leaving out the
    first step of a segment and profiled steps (a step that does not increase starts a new segment: a
    relaunch, a restart). ``recent`` is that window, so a page can go on from it with live events."""

    last_seq: int = 0
    last_step: int | None = None
    recent: list[tuple[float, float]] = field(default_factory=list)

    def push(self, step: int, values: dict, *, first: bool) -> None:
        if self.last_step is not None and step <= self.last_step:
            self.recent = []
        self.last_step = step
        if not first and not values.get("profiled") and values.get("step_time_s"):
            self.recent.append((values["step_time_s"], values.get("tokens_per_s") or 0.0))
            del self.recent[:-STEADY_WINDOW]

    def mean(self, i: int) -> float | None:
        return sum(r[i] for r in self.recent) / len(self.recent) if self.recent else None


def steady_figures(streams: list[str]) -> dict[str, SteadyFigures]:
    """``SteadyFigures`` of each stream from its newest stored events (two queries for all streams)."""
    if not streams:
        return {}
    newest = dict(
        StreamEvent.objects.filter(stream__in=streams)
        .values("stream")
        .annotate(seq=Max("seq"))
        .values_list("stream", "seq")
    )
    out = {stream: SteadyFigures(last_seq=seq) for stream, seq in newest.items()}
    if not newest:
        return out
    tail = Q()
    for stream, seq in newest.items():
        tail |= Q(stream=stream, seq__gt=seq - STEADY_TAIL)
    train = StreamEvent.objects.filter(tail, kind="train").order_by("stream", "seq")
    previous: dict[str, int | None] = {}
    for stream, step, values in train.values_list("stream", "step", "values"):
        figures = out[stream]
        if stream not in previous:  # the oldest event read: the stream's first step only if nothing is older
            first = newest[stream] <= STEADY_TAIL
        else:
            first = step <= previous[stream]
        previous[stream] = step
        figures.push(step, values or {}, first=first)
    return out


@dataclass(frozen=True)
class JobRow:
    """One line of the job lists (the jobs page, the dashboard): what the template renders and what
    ``GET /api/jobs/rows/`` answers, so the page updates a row from the same figures."""

    job: TrainingJob
    strategy: str
    model: str
    tokens_per_s: float | None
    predicted_step_time_s: float | None
    measured_step_time_s: float | None
    measured_is_final: bool
    step: int | None
    steps: int | None
    steady: SteadyFigures

    @property
    def measured_is_live(self) -> bool:
        """The measured figures are those of a job training now (they move); a stopped job's are the mean of
        its last steady steps before it stopped, not live."""
        return not self.measured_is_final and self.job.state in TrainingJob.ACTIVE_STATES

    @property
    def progress(self) -> float | None:
        """Steps done of the run (1 once it succeeded); None before the first step."""
        if self.job.state == "succeeded":
            return 1.0
        if self.step is None or not self.steps:
            return None
        return min(1.0, self.step / self.steps)

    def as_dict(self) -> dict:
        job = self.job
        return {
            "id": job.pk,
            "name": job.name,
            "team": job.team.name,
            "team_slug": job.team.slug,
            "state": job.state,
            "attempts": job.attempts,
            "model": self.model,
            "strategy": self.strategy,
            "nnodes": job.nnodes,
            "nproc_per_node": job.nproc_per_node,
            "world_size": job.world_size,
            "step": self.step,
            "steps": self.steps,
            "progress": self.progress,
            "tokens_per_s": self.tokens_per_s,
            "predicted_step_time_s": self.predicted_step_time_s,
            "measured_step_time_s": self.measured_step_time_s,
            "measured_is_final": self.measured_is_final,
            "measured_is_live": self.measured_is_live,
            "steady": [list(r) for r in self.steady.recent],
            "last_step": self.steady.last_step,
            "last_seq": self.steady.last_seq,
            "tags": job.tags or [],
            "notes": job.notes,
            "created_at": job.created_at.isoformat(),
            "stream": job.stream,
            "url": f"/jobs/{job.pk}/",
        }


def job_rows(user, limit: int = LIST_LIMIT, ids: list[int] | None = None) -> list[JobRow]:
    """The job lists, newest first: a succeeded job shows its run summary; any other the mean over its
    latest steady steps (the job page's figures). ``ids`` limits them to those jobs."""
    jobs = jobs_of(user)
    if ids is not None:
        jobs = jobs.filter(pk__in=ids)
    jobs = list(jobs[:limit])
    live = steady_figures([j.stream for j in jobs])
    rows = []
    for job in jobs:
        steady = live.get(job.stream) or SteadyFigures()
        final = job.state == "succeeded" and bool(job.measured)
        config = job.config or {}
        steps = config.get("steps")
        rows.append(
            JobRow(
                job=job,
                strategy=strategy_short(config.get("strategy")),
                model=model_label(config),
                tokens_per_s=job.measured.get("tokens_per_s") if final else steady.mean(1),
                predicted_step_time_s=job.predicted_step_time_s,
                measured_step_time_s=job.measured.get("step_time_s") if final else steady.mean(0),
                measured_is_final=final,
                step=steady.last_step,
                steps=(steps + (config.get("start_step") or 0)) if isinstance(steps, int) else None,
                steady=steady,
            )
        )
    return rows


def job_history(job: TrainingJob, limit: int = HISTORY_PAGE) -> list[dict]:
    """The first stored events of the job's stream (the page fetches the rest, then goes live)."""
    return stored_events(job.stream, limit=limit)


def compared_series(jobs: list[TrainingJob]) -> list[dict]:
    """Per job: its ``train`` points (step, loss, tokens/s, and beside each its ``attempt`` and whether
    the step was ``profiled``) from stored events and the last seq of its stream, so the compare page can
    subscribe without duplicating or missing a point, and draw each attempt as its own line."""
    streams = [j.stream for j in jobs]
    last = dict(
        StreamEvent.objects.filter(stream__in=streams)
        .values("stream")
        .annotate(seq=Max("seq"))
        .values_list("stream", "seq")
    )
    keys = ("step", "loss", "tokens_per_s", "attempt", "profiled")
    points: dict[str, dict[str, list]] = {s: {k: [] for k in keys} for s in streams}
    train = (
        StreamEvent.objects.filter(
            Q(kind="train") | Q(kind="event", values__state="queued"), stream__in=streams
        )
        .order_by("stream", "seq")
        .values_list("stream", "kind", "step", "values")
    )
    launches: dict[str, int] = {}
    for stream, kind, step, values in train.iterator(chunk_size=2000):
        if kind == "event":  # a (re)launch: the train events after it are that attempt's
            launches[stream] = values.get("attempt") or launches.get(stream, 0) + 1
            continue
        series = points[stream]
        series["step"].append(step)
        series["loss"].append(values.get("loss"))
        series["tokens_per_s"].append(values.get("tokens_per_s"))
        # events written before they carried their attempt belong to the launch before them
        series["attempt"].append(values.get("attempt") or launches.get(stream) or 1)
        series["profiled"].append(bool(values.get("profiled")))
    return [
        {
            "id": job.pk,
            "name": job.name,
            "stream": job.stream,
            "state": job.state,
            "finished": job.is_finished,
            "attempts": job.attempts,
            "strategy": strategy_short((job.config or {}).get("strategy")),
            "last_seq": last.get(job.stream, 0),
            **points[job.stream],
        }
        for job in jobs
    ]


@cache
def launch_examples() -> dict:
    """The tiny models and strategies of ``workers/training/examples`` the launch form offers."""
    models, strategies, training = {}, {}, {}
    for path in sorted(EXAMPLES_DIR.glob("*.json")):
        spec = json.loads(path.read_text())
        if "num_layers" in spec:
            models[path.stem] = spec
        elif "tp" in spec:
            strategies[path.stem] = spec
        elif "global_batch_size" in spec:
            training = spec
    return {"models": models, "strategies": strategies, "training": training}


def comm_comparisons(job) -> list[dict]:
    """The job's communication-method comparisons, newest first, for its page."""
    return [
        {
            "id": c.pk,
            "state": c.state,
            "request": c.request,
            "result": c.result,
            "error": c.human_readable_error,
            "created_at": c.created_at.isoformat(),
        }
        for c in job.comm_comparisons.order_by("-created_at")[:5]
    ]


NODE_QUEUE_PREFIX = "node."


def online_node_queues(timeout: float = 1.5) -> list[str]:
    """The ``node.<name>`` queues that live Celery workers consume, one per node, sorted."""
    from controlplane.celery import app

    replies = app.control.inspect(timeout=timeout).active_queues() or {}
    names = {
        q["name"] for queues in replies.values() for q in queues if q["name"].startswith(NODE_QUEUE_PREFIX)
    }
    return sorted(names)


def source_plan_of(user, pk: int):
    """A stored plan of one of the user's teams (None otherwise): the plan a job is launched from."""
    return scoped(StoredPlan.objects.all(), user).filter(pk=pk).first()


def active_job_streams() -> list[str]:
    """The streams of jobs not ended, every team's (the relay keeps their counters through a Redis loss)."""
    ids = TrainingJob.objects.exclude(state__in=TrainingJob.TERMINAL_STATES).values_list("pk", flat=True)
    return [f"{TrainingJob.STREAM_KIND}/{pk}" for pk in ids]


def jobs_training_count() -> int:
    """Jobs launching, training or recovering now, every team's (what a calibration of the machine waits for)."""
    return TrainingJob.objects.filter(
        state__in=[JobState.LAUNCHING, JobState.RUNNING, JobState.RECOVERING]
    ).count()


def queue_position(job: TrainingJob) -> int | None:
    """How many launched jobs wait ahead of this one for a worker slot (any team's: they share the
    workers; only the count is shown), or None when the job is not waiting. A job waits from its launch
    until a supervisor picks one of its nodes up."""
    waiting_states = (JobState.QUEUED, JobState.LAUNCHING)
    if job.state not in waiting_states or job.attempts < 1:
        return None
    picked = job.nodes.filter(attempt=job.attempts, heartbeat_at__isnull=False).exists()
    if picked:
        return None
    ahead = (
        TrainingJob.objects.filter(state__in=waiting_states, attempts__gt=0, updated_at__lt=job.updated_at)
        .exclude(nodes__attempt=F("attempts"), nodes__heartbeat_at__isnull=False)
        .exclude(pk=job.pk)
        .distinct()
        .count()
    )
    return ahead


# --- faults and snapshots (elastic recovery) --------------------------------------------------------


def fault_values(fault: JobFault) -> dict:
    """A fault as the API, the page and the events show it."""
    return {
        "id": fault.pk,
        "attempt": fault.attempt,
        "restart": fault.restart,
        "kind": fault.kind,
        "rank": fault.rank,
        "node_rank": fault.node_rank,
        "node_name": fault.node_name or None,
        "step": fault.step,
        "message": fault.message,
        "detected_at": fault.detected_at.isoformat() if fault.detected_at else None,
        "recovered_at": fault.recovered_at.isoformat() if fault.recovered_at else None,
        "resumed_from_step": fault.resumed_from_step,
        "snapshot": fault.snapshot or None,
        "steps_lost": fault.steps_lost,
        "rto_s": fault.rto_s,
    }


def snapshot_values(snapshot: JobSnapshot) -> dict:
    return {
        "name": snapshot.name,
        "attempt": snapshot.attempt,
        "step": snapshot.step,
        "kind": snapshot.kind,
        "bytes_written": snapshot.bytes_written,
        "raw_bytes": snapshot.raw_bytes,
        "base": snapshot.base or None,
        "created_at": snapshot.created_at.isoformat() if snapshot.created_at else None,
        "verified": snapshot.verified,
        "problem": snapshot.problem or None,
        "removed": snapshot.removed,
    }


def _on_disk(job: TrainingJob, name: str) -> str | None:
    """Whether snapshot ``name`` is still in the job's snapshot directory: "present", or "removed" (by
    retention), "corrupt" / "superseded" (set aside by a resume); None where this machine does not see
    the directory (the workers' shared filesystem is elsewhere)."""
    root = (job.config or {}).get("snapshot_dir")
    if not root or not Path(root).is_dir():
        return None
    root = Path(root)
    if (root / name / "manifest.json").is_file():
        return "present"
    for aside in root.glob(f"{name}.*"):
        suffix = aside.name[len(name) + 1 :]
        if suffix and suffix != "partial":
            return suffix
    return "removed"


def snapshot_rows(job: TrainingJob) -> list[dict]:
    """The job's snapshots, newest first, each with where it stands on disk (``on_disk``) and whether it
    can be restored from (``restorable``)."""
    rows = []
    # (sorted here: the API's list prefetches them)
    for snapshot in sorted(job.snapshots.all(), key=lambda s: (s.step, s.name), reverse=True):
        # what this machine sees on disk, else what the supervisor last saw
        where = _on_disk(job, snapshot.name) or ("removed" if snapshot.removed else None)
        rows.append(
            {
                **snapshot_values(snapshot),
                "on_disk": where,
                "restorable": snapshot.verified and where in ("present", None),
            }
        )
    return rows


def restarts_left(job: TrainingJob) -> int:
    """Automatic recoveries the job may still make: ``max_restarts`` minus its faults since the latest
    launch by a person. A ``node-lost`` fault is not counted: the recovery it cost is the torchrun restart of
    the nodes left, which their own watch records (a rank fault) and counts; nor is ``events-lost`` (no
    recovery at all: the train events a Redis lost)."""
    used = (
        JobFault.objects.filter(job=job, attempt__gte=job.restart_budget_from)
        .exclude(kind__in=NOT_RESTARTS)
        .count()
    )
    return max(0, job.max_restarts - used)


def restart_policy(job: TrainingJob) -> dict:
    """What the job does about faults, as its page states it (the snapshot defaults are the runtime's)."""
    from workers.training.config import JobConfig

    defaults = JobConfig.__dataclass_fields__
    config = job.config or {}
    every = int(config.get("snapshot_every") or 0)
    return {
        "max_restarts": job.max_restarts,
        "restarts_left": restarts_left(job),
        "min_nodes": job.min_nodes,
        "max_nodes": job.max_nodes,
        "elastic": job.elastic,
        "hang_timeout_s": job.hang_timeout_s,
        "snapshot_every": every,
        "snapshot_full_every": config.get("snapshot_full_every", defaults["snapshot_full_every"].default)
        if every
        else None,
        "snapshot_delta": config.get("snapshot_delta", defaults["snapshot_delta"].default) if every else None,
        "snapshot_keep": config.get("snapshot_keep", defaults["snapshot_keep"].default) if every else None,
        "snapshot_memory_every": int(config.get("snapshot_memory_every") or 0),
        "inject": config.get("inject") or "",
    }


def one_device_runs(team_id) -> QuerySet[TrainingJob]:
    """The team's succeeded one-rank jobs with a measured run: where a job's elastic index finds its one-device
    baseline (``team_id`` may be an ``OuterRef``: ``detail_cache`` keys a cached detail on them)."""
    return TrainingJob.objects.filter(
        team_id=team_id, state=JobState.SUCCEEDED, nnodes=1, nproc_per_node=1, measured__isnull=False
    )


def elastic_index(job: TrainingJob) -> dict:
    """The job's Elastic Training Index with each factor's inputs, and its maturity level with the criteria
    (``workers.reliability.maturity``), from what the job stored: its measured run, goodput, config and
    faults. The one-device baseline is the team's newest succeeded one-rank job of the same model."""
    from workers.reliability import maturity as m

    config = job.config or {}
    measured = job.measured or {}
    model_name = (config.get("model") or {}).get("name")
    if job.world_size == 1:
        single, source = measured.get("tokens_per_s"), "this job runs on one device: no scaling to measure"
    else:
        baseline = (
            one_device_runs(job.team_id)
            .filter(config__model__name=model_name)
            .order_by("-finished_at")
            .first()
        )
        single = (baseline.measured or {}).get("tokens_per_s") if baseline else None
        source = (
            f"measured by job {baseline.pk} ({baseline.name}) on one device"
            if baseline
            else f"no one-device run of {model_name} in your team's jobs: run it on 1 rank to measure the baseline"
        )
    peak = config.get("peak_tflops")
    factors = [
        m.scaling_efficiency(measured.get("tokens_per_s"), job.world_size, single, source),
        m.goodput_factor(job.goodput),
        m.utilisation(
            measured.get("tflops_per_device"),
            peak,
            "the job's peak_tflops (its plan's device)"
            if peak
            else "no device peak in the job's config (launch from a plan)",
        ),
    ]
    recovered = job.faults.filter(rto_s__isnull=False).count()
    # ran: any attempt started (a job that failed, was cancelled or is being restored ran too; its measured
    # run is only stored when an attempt ends well)
    ran = bool(job.measured) or job.started_at is not None or job.attempts > 1
    return {
        "eti": m.eti(factors),
        "maturity": m.maturity(
            config,
            from_plan=bool(job.source_plan_id or job.plan),
            ran=ran,
            max_restarts=job.max_restarts,
            recovered=recovered,
            green_scheduled=job.green_schedule_id is not None,
        ),
    }


# --- fault risk (workers/reliability/risk_watch.py publishes one risk event per node and sample) --------

RISK_EVENTS_PER_NODE = 12
"""How many of the newest risk events per node are read to find each node's newest one."""


def job_risk(job: TrainingJob) -> dict | None:
    """The job's fault risk now, from the newest ``risk`` event of each node of its current attempt: the
    job's level (its riskiest node's), each node's risk with its flagged ranks and reasons, the flags raised
    in the attempt so far, whether the job is protected (takes snapshots: a failure costs it steps, not the
    run), and the dashboard's ``badge``: ``high`` / ``medium`` when a node is at that level, else
    ``unprotected`` for a job without snapshots, else ``low``; and the prevention actions (warn, snapshot-now,
    with their status and outcome). None before the attempt's first risk event."""
    from workers.reliability.risk.policy import risk_level

    recent = list(
        StreamEvent.objects.filter(stream=job.stream, kind="risk")
        .order_by("-seq")
        .values_list("values", "time")[: RISK_EVENTS_PER_NODE * max(1, job.nnodes or 1)]
    )
    attempt = job.attempts or 1
    nodes: dict[str, dict] = {}
    for values, at in recent:
        if not isinstance(values, dict) or int(values.get("attempt") or 1) != attempt or "action" in values:
            continue  # (an action's event says what was done, not the node's scores)
        name = str(values.get("node"))
        if name in nodes:
            continue
        ranks = [r for r in values.get("ranks") or [] if isinstance(r, dict)]
        nodes[name] = {
            "node": name,
            "node_rank": values.get("node_rank"),
            "risk": values.get("risk"),
            "level": values.get("level"),
            "at": at.isoformat().replace("+00:00", "Z"),
            "flagged": [
                {"rank": r.get("rank"), "reason": r.get("reason")} for r in ranks if r.get("flagged")
            ],
            "straggler": values.get("straggler"),
            "failure": values.get("failure"),
        }
    if not nodes:
        return None
    scored = [n["risk"] for n in nodes.values() if isinstance(n["risk"], int | float)]
    risk = max(scored) if scored else None
    level = risk_level(risk)
    protected = bool(job.snapshots_enabled)
    flags = list(
        StreamEvent.objects.filter(stream=job.stream, kind="risk", values__has_key="flag")
        .order_by("seq")
        .values_list("values", flat=True)[:200]
    )
    actions = list(
        StreamEvent.objects.filter(stream=job.stream, kind="risk", values__has_key="action")
        .order_by("seq")
        .values_list("values", flat=True)[:200]
    )

    def of_attempt(rows: list, key: str) -> list[dict]:
        return [
            v[key] | {"node": v.get("node")}
            for v in rows
            if isinstance(v, dict) and int(v.get("attempt") or 1) == attempt and isinstance(v.get(key), dict)
        ]

    return {
        "risk": risk,
        "level": level,
        "protected": protected,
        "badge": level if level in ("high", "medium") else ("low" if protected else "unprotected"),
        "nodes": sorted(
            nodes.values(), key=lambda n: (n["node_rank"] is None, n["node_rank"] or 0, n["node"])
        ),
        "flags": of_attempt(flags, "flag"),
        "actions": of_attempt(actions, "action"),
    }


# --- what the knowledge base learns from (controlplane/planning/ports.py): runs of its plans ------------

# the latest this many matching runs make the measured expert load (older ones trained older routers)
EXPERT_LOAD_RUNS = 20


def plan_measured_expert_load(*, teams, model_doc: dict | None) -> planner.MeasuredExpertLoad | None:
    """The per-expert load the latest succeeded jobs of ``teams`` (a team or several) measured for this MoE
    model: jobs whose model.json has the same ``name`` and ``moe.num_experts`` and whose run summary holds
    an ``expert_load`` of that many shares; their mean, for the planner's measured routing. None for a
    dense or unnamed model, or when no such job ran (the planner then assumes uniform routing)."""
    from workers.planner.moe import mean_measured_load

    moe = (model_doc or {}).get("moe") or {}
    name, experts = (model_doc or {}).get("name"), moe.get("num_experts")
    if not name or not experts:
        return None
    teams = [teams] if hasattr(teams, "pk") else teams
    jobs = (
        TrainingJob.objects.filter(
            team__in=teams, state=JobState.SUCCEEDED, config__model__name=name, measured__isnull=False
        )
        .order_by("-finished_at", "-pk")
        .only("pk", "config", "measured")
    )
    runs = []
    for job in jobs.iterator():
        load = (job.measured or {}).get("expert_load")
        job_moe = ((job.config or {}).get("model") or {}).get("moe") or {}
        if job_moe.get("num_experts") == experts and isinstance(load, list) and len(load) == experts:
            runs.append((job.pk, load))
            if len(runs) == EXPERT_LOAD_RUNS:
                break
    mean = mean_measured_load([load for _pk, load in runs], experts)
    if mean is None:
        return None
    ids = ", ".join(f"#{pk}" for pk, _load in runs)
    return planner.MeasuredExpertLoad(
        load=mean,
        runs=len(runs),
        source=f"expert_load of succeeded job{'s' if len(runs) > 1 else ''} {ids} ({name!r}, {experts} experts)",
    )


# the latest succeeded runs of stored plans a search's correction factors are computed from
MEASURED_RUNS_LIMIT = 200


def plan_measured_runs(*, team, profile: str) -> list[MeasuredRun]:
    """What the team's succeeded jobs of stored plans on ``profile`` (a device name) measured beside what
    their plan predicted: the step time of the run summary (or, without one, the predicted step time
    scaled by predicted / measured tokens/s). A job that ran on another world size than its plan (an
    elastic job that shrank, a scaled-down launch) measured another layout and is left out."""

    jobs = (
        TrainingJob.objects.filter(
            team=team,
            state=JobState.SUCCEEDED,
            source_plan__isnull=False,
            source_plan__device_name=profile,
            measured__isnull=False,
        )
        .select_related("source_plan")
        .order_by("-finished_at", "-pk")[:MEASURED_RUNS_LIMIT]
    )
    runs = []
    for job in jobs:
        plan, measured = job.source_plan, job.measured or {}
        if measured.get("world_size") not in (None, plan.device_count):
            continue
        predicted = plan.predicted or {}
        step, tokens = predicted.get("step_time_s"), predicted.get("tokens_per_s")
        measured_step = measured.get("step_time_s")
        if not measured_step and step and tokens and measured.get("tokens_per_s"):
            measured_step = step * tokens / measured["tokens_per_s"]
        runs.append(
            MeasuredRun(
                strategy=plan.strategy,
                profile=plan.device_name,
                predicted_step_time_s=step,
                measured_step_time_s=measured_step,
            )
        )
    return [r for r in runs if r.usable]


# --- operators' metrics (controlplane/metrics.py): every team's jobs, read when /metrics is scraped --


def job_counts_by_state() -> list[tuple[str, str, int]]:
    """``(team slug, state, jobs)`` over every team: what an operator's ``/metrics`` counts (no team's view)."""
    return list(
        TrainingJob.objects.order_by()
        .values("team__slug", "state")
        .annotate(n=Count("pk"))
        .values_list("team__slug", "state", "n")
    )


@dataclass(frozen=True)
class JobMetrics:
    """One job's figures for ``/metrics``: the live ones (``None`` unless it is running or recovering) as its
    page shows them (the mean over its latest steady steps), the newest ``mfu`` it reported, its goodput and
    each node's fault risk."""

    job_id: int
    team_slug: str
    state: str
    stream: str
    tokens_per_s: float | None
    step_time_s: float | None
    mfu: float | None
    goodput: float | None
    node_risk: dict[str, float]


def jobs_for_metrics(*, finished_since) -> list[JobMetrics]:
    """The jobs an operator's ``/metrics`` shows one by one, of every team: the active ones and those that
    finished at or after ``finished_since`` (a bounded set of series: old jobs drop out)."""
    jobs = list(
        TrainingJob.objects.filter(
            Q(state__in=TrainingJob.ACTIVE_STATES) | Q(finished_at__gte=finished_since)
        )
        .select_related("team")
        .order_by("pk")
    )
    active = [j for j in jobs if j.state in TrainingJob.ACTIVE_STATES]
    live = steady_figures([j.stream for j in active])
    out = []
    for job in jobs:
        steady = live.get(job.stream) if job in active else None
        latest = (
            StreamEvent.objects.filter(stream=job.stream, kind="train")
            .order_by("-seq")
            .values_list("values", flat=True)
            .first()
            if steady is not None
            else None
        )
        risk = job_risk(job) if job in active else None
        goodput = (job.goodput or {}).get("goodput")
        out.append(
            JobMetrics(
                job_id=job.pk,
                team_slug=job.team.slug,
                state=job.state,
                stream=job.stream,
                tokens_per_s=steady.mean(1) if steady else None,
                step_time_s=steady.mean(0) if steady else None,
                mfu=(latest or {}).get("mfu") if isinstance(latest, dict) else None,
                goodput=goodput if isinstance(goodput, int | float) else None,
                node_risk={
                    n["node"]: float(n["risk"])
                    for n in (risk or {}).get("nodes", [])
                    if isinstance(n.get("risk"), int | float)
                },
            )
        )
    return out


def model_source(job: TrainingJob) -> dict:
    """What a job trains and on what: its model's family (and the Hugging Face checkpoint it starts from), its
    tokenizer and corpus, the tokens it has seen (the newest train event's step x the tokens of a step), its
    newest validation loss, and whether its Hugging Face export is there to download."""
    config = job.config or {}
    model = config.get("model") or {}
    arch = model.get("architecture") or {}
    tokens_per_step = int(model.get("seq_length") or 0) * int(
        (config.get("training") or {}).get("global_batch_size") or 0
    )
    trains = StreamEvent.objects.filter(stream=job.stream, kind="train").order_by("-seq")
    newest = trains.values_list("step", flat=True).first()
    val = next(
        (v for v in trains.filter(values__has_key="val_loss").values_list("values", flat=True)[:1]), None
    )
    export = Path(config["save_hf"]) if config.get("save_hf") else None
    return {
        "family": arch.get("family") or OWN_FAMILY,
        "hf_model": config.get("hf_model"),
        "tokenizer": config.get("tokenizer") or (config.get("hf_model") if config.get("hf_model") else None),
        "data": config.get("data"),
        "data_field": config.get("data_field", "text") if config.get("data") else None,
        "val_fraction": config.get("val_fraction") or 0.0,
        "tokens_per_step": tokens_per_step,
        "tokens_seen": (newest or 0) * tokens_per_step,
        "val_loss": val.get("val_loss") if val else None,
        "export_ready": bool(
            export and (export / "config.json").is_file() and job.state == JobState.SUCCEEDED
        ),
    }
