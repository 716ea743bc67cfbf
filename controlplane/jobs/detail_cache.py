"""The API's detail and list rows of ended jobs, kept in Django's cache (per process) until something about
the job changes (issue 36, item 7): an ended job's detail is a dozen queries (faults, snapshots, nodes,
energy, three risk reads, ...) that give the same answer every time, and lists of ended jobs are what
dashboards poll. The key holds the job's ``updated_at`` (a state change, a relaunch, tags and notes), the
newest ``seq`` of its stream and its faults' and snapshots' counts (a fault recorded after the end, the
delivery audit), read with the job in one query, so a changed job is never answered from the cache;
``row_cache.TTL_S`` bounds anything else. The elastic index rests on the team's one-device runs too (its
baseline): the key also holds how many the team has and the newest change among them. A job not ended is
computed on every request (it changes by the second). A list row is the job's own columns: an ended job's is
kept under its ``updated_at`` alone."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.db import connection
from django.db.models import CharField, Count, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Cast, Concat

from controlplane.common.row_cache import cached_rows
from controlplane.jobs.models import JobFault, JobSnapshot, TrainingJob
from controlplane.jobs.selectors import one_device_runs
from controlplane.live.models import StreamEvent


def with_versions(jobs: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
    """``jobs`` with what a detail's key needs beside the row, in the same query: the newest seq of each one's
    stream, and how many faults and snapshots it has (a fault recorded after the end is in its rows before its
    event is stored)."""
    stream = Concat(Value(f"{TrainingJob.STREAM_KIND}/"), Cast(OuterRef("pk"), CharField()))
    baselines = one_device_runs(OuterRef("team_id"))
    return jobs.annotate(
        version_seq=Subquery(StreamEvent.objects.filter(stream=stream).order_by("-seq").values("seq")[:1]),
        version_faults=Subquery(_count(JobFault.objects.filter(job=OuterRef("pk")))),
        version_snapshots=Subquery(_count(JobSnapshot.objects.filter(job=OuterRef("pk")))),
        # the elastic index's one-device baseline is the team's: how many candidates, and the newest change
        version_baselines=Subquery(_count(baselines, "team")),
        # (as the database writes it: the same text however the row is read)
        version_baseline_at=Subquery(
            baselines.order_by("-updated_at").annotate(at=Cast("updated_at", CharField())).values("at")[:1]
        ),
    )


# Django compiles a queryset's SQL each time it runs it: 3.5 ms for the detail's (its five subqueries and the
# team scope), which runs in 0.2 ms. The detail's is compiled once per process, with marks where the job's
# and the user's ids go, and run as a raw query (the same SQL, the same columns).
_PK_MARK, _USER_MARK = -7_340_001, -7_340_002


@functools.cache
def _detail_query(vendor: str) -> tuple[str, tuple, int, int]:
    from controlplane.accounts.models import Team

    teams = Team.objects.filter(memberships__user_id=_USER_MARK).values("id")
    sql, params = (
        with_versions(TrainingJob.objects.filter(team_id__in=teams))
        .filter(pk=_PK_MARK)
        .query.sql_with_params()
    )
    at_pk, at_user = (
        [i for i, p in enumerate(params) if p == _PK_MARK],
        [i for i, p in enumerate(params) if p == _USER_MARK],
    )
    if len(at_pk) != 1 or len(at_user) != 1:  # pragma: no cover - the marks are this module's own numbers
        raise RuntimeError("the detail query's parameters did not hold one mark each")
    return sql, tuple(params), at_pk[0], at_user[0]


def job_with_versions(pk: int, user) -> TrainingJob | None:
    """Job ``pk`` of ``user``'s teams with its versions (:func:`with_versions`), or None: the query
    :func:`with_versions` and ``accounts.selectors.scoped`` make, compiled once."""
    sql, params, at_pk, at_user = _detail_query(connection.vendor)
    values = list(params)
    values[at_pk], values[at_user] = int(pk), user.pk
    return next(iter(TrainingJob.objects.raw(sql, values)), None)


def _count(rows: QuerySet, by: str = "job"):
    return rows.order_by().values(by).annotate(n=Count("pk")).values("n")


def detail_key(job: TrainingJob) -> str | None:
    """The cache key of ``job``'s detail as it is now (``job`` from :func:`with_versions`); None for a job
    not ended."""
    if not job.is_finished:
        return None
    versions = (
        job.version_seq or 0,
        job.version_faults or 0,
        job.version_snapshots or 0,
        job.version_baselines or 0,
        (job.version_baseline_at or "").replace(" ", "T"),  # (a cache key has no spaces)
    )
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
