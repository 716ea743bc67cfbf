"""The job lists' data: tags and notes (PATCH /api/jobs/<id>/, checked, team-scoped), the rows endpoint
(GET /api/jobs/rows/: the live figures a page shows, computed like the job page's), and the team feed
that tells open lists a job changed (a real websocket on the real stack)."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from asgiref.sync import sync_to_async
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db(transaction=True)


def a_job(user, **fields):
    from controlplane.jobs.models import TrainingJob

    defaults = {"name": "run", "config": {"steps": 40, "model": {"name": "tiny"}}}
    return TrainingJob.objects.create(team=user.teams.first(), **{**defaults, **fields})


def train_events(job, steps, *, attempt=None, profiled=(), step_time=lambda s: 0.1, start_seq=1):
    """Stored train events of ``job`` as the relay would have written them; returns the next seq."""
    from django.utils import timezone

    from controlplane.live.models import StreamEvent

    rows = []
    for i, step in enumerate(steps):
        values = {"loss": 5.0, "step_time_s": step_time(step), "tokens_per_s": 1000.0 / step_time(step)}
        if step in profiled:
            values["profiled"] = True
        if attempt is not None:
            values["attempt"] = attempt
        rows.append(
            StreamEvent(
                stream=job.stream,
                seq=start_seq + i,
                time=timezone.now(),
                kind="train",
                step=step,
                values=values,
            )
        )
    StreamEvent.objects.bulk_create(rows)
    return start_seq + len(rows)


# ------------------------------------------------------------------------------------- tags and notes


def test_tags_and_notes_are_set_with_patch_and_listed(alice, api_client):
    job = a_job(alice)
    api = api_client(alice)
    r = api.patch(
        f"/api/jobs/{job.pk}/",
        {"tags": [" baseline ", "lr-sweep", "baseline"], "notes": "first try\nlr 3e-4"},
        format="json",
    )
    assert r.status_code == 200, r.content
    assert r.json()["tags"] == ["baseline", "lr-sweep"]  # trimmed, the repeat dropped
    assert r.json()["notes"] == "first try\nlr 3e-4"
    # only what is sent changes
    assert api.patch(f"/api/jobs/{job.pk}/", {"notes": ""}, format="json").json()["tags"] == [
        "baseline",
        "lr-sweep",
    ]
    row = api.get("/api/jobs/rows/").json()[0]
    assert row["id"] == job.pk and row["tags"] == ["baseline", "lr-sweep"] and row["notes"] == ""
    assert api.get(f"/api/jobs/{job.pk}/").json()["tags"] == ["baseline", "lr-sweep"]


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"tags": [f"t{i}" for i in range(21)]}, "tags", "at most 20"),
        ({"tags": ["x" * 41]}, "tags", "1 to 40"),
        ({"tags": ["ok", "   "]}, "tags", "tag 2 has 0 characters"),
        ({"tags": ["bell\x07"]}, "tags", "U+0007"),
        ({"tags": ["new\nline"]}, "tags", "control characters"),
        ({"tags": [5]}, "tags", "must be a string"),
        ({"tags": "baseline"}, "tags", "list"),
        ({"notes": "x" * 10_001}, "notes", "at most 10,000"),
        ({"notes": "nul\x00byte"}, "notes", "U+0000"),
        ({"notes": ["a list"]}, "notes", "must be a string"),
        ({"tag": ["typo"]}, "tag", "unknown field"),
        ({"name": "renamed"}, "name", "unknown field"),
    ],
)
def test_bad_tags_or_notes_are_a_400_naming_the_field(alice, api_client, body, field, words):
    job = a_job(alice, tags=["keep"], notes="kept")
    r = api_client(alice).patch(f"/api/jobs/{job.pk}/", body, format="json")
    assert r.status_code == 400, r.content
    assert list(r.json()) == [field]
    assert words in " ".join(r.json()[field])
    job.refresh_from_db()
    assert job.tags == ["keep"] and job.notes == "kept" and job.name == "run"


def test_line_breaks_and_tabs_are_fine_in_notes_and_twenty_tags_of_forty_characters_fit(alice, api_client):
    job = a_job(alice)
    tags = [f"{i:02d}" + "x" * 38 for i in range(20)]
    r = api_client(alice).patch(
        f"/api/jobs/{job.pk}/", {"tags": tags, "notes": "a\tb\r\nc" + "n" * 9_994}, format="json"
    )
    assert r.status_code == 200, r.content
    assert r.json()["tags"] == tags and len(r.json()["notes"]) == 10_000


def test_another_teams_job_cannot_be_annotated_or_listed(alice, api_client, make_member):
    job = a_job(alice)
    bob = make_member("bob", "Team B")
    bob_api = api_client(bob)
    assert bob_api.patch(f"/api/jobs/{job.pk}/", {"tags": ["mine"]}, format="json").status_code == 404
    assert bob_api.get("/api/jobs/rows/").json() == []
    assert bob_api.get(f"/api/jobs/rows/?ids={job.pk}").json() == []
    assert APIClient().get("/api/jobs/rows/").status_code in (401, 403)
    job.refresh_from_db()
    assert job.tags == []


def test_put_is_not_a_way_to_rewrite_a_job(alice, api_client):
    job = a_job(alice)
    assert api_client(alice).put(f"/api/jobs/{job.pk}/", {"tags": []}, format="json").status_code == 405


# -------------------------------------------------------------------------------------------- rows


def test_rows_of_a_stopped_job_are_the_mean_of_its_latest_steady_steps(alice, api_client):
    """What the job page shows for a job without a run summary: the mean over the latest 10 steady steps
    of its latest run segment, leaving out the segment's first step and profiled steps."""
    job = a_job(alice, state="cancelled")
    # attempt 1: steps 1-30 at 0.1 s; attempt 2 (a relaunch) starts over: steps 1-8, step 5 profiled (slow)
    seq = train_events(job, range(1, 31), attempt=1)
    train_events(
        job,
        range(1, 9),
        attempt=2,
        profiled={5},
        step_time=lambda s: 9.0 if s in (1, 5) else 0.2 + 0.01 * s,
        start_seq=seq,
    )
    row = api_client(alice).get(f"/api/jobs/rows/?ids={job.pk}").json()[0]
    steady = [
        0.2 + 0.01 * s for s in (2, 3, 4, 6, 7, 8)
    ]  # attempt 2 only, without its first and profiled step
    assert row["measured_step_time_s"] == pytest.approx(sum(steady) / len(steady))
    assert row["tokens_per_s"] == pytest.approx(sum(1000.0 / s for s in steady) / len(steady))
    assert row["measured_is_final"] is False
    assert row["step"] == 8 and row["steps"] == 40 and row["progress"] == pytest.approx(8 / 40)
    assert [r[0] for r in row["steady"]] == pytest.approx(steady)  # the window a page goes on from
    assert row["last_seq"] == 38 and row["last_step"] == 8


