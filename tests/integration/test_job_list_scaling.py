"""``GET /api/jobs/`` lists jobs from their own rows: a compact row per job (its stored figures and a link to
the detail), in a number of database queries that does not grow with the jobs on the page (a row used to be the
whole detail, computed from the job's events: ~10 ms and ~10 KB a job, 3.3 lists a second at 50 users)."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.django_db

STEPS = 50


def _finished_jobs(team, count: int) -> list:
    from django.utils import timezone

    from controlplane.jobs.models import TrainingJob
    from controlplane.live.models import StreamEvent

    now = timezone.now()
    jobs = []
    for j in range(count):
        job = TrainingJob.objects.create(
            team=team, name=f"run {j}", config={"steps": STEPS}, nproc_per_node=2, attempts=1, state="succeeded",
            progress=1.0, finished_at=now,
            measured={"steps": STEPS, "tokens_per_s": 5200.0 + j, "loss_last": 2.5, "losses": [2.5] * STEPS},
        )  # fmt: skip
        StreamEvent.objects.bulk_create(
            StreamEvent(stream=job.stream, seq=s, time=now, kind="train", step=s, values={"attempt": 1, "loss": 2.5})
            for s in range(1, STEPS + 1)
        )  # fmt: skip
        jobs.append(job)
    return jobs


def _list(client, limit: int = 20):
    with CaptureQueriesContext(connection) as queries:
        r = client.get(f"/api/jobs/?limit={limit}")
    assert r.status_code == 200, r.content
    return r.json(), len(queries), len(r.content)


def test_a_list_row_is_the_jobs_own_figures_and_a_link_to_its_detail(alice_api, alice):
    [job] = _finished_jobs(alice.teams.first(), 1)
    page, _, _ = _list(alice_api)
    [row] = page["results"]
    assert row["id"] == job.pk and row["state"] == "succeeded" and row["url"] == f"/api/jobs/{job.pk}/"
    assert row["figures"] == {"steps": STEPS, "tokens_per_s": 5200.0, "loss_last": 2.5}  # no arrays
    assert "config" not in row and "energy" not in row and "log_tail" not in row
    detail = alice_api.get(row["url"]).json()
    assert detail["measured"]["losses"] == [2.5] * STEPS and "energy" in detail and "risk" in detail


def test_the_lists_queries_do_not_grow_with_the_jobs_on_the_page(alice_api, alice):
    team = alice.teams.first()
    _finished_jobs(team, 2)
    _, few, _ = _list(alice_api)
    _finished_jobs(team, 18)
    page, many, size = _list(alice_api)
    assert len(page["results"]) == 20
    assert many == few, f"{few} queries for 2 jobs, {many} for 20"
    assert size / 20 < 1500, f"{size / 20:.0f} bytes a row"
    assert json.dumps(page["results"][0]).count("losses") == 0
