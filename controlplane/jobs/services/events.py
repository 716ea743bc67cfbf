"""A job's events on its live stream (``job/<id>``) and the team's job list, and the retried database write of
the processes that supervise ranks."""

from __future__ import annotations

import logging
import time

from django.db import OperationalError, close_old_connections

from controlplane.jobs.models import TrainingJob
from controlplane.live.feeds import notify_after_commit
from controlplane.live.services import publish_after_commit

log = logging.getLogger(__name__)


def job_event(job: TrainingJob, values: dict) -> None:
    if "fault" in values or "recovery" in values:
        # the page's "(N left)" follows a fault live: the figure the page rendered, from the same selector
        from controlplane.jobs.selectors import restarts_left

        values = {**values, "restarts_left": restarts_left(job)}
    publish_after_commit(job.stream, "event", values)
    if "state" in values:  # open job lists of the team refresh this row (a new job: add it)
        notify_after_commit("jobs", job.team_id, {"id": job.pk, "state": values["state"]})


# how long a node's supervisor keeps trying to record the end of its run while the database is away
DATABASE_RETRY_S = 300.0


def until_the_database_answers(write, *, what: str):
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
