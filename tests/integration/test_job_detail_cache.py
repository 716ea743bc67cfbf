"""An ended job's detail and list row come from the cache while nothing about the job changed (issue 36, item
7: a dozen queries per detail were the API's bottleneck), and never once something did: its tags, a fault
recorded after its end (in its rows before its event is stored), an event stored on its stream, a relaunch.
A job not ended is computed on every request; a list row is kept while the job's row is unchanged."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

pytestmark = [pytest.mark.django_db]


def ended_job(team, **fields):
    from controlplane.common.models import JobState
    from controlplane.jobs.models import TrainingJob

    return TrainingJob.objects.create(
        team=team, name="ended", config={"steps": 3}, state=JobState.SUCCEEDED, attempts=1,
        finished_at=timezone.now(), measured={"steps": 3, "tokens_per_s": 100.0}, **fields,
    )  # fmt: skip


def detail(client, job) -> tuple[dict, int]:
    with CaptureQueriesContext(connection) as queries:
        r = client.get(f"/api/jobs/{job.pk}/")
    assert r.status_code == 200, r.content
    return r.json(), len(queries)


def test_an_ended_jobs_detail_is_kept_until_something_about_it_changes(alice, alice_api, bob, api_client):
    from controlplane.jobs.models import JobFault
    from controlplane.live.models import StreamEvent

    cache.clear()
    job = ended_job(alice.teams.first())
    first, computed = detail(alice_api, job)
    again, kept = detail(alice_api, job)
    assert again == first and kept < computed and kept <= 3, (kept, computed)
    # another team's job stays a 404 like no job, cached or not
    assert api_client(bob).get(f"/api/jobs/{job.pk}/").status_code == 404

    r = alice_api.patch(f"/api/jobs/{job.pk}/", {"tags": ["kept"]}, format="json")
    assert r.status_code == 200
    assert detail(alice_api, job)[0]["tags"] == ["kept"]

    JobFault.objects.create(
        job=job, attempt=1, kind="events-lost", message="2 of 3", detected_at=timezone.now()
    )
    assert [f["kind"] for f in detail(alice_api, job)[0]["faults"]] == ["events-lost"]

    StreamEvent.objects.create(stream=job.stream, seq=1, time=timezone.now(), kind="energy", step=3,
                               values={"attempt": 1, "kwh": 0.5, "kwh_it": 0.4, "kgco2e": 0.1, "tokens": 9})  # fmt: skip
    assert detail(alice_api, job)[0]["energy"]["kwh"] == 0.5


def test_a_running_jobs_detail_and_row_are_computed_every_time(alice, alice_api):
    from controlplane.common.models import JobState
    from controlplane.jobs.models import TrainingJob

    cache.clear()
    job = ended_job(
        alice.teams.first(),
    )
    TrainingJob.objects.filter(pk=job.pk).update(state=JobState.RUNNING, finished_at=None)
    job.refresh_from_db()
    detail(alice_api, job)
    TrainingJob.objects.filter(pk=job.pk).update(progress=0.5)  # no updated_at: a heartbeat-like write
    assert detail(alice_api, job)[0]["progress"] == 0.5
    assert alice_api.get("/api/jobs/").json()["results"][0]["progress"] == 0.5


def test_an_ended_jobs_list_row_is_kept_while_its_row_is_unchanged(alice, alice_api):
    cache.clear()
    job = ended_job(alice.teams.first())
    rows = alice_api.get("/api/jobs/?limit=20").json()["results"]
    assert [r["id"] for r in rows] == [job.pk] and rows[0]["figures"]["tokens_per_s"] == 100.0
    with CaptureQueriesContext(connection) as queries:
        assert alice_api.get("/api/jobs/?limit=20").json()["results"] == rows
    assert len(queries) <= 3
    # the page is read as its heads: the kept row's job is not loaded (a wide row costs more than its row)
    assert not any('"jobs_trainingjob"."name"' in q["sql"] for q in queries), [q["sql"] for q in queries]
    alice_api.patch(f"/api/jobs/{job.pk}/", {"tags": ["renamed"]}, format="json")
    assert alice_api.get("/api/jobs/?limit=20").json()["results"][0]["tags"] == ["renamed"]


def test_a_kept_details_elastic_index_follows_the_teams_one_device_baseline(alice, alice_api):
    """The index's scaling factor compares the job with the team's newest one-device run of its model: a
    kept detail changes when such a run appears, and when it stops being one (relaunched)."""
    import json

    from controlplane.common.models import JobState
    from controlplane.jobs.models import TrainingJob

    cache.clear()
    team = alice.teams.first()
    model = {"model": {"name": "tiny-dense"}, "steps": 3}
    job = ended_job(team, nnodes=1, nproc_per_node=2)
    TrainingJob.objects.filter(pk=job.pk).update(config=model)
    scaling = lambda: json.dumps(detail(alice_api, job)[0]["elastic_index"])  # noqa: E731
    assert "no one-device run of tiny-dense" in scaling()
    assert "no one-device run of tiny-dense" in scaling()  # kept
    single = ended_job(team, nnodes=1, nproc_per_node=1)
    TrainingJob.objects.filter(pk=single.pk).update(config=model)
    assert f"measured by job {single.pk}" in scaling()
    TrainingJob.objects.filter(pk=single.pk).update(state=JobState.QUEUED)  # relaunched: no updated_at move
    assert "no one-device run of tiny-dense" in scaling()