def test_rows_of_a_long_running_job_average_its_last_ten_steady_steps(alice, api_client):
    job = a_job(alice, state="running", config={"steps": 1000})
    train_events(job, range(1, 101), step_time=lambda s: 0.01 * s)
    row = api_client(alice).get("/api/jobs/rows/").json()[0]
    assert row["measured_step_time_s"] == pytest.approx(0.01 * sum(range(91, 101)) / 10)
    assert row["progress"] == pytest.approx(0.1) and row["last_seq"] == 100


def test_rows_of_a_succeeded_job_are_its_run_summary(alice, api_client):
    job = a_job(
        alice, state="succeeded", measured={"step_time_s": 0.123, "tokens_per_s": 4567.0, "steps": 40}
    )
    train_events(job, range(1, 41))
    row = api_client(alice).get("/api/jobs/rows/").json()[0]
    assert row["measured_step_time_s"] == 0.123 and row["tokens_per_s"] == 4567.0
    assert row["measured_is_final"] is True and row["progress"] == 1.0


def test_rows_query_is_checked(alice, api_client):
    a_job(alice)
    api = api_client(alice)
    assert list(api.get("/api/jobs/rows/?ids=1,x").json()) == ["ids"]
    assert list(api.get("/api/jobs/rows/?limit=0").json()) == ["limit"]
    ids = ",".join(str(i) for i in range(1, 202))
    assert "at most 200" in api.get(f"/api/jobs/rows/?ids={ids}").json()["ids"][0]


# -------------------------------------------------------------------------------------- team feed


async def recv_json(ws, timeout=10.0):
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


@pytest.mark.slow
async def test_a_watching_socket_hears_of_its_teams_jobs_only(live_stack, make_member, token_for):
    from controlplane.jobs.services import job_annotate, job_cancel

    alice = await sync_to_async(make_member)("alice", "Team A")
    bob = await sync_to_async(make_member)("bob", "Team B")
    alice_token = await sync_to_async(token_for)(alice)
    bob_token = await sync_to_async(token_for)(bob)
    job = await sync_to_async(a_job)(alice)

    def connect(token):
        return websockets.connect(live_stack.ws_url, additional_headers={"Authorization": f"Token {token}"})

    async with connect(alice_token) as ws_a, connect(bob_token) as ws_b:
        for ws in (ws_a, ws_b):
            await ws.send(json.dumps({"action": "watch", "feed": "jobs"}))
            assert await recv_json(ws) == {"type": "watching", "feed": "jobs"}
        await sync_to_async(job_cancel)(job=job)  # queued -> cancelled: a state change
        assert await recv_json(ws_a) == {"type": "notice", "feed": "jobs", "id": job.pk, "state": "cancelled"}
        await sync_to_async(job_annotate)(job=job, tags=["a"])
        notice = await recv_json(ws_a)
        assert notice["id"] == job.pk and notice["annotated"] == ["tags"]
        with pytest.raises(TimeoutError):
            await recv_json(ws_b, timeout=2)  # nothing of Team A's reaches Team B

        await ws_a.send(json.dumps({"action": "watch", "feed": "everything"}))
        bad = await recv_json(ws_a)
        assert bad["type"] == "error" and bad["code"] == "bad_request" and "jobs" in bad["message"]
