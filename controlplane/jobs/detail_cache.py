"""The API's detail and list rows of ended jobs, kept in Django's cache (per process) until something about
the job changes (issue 36, item 7): an ended job's detail is a dozen queries (faults, snapshots, nodes,
energy, three risk reads, ...) that give the same answer every time, and lists of ended jobs are what
dashboards poll. The key holds the job's ``updated_at`` (a state change, a relaunch, tags and notes), the
newest ``seq`` of its stream and its faults' and snapshots' counts (a fault recorded after the end, the
delivery audit), read with the job in one query, so a changed job is never answered from the cache;
``row_cache.TTL_S`` bounds anything else. A job not ended is computed on every request (it changes by the
second); the elastic index, which rests on the team's other runs too, is computed apart on every request
(``TrainingJobViewSet.retrieve``). A list row is the job's own columns: an ended job's is kept under its
``updated_at`` alone."""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import CharField, Count, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Cast, Concat

from controlplane.common.row_cache import cached_rows
from controlplane.jobs.models import JobFault, JobSnapshot, TrainingJob
from controlplane.live.models import StreamEvent


def with_versions(jobs: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
    """``jobs`` with what a detail's key needs beside the row, in the same query: the newest seq of each one's
    stream, and how many faults and snapshots it has (a fault recorded after the end is in its rows before its
    event is stored)."""
    stream = Concat(Value(f"{TrainingJob.STREAM_KIND}/"), Cast(OuterRef("pk"), CharField()))
    return jobs.annotate(
        version_seq=Subquery(StreamEvent.objects.filter(stream=stream).order_by("-seq").values("seq")[:1]),
        version_faults=Subquery(_count(JobFault.objects.filter(job=OuterRef("pk")))),
        version_snapshots=Subquery(_count(JobSnapshot.objects.filter(job=OuterRef("pk")))),
    )


def _count(rows: QuerySet):
    return rows.order_by().values("job").annotate(n=Count("pk")).values("n")


def detail_key(job: TrainingJob) -> str | None:
    """The cache key of ``job``'s detail as it is now (``job`` from :func:`with_versions`); None for a job
    not ended."""
    if not job.is_finished:
        return None
    versions = (job.version_seq or 0, job.version_faults or 0, job.version_snapshots or 0)
    return f"job-detail:{job.pk}:{job.updated_at.timestamp()}:" + ":".join(map(str, versions))


def cached_detail(job: TrainingJob, build: Callable[[], dict]) -> dict:
    """``build()`` of an ended job, from the cache while nothing about the job changed."""
    return cached_rows([job], detail_key, lambda jobs: [build() for _ in jobs])[0]


def row_key(job) -> str | None:
    """An ended job's list row is its own columns: kept under its ``updated_at``. ``job``: the job, or its
    head (``pk``, ``updated_at`` and ``state``: :data:`LIST_HEAD`)."""
    if job.state not in TrainingJob.TERMINAL_STATES:
        return None
    return f"job-row:{job.pk}:{job.updated_at.timestamp()}"


LIST_HEAD = ("pk", "updated_at", "state")
"""The columns a job list reads first: enough to find its kept rows (:func:`row_key`)."""
