"""The job pages as Django renders them: team scoping, the compare page's validation, the history a
detail page starts from. The live behaviour is in tests/browser/test_job_pages.py (this file has its
own basename: the test directories are not packages, so two test_job_pages.py would collide)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from controlplane.jobs.models import TrainingJob
from controlplane.live.models import StreamEvent
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

DP2 = {"tp": 1, "pp": 1, "dp": 2, "ep": 1, "cp": 1, "vpp": 1, "micro_batch_size": 2}


def make_job(user, name="run", **fields) -> TrainingJob:
    config = {"model": {"name": "tiny-dense"}, "strategy": DP2, "steps": 4, "device": "cpu"}
    return TrainingJob.objects.create(team=user.teams.first(), name=name, config=config, **fields)


def store_train_events(job: TrainingJob, losses: list[float]) -> None:
    now = datetime.now(UTC)
    rows = [StreamEvent(stream=job.stream, seq=1, time=now, kind="event", values={"state": "queued"})]
    for i, loss in enumerate(losses, start=1):
        values = {"loss": loss, "tokens_per_s": 1000.0 + i, "step_time_s": 0.1, "bubble_fraction": 0.0}
        rows.append(StreamEvent(stream=job.stream, seq=i + 1, time=now, kind="train", step=i, values=values))
    StreamEvent.objects.bulk_create(rows)


@pytest.fixture
def alice(make_member, client):
    user = make_member("alice", "Team A")
    client.login(username="alice", password=PASSWORD)
    return user


def test_another_teams_job_page_is_a_404(alice, make_member, client):
    bob = make_member("bob", "Team B")
    theirs = make_job(bob, name="bobs-run")
    mine = make_job(alice, name="alices-run")
    assert client.get(f"/jobs/{theirs.pk}/").status_code == 404
    assert client.get("/jobs/999999/").status_code == 404
    r = client.get(f"/jobs/{mine.pk}/")
    assert r.status_code == 200 and b"alices-run" in r.content
    listing = client.get("/jobs/").content.decode()
    assert "alices-run" in listing and "bobs-run" not in listing
    r = client.get(f"/jobs/compare/?ids={mine.pk},{theirs.pk}")
    assert r.status_code == 400 and f"No job #{theirs.pk} among your teams" in r.content.decode()


def test_pages_need_a_login(client):
    for url in ("/jobs/", "/jobs/1/", "/jobs/compare/?ids=1"):
        r = client.get(url)
        assert r.status_code == 302 and "/login/" in r["Location"]


@pytest.mark.parametrize(
    "ids, message",
    [
        ("1,2,3,4,5,6", "Compare at most 5 jobs at once; you picked 6."),
        ("1,two", "Job ids are whole numbers separated by commas; &#x27;two&#x27; is not."),
        ("-1", "Job ids are whole numbers"),
        (",,", "Pick at least one job to compare."),
        ("1;DROP TABLE", "Job ids are whole numbers"),
    ],
)
def test_compare_rejects_bad_ids_with_a_clear_message(alice, client, ids, message):
    jobs = [make_job(alice, name=f"run-{i}") for i in range(6)]
    if ids.startswith("1,2"):
        ids = ",".join(str(j.pk) for j in jobs)
    r = client.get("/jobs/compare/", {"ids": ids})
    assert r.status_code == 400
    assert message in r.content.decode()


def test_compare_overlays_the_stored_series_of_two_jobs(alice, client):
    a, b = make_job(alice, name="run-a"), make_job(alice, name="run-b")
    store_train_events(a, [5.0, 4.0, 3.0])
    store_train_events(b, [5.5, 5.0])
    r = client.get(f"/jobs/compare/?ids={a.pk},{b.pk}")
    assert r.status_code == 200
    series = r.context["series"]
    assert [s["id"] for s in series] == [a.pk, b.pk]
    assert series[0]["step"] == [1, 2, 3] and series[0]["loss"] == [5.0, 4.0, 3.0]
    assert series[1]["last_seq"] == 3 and series[1]["strategy"] == "tp1-pp1-dp2-ep1"
    assert 'id="compare-series"' in r.content.decode()
    # no ids at all: the empty form, not an error
    assert client.get("/jobs/compare/").status_code == 200


def test_detail_page_starts_from_the_stored_history(alice, client):
    plan = {"strategy": DP2, "predicted": {"step_time_s": 0.25, "tokens_per_s": 512.0}}
    job = make_job(alice, name="planned", plan=plan, state="running", attempts=1)
    store_train_events(job, [5.0, 4.5])
    r = client.get(f"/jobs/{job.pk}/")
    html = r.content.decode()
    page = json.loads(html.split('<script id="job-page" type="application/json">')[1].split("</script>")[0])
    assert page["stream"] == job.stream and page["plan_predicted"]["step_time_s"] == 0.25
    assert [e["seq"] for e in page["history"]] == [1, 2, 3] and page["history_complete"] is True
    assert page["moe"] is False and 'id="chart-experts"' not in html
    assert "tp1-pp1-dp2-ep1" in html and 'id="cancel-button"' in html


def test_list_shows_predicted_and_measured_step_time(alice, client):
    plan = {"strategy": DP2, "predicted": {"step_time_s": 0.125}}
    done = make_job(
        alice,
        name="done",
        plan=plan,
        state="succeeded",
        measured={"step_time_s": 0.5, "tokens_per_s": 2048.0},
    )
    running = make_job(alice, name="live", state="running")
    store_train_events(running, [5.0, 4.0])
    rows = {row.job.pk: row for row in client.get("/jobs/").context["rows"]}
    assert rows[done.pk].predicted_step_time_s == 0.125 and rows[done.pk].measured_step_time_s == 0.5
    assert rows[done.pk].measured_is_final and rows[done.pk].tokens_per_s == 2048.0
    assert rows[running.pk].tokens_per_s == 1002.0 and not rows[running.pk].measured_is_final
    assert rows[running.pk].strategy == "tp1-pp1-dp2-ep1"
    assert rows[running.pk].measured_is_live and not rows[done.pk].measured_is_live


def test_a_stopped_job_is_not_shown_live(alice, client):
    """Issue 35: a cancelled job showed "(live)" beside the mean of the steps it trained before it stopped."""
    running = make_job(alice, name="training", state="running")
    stopped = make_job(alice, name="stopped", state="cancelled")
    for job in (running, stopped):
        store_train_events(job, [5.0, 4.0])
    html = client.get("/jobs/").content.decode()
    cells = {name: html.split(f">{name}<")[1].split("</tr>")[0] for name in ("training", "stopped")}
    assert "(live)" in cells["training"] and "(last steps)" not in cells["training"]
    assert "(live)" not in cells["stopped"] and "(last steps)" in cells["stopped"]
    rows = {r["id"]: r for r in client.get("/api/jobs/rows/").json()}
    assert rows[running.pk]["measured_is_live"] and not rows[stopped.pk]["measured_is_live"]


def test_compare_with_an_id_too_long_for_the_database_is_a_form_error(client, django_user_model):
    from controlplane.accounts.models import Membership, Team

    user = django_user_model.objects.create_user(username="zed", password="pw-zed-123")
    Membership.objects.create(team=Team.objects.create(name="Z", slug="z"), user=user)
    client.force_login(user)
    r = client.get("/jobs/compare/?ids=99999999999999999999999")
    assert r.status_code == 400 and b"whole numbers" in r.content
