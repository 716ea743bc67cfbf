"""Jobs that run under a carbon-aware schedule: they wait in ``scheduled``, start when a slot opens, an
interruptible one pauses at the end of its slot and continues from its snapshot at the next, and its energy
report carries the schedule's predicted saving. Bad requests are 400s that say what to fix.

The relay's tick runs with the real time; the schedules here lie a day ahead, so it leaves them alone, and
the tests step through their slots by calling the same tick functions with the slots' times."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.jobs.slots import due_slot, next_slot
from tests.conftest import http
from tests.integration.test_jobs import job_payload, wait_for_state

pytestmark = [pytest.mark.django_db(transaction=True)]

T0 = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)


def forecast(values: list[float], start: datetime = T0, step_min: int = 30) -> str:
    rows = [
        f"{(start + timedelta(minutes=step_min * i)).strftime('%Y-%m-%dT%H:%M:%SZ')},{v}"
        for i, v in enumerate(values)
    ]
    return "time,gco2_per_kwh\n" + "\n".join(rows) + "\n"


def client_of(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def stored_schedule(client, *, values, duration_h, deadline_h, interruptible) -> dict:
    """A schedule of the team's knowledge base, on a forecast a day ahead (the clean half hours are the
    100s: the job goes there)."""
    r = client.post(
        "/api/green/schedules/",
        {
            "zone": "GB",
            "forecast_csv": forecast(values),
            "now": T0.isoformat(),
            "duration_h": duration_h,
            "power_kw": 0.2,
            "deadline_h": deadline_h,
            "interruptible": interruptible,
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    return r.json()


def slots(body) -> list[tuple[datetime, datetime]]:
    return [(datetime.fromisoformat(a), datetime.fromisoformat(b)) for a, b in body["result"]["slots"]]


def test_due_and_next_slot_follow_the_slots():
    a, b = datetime(2026, 1, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 2, tzinfo=UTC)
    c, d = datetime(2026, 1, 1, 3, tzinfo=UTC), datetime(2026, 1, 1, 4, tzinfo=UTC)
    two = [(a, b), (c, d)]
    assert due_slot(two, a - timedelta(seconds=1)) is None  # waits
    assert due_slot(two, a) == (b, False) and due_slot(two, c + timedelta(minutes=5)) == (d, False)
    assert due_slot(two, b) is None  # between slots: waits for the next
    assert due_slot(two, d) == (None, True)  # every slot over: overdue, runs to the end
    assert next_slot(two, b) == (c, d) and next_slot(two, d) is None


def test_bad_schedule_requests_are_400s_that_say_what_to_fix(live_stack, alice, make_member):
    client = client_of(alice)
    one = stored_schedule(
        client, values=[400, 100, 100, 400], duration_h=1, deadline_h=2, interruptible=False
    )
    split = stored_schedule(
        client, values=[100, 400, 100, 400], duration_h=1, deadline_h=2, interruptible=True
    )
    assert len(split["result"]["slots"]) == 2
    bob = make_member("bob", "Team B")
    cases = [
        (client_of(bob), {"green_schedule": one["id"]}, "green_schedule", "no such green schedule"),
        (client, {"green_schedule": 10**6}, "green_schedule", "no such green schedule"),
        (client, {"green_schedule": split["id"]}, "snapshot_every", "needs snapshot_every > 0"),
        (
            client,
            {"green_schedule": one["id"], "energy": {"zone": "DE"}},
            "green_schedule",
            "grid zone GB, but the job meters zone DE",
        ),
        (
            client,
            {"green_schedule": one["id"], "carbon_aware": {"deadline_h": 4}},
            "carbon_aware",
            "not both",
        ),
        (client, {"carbon_aware": {"deadline_h": 4}}, "carbon_aware", "give duration_h and power_kw"),
        (
            client,
            {"carbon_aware": {"deadline_h": 0.5, "duration_h": 1, "power_kw": 1}},
            "carbon_aware",
            "deadline_h",
        ),
        (client, {"carbon_aware": {"deadline_h": 4, "colour": "green"}}, "carbon_aware", "colour"),
    ]
    for who, extra, field, text in cases:
        r = who.post("/api/jobs/", job_payload(**extra), format="json")
        assert r.status_code == 400, (extra, r.content)
        assert text in str(r.json().get(field)), (extra, r.json())
    # a schedule is one job's: the second job is told whose it is
    first = client.post("/api/jobs/", job_payload(green_schedule=one["id"]), format="json")
    assert first.status_code == 201, first.content
    again = client.post("/api/jobs/", job_payload(green_schedule=one["id"]), format="json")
    assert again.status_code == 400 and f"job #{first.json()['id']}" in str(again.json()["green_schedule"])
    # the schedule is the job's record now: it cannot be deleted (409), and says so
    gone = client.delete(f"/api/green/schedules/{one['id']}/")
    assert gone.status_code == 409 and f"Job #{first.json()['id']}" in gone.json()["detail"]
    listed = client.get("/api/green/schedules/").json()["results"]
    assert {s["id"]: (s["job"] or {}).get("id") for s in listed}[one["id"]] == first.json()["id"]


def test_a_scheduled_job_waits_and_a_cancel_ends_it_at_once(live_stack, alice):
    from controlplane.jobs.services import scheduling

    client = client_of(alice)
    sched = stored_schedule(
        client, values=[400, 100, 100, 400], duration_h=1, deadline_h=2, interruptible=False
    )
    r = client.post("/api/jobs/", job_payload(green_schedule=sched["id"]), format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["state"] == "scheduled" and body["attempts"] == 0
    assert body["schedule"]["id"] == sched["id"] and body["schedule"]["saving_pct"] > 0
    assert body["schedule"]["slots"] == sched["result"]["slots"]
    ((start, _),) = slots(sched)
    assert scheduling.launch_due(start - timedelta(seconds=1)) == []  # not yet
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/jobs/{body['id']}/")
    assert (
        page.status_code == 200 and b"Carbon-aware schedule" in page.content and b"Start now" in page.content
    )
    cancelled = client.post(f"/api/jobs/{body['id']}/cancel/")
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
    assert scheduling.launch_due(start) == []  # a cancelled job is not launched by its schedule


@pytest.mark.long
def test_an_interruptible_job_runs_in_its_slots_and_its_report_carries_the_saving(live_stack, alice):
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.services import scheduling
    from controlplane.live.models import StreamEvent

    client = client_of(alice)
    sched = stored_schedule(
        client, values=[100, 400, 100, 400], duration_h=1, deadline_h=2, interruptible=True
    )
    (a, b), (c, d) = slots(sched)
    r = client.post(
        "/api/jobs/", job_payload(steps=120, green_schedule=sched["id"], snapshot_every=5), format="json"
    )
    assert r.status_code == 201, r.content
    job_id = r.json()["id"]
    assert scheduling.launch_due(a) == [job_id]
    job = TrainingJob.objects.get(pk=job_id)
    assert job.state in {"queued", "launching", "running"} and job.slot_end_at == b
    # paused at the end of its first slot, once it has a snapshot to continue from
    deadline = time.monotonic() + 120
    while not TrainingJob.objects.get(pk=job_id).snapshots.filter(verified=True).exists():
        assert time.monotonic() < deadline, "no snapshot after 120 s"
        assert TrainingJob.objects.get(pk=job_id).state in {"queued", "launching", "running"}
        time.sleep(0.3)
    assert scheduling.pause_at_slot_end(b - timedelta(seconds=1)) == []  # the slot has not ended
    assert scheduling.pause_at_slot_end(b) == [job_id]
    job = wait_for_state(job_id, {"scheduled", "succeeded", "failed", "cancelled"})
    assert job.state == "scheduled", (job.state, job.human_readable_error, job.log_tail[-2000:])
    assert job.attempts == 1 and not job.cancel_requested and not job.pause_requested
    assert scheduling.launch_due(b) == [] and scheduling.launch_due(c - timedelta(seconds=1)) == []
    # the next slot opens: it continues from its snapshot and finishes
    assert scheduling.launch_due(c) == [job_id]
    job = wait_for_state(job_id, {"succeeded", "failed", "cancelled"}, timeout=240)
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-2000:])
    assert job.attempts == 2
    events = [e.values for e in StreamEvent.objects.filter(stream=job.stream, kind="event")]
    requeued = [v for v in events if v.get("state") == "queued" and v.get("attempt") == 2]
    assert requeued and (requeued[0].get("resume") or {}).get("from"), requeued  # from a snapshot
    steps = list(StreamEvent.objects.filter(stream=job.stream, kind="train").values_list("step", flat=True))
    assert steps.count(1) == 1 and max(steps) == 120  # continued, not started over
    messages = [v.get("message", "") for v in events]
    assert any("paused until the next slot opens" in m for m in messages), messages
    assert any("Paused between carbon-aware slots" in m for m in messages), messages
    # the report carries the schedule it ran under, and verifies
    issued = client.post(f"/api/jobs/{job_id}/certificate/")
    assert issued.status_code == 201, issued.content
    row = issued.json()
    code = row["code"]
    document = client.get(f"/api/certificates/{code}/").json()
    schedule = document["results"]["schedule"]
    assert slots({"result": schedule}) == [(a, b), (c, d)]
    assert schedule["saving_pct"] == pytest.approx(sched["result"]["saving_pct"], abs=1e-4)
    verdict = client.get(row["verify_url"]).json()
    assert verdict["valid"] is True, verdict


@pytest.mark.long
def test_the_green_cli_runs_a_carbon_aware_job_profiles_its_energy_and_writes_its_report(
    live_stack, alice, token_for, tmp_path
):
    """``cann-train green --carbon-aware --energy-profiling --certification`` against the live server: the
    job is scheduled on a forecast whose cleanest half hour is the current one, the relay's tick starts it,
    the CLI prints its energy as it is metered and writes the report, which carries the schedule and
    verifies."""
    import json
    import os
    import subprocess
    import sys

    # dirty now, clean from 15 s on for an hour (a step series: each value holds until the next time)
    now = timezone.now().replace(microsecond=0)
    clean = now + timedelta(seconds=15)
    rows = [(now - timedelta(hours=1), 400), (clean, 40), (clean + timedelta(hours=1), 400)]
    (tmp_path / "forecast.csv").write_text(
        "time,gco2_per_kwh\n" + "".join(f"{t.strftime('%Y-%m-%dT%H:%M:%SZ')},{v}\n" for t, v in rows)
    )
    (tmp_path / "job.json").write_text(json.dumps(job_payload(steps=12, strategy="single.json")))
    token = token_for(alice)
    run = [sys.executable, "-m", "workers.cli", "green", "--url", live_stack.base_url, "--poll-s", "0.5"]
    env = {**os.environ, "CANN_TRAIN_TOKEN": token}
    # nonsense first: a clear message, exit 2, no job
    bad = subprocess.run([*run, "--job-file", str(tmp_path / "job.json"), "--carbon-aware"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--carbon-aware needs --deadline-h" in bad.stderr, bad.stderr
    none = subprocess.run([*run, "--energy-profiling"], env=env, capture_output=True, text=True, timeout=60)
    assert none.returncode == 2 and "give --job-file" in none.stderr, none.stderr
    done = subprocess.run(
        [*run, "--job-file", str(tmp_path / "job.json"), "--carbon-aware", "--deadline-h", "1",
         "--forecast", str(tmp_path / "forecast.csv"), "--duration-h", "0.25", "--power-kw", "0.1",
         "--energy-profiling", "--certification", "--out", str(tmp_path / "report.pdf"), "--json", "--wait-h", "0.05"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["job"]["state"] == "succeeded"
    assert datetime.fromisoformat(out["schedule"]["start"]) == clean  # it waited for the clean hour
    assert out["schedule"]["saving_pct"] > 0 and out["schedule"]["kgco2e"] < out["schedule"]["kgco2e_now"]
    assert "scheduled in GB" in done.stderr and "(estimate)" in done.stderr  # the live energy lines
    assert out["energy"]["kwh"] > 0 and out["energy"]["estimate"] is True
    assert (tmp_path / "report.pdf").read_bytes().startswith(b"%PDF")
    client = client_of(alice)
    document = client.get(f"/api/certificates/{out['report']['code']}/").json()
    assert document["results"]["schedule"]["saving_pct"] == pytest.approx(
        out["schedule"]["saving_pct"], abs=1e-4
    )  # printed to 4 places
    # verified by the server that signed it (the code is keyed with the web process's SECRET_KEY)
    verdict = http("GET", live_stack.base_url + out["report"]["verify_url"], token=token)[1]
    assert verdict["valid"] is True, verdict
