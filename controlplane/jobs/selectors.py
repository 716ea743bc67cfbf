"""Reads for the job pages: the list rows, one job's history, the series the compare page overlays."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from django.db.models import Max, QuerySet

from controlplane.accounts.selectors import scoped
from controlplane.jobs.models import TrainingJob
from controlplane.live.models import StreamEvent
from controlplane.live.selectors import stored_events
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


def latest_train_values(streams: list[str]) -> dict[str, dict]:
    """The values of the newest ``train`` event of each stream (one query for the latest seqs)."""
    if not streams:
        return {}
    newest = (
        StreamEvent.objects.filter(stream__in=streams, kind="train")
        .values("stream")
        .annotate(seq=Max("seq"))
        .values_list("stream", "seq")
    )
    pairs = list(newest)
    if not pairs:
        return {}
    rows = StreamEvent.objects.filter(stream__in=[s for s, _ in pairs], seq__in=[q for _, q in pairs])
    wanted = set(pairs)
    return {row.stream: row.values for row in rows if (row.stream, row.seq) in wanted}


@dataclass(frozen=True)
class JobRow:
    """One line of the job list."""

    job: TrainingJob
    strategy: str
    model: str
    tokens_per_s: float | None
    predicted_step_time_s: float | None
    measured_step_time_s: float | None
    measured_is_final: bool


def job_rows(user, limit: int = 200) -> list[JobRow]:
    """The list page: finished jobs show their run summary; running ones their latest step."""
    jobs = list(jobs_of(user)[:limit])
    live = latest_train_values([j.stream for j in jobs if not j.measured])
    rows = []
    for job in jobs:
        final = bool(job.measured)
        figures = job.measured or live.get(job.stream) or {}
        rows.append(
            JobRow(
                job=job,
                strategy=strategy_short((job.config or {}).get("strategy")),
                model=((job.config or {}).get("model") or {}).get("name") or "—",
                tokens_per_s=figures.get("tokens_per_s"),
                predicted_step_time_s=job.predicted_step_time_s,
                measured_step_time_s=figures.get("step_time_s"),
                measured_is_final=final,
            )
        )
    return rows


def job_history(job: TrainingJob, limit: int = HISTORY_PAGE) -> list[dict]:
    """The first stored events of the job's stream (the page fetches the rest, then goes live)."""
    return stored_events(job.stream, limit=limit)


def compared_series(jobs: list[TrainingJob]) -> list[dict]:
    """Per job: its ``train`` points (step, loss, tokens/s) from stored events and the last seq of its
    stream, so the compare page can subscribe without duplicating or missing a point."""
    streams = [j.stream for j in jobs]
    last = dict(
        StreamEvent.objects.filter(stream__in=streams)
        .values("stream")
        .annotate(seq=Max("seq"))
        .values_list("stream", "seq")
    )
    points: dict[str, dict[str, list]] = {s: {"step": [], "loss": [], "tokens_per_s": []} for s in streams}
    train = (
        StreamEvent.objects.filter(stream__in=streams, kind="train")
        .order_by("stream", "seq")
        .values_list("stream", "step", "values")
    )
    for stream, step, values in train.iterator(chunk_size=2000):
        series = points[stream]
        series["step"].append(step)
        series["loss"].append(values.get("loss"))
        series["tokens_per_s"].append(values.get("tokens_per_s"))
    return [
        {
            "id": job.pk,
            "name": job.name,
            "stream": job.stream,
            "state": job.state,
            "finished": job.is_finished,
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
    from controlplane.planning.models import StoredPlan

    return scoped(StoredPlan.objects.all(), user).filter(pk=pk).first()
