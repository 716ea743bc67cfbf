"""What a job's stream and rows say about its attempts, its profiled steps, its log and its cancel, through
the API and a real Celery worker running torchrun on gloo; and the figures and caveats its pages start
from (the live pages themselves are in tests/browser/test_job_attempt_traces_and_live_log.py)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from tests.conftest import PASSWORD, import_tiny_cpu_plan
from tests.integration.test_jobs import job_payload, wait_for_state

NOISE = (
    "profiler_start",
    "profiler_stop",
    "FutureWarning",
    "OMP_NUM_THREADS",
    "Traceback",
    "SignalException",
)


def stored(job_id: int, kind: str | None = None) -> list:
    from controlplane.live.models import StreamEvent

    events = StreamEvent.objects.filter(stream=f"job/{job_id}").order_by("seq")
    return list(events.filter(kind=kind) if kind else events)


def wait_until(what, check, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.3)
    return found


def train_steps_of(job_id: int, attempt: int) -> list[int]:
    return [e.step for e in stored(job_id, "train") if e.values.get("attempt") == attempt]


def log_lines(job_id: int) -> list[str]:
    return [line for e in stored(job_id, "event") for line in e.values.get("log", [])]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_cancel_ends_clean_and_says_who_cancelled(live_stack, alice_api):
    r = alice_api.post("/api/jobs/", job_payload(steps=100000, profile_every=2), format="json")
    assert r.status_code == 201, r.content
    job_id = r.json()["id"]
    wait_for_state(job_id, {"running"})
    # the log streams while the job runs: its own step lines, without the profiler's markers
    wait_until("live log line", lambda: any(line.startswith("step ") for line in log_lines(job_id)))
    wait_until("profiled step", lambda: any(e.values.get("profiled") for e in stored(job_id, "train")))
    assert alice_api.post(f"/api/jobs/{job_id}/cancel/").status_code == 202

    job = wait_for_state(job_id, {"cancelled", "failed", "succeeded"}, timeout=60)
    assert job.state == "cancelled"
    assert job.human_readable_error == "Cancelled by alice." and job.error == ""
    assert alice_api.get(f"/api/jobs/{job_id}/").json()["cancelled_by"] == "alice"
    assert "step " in job.log_tail
    for noise in NOISE:
        assert noise not in job.log_tail, noise
    cancelled = wait_until(
        "cancelled event",
        lambda: [e for e in stored(job_id, "event") if e.values.get("state") == "cancelled"],
    )
    assert cancelled[0].values["message"] == "Cancelled by alice." and cancelled[0].values["attempt"] == 1
    lines = log_lines(job_id)
    assert any(line.startswith("step ") for line in lines)
    for noise in NOISE:
        assert not any(noise in line for line in lines), noise
    # the first log batch went out while the job ran, not when it ended
    first_log = next(e for e in stored(job_id, "event") if e.values.get("log"))
    assert first_log.time < job.finished_at


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_every_event_says_its_attempt_and_train_events_say_which_steps_were_profiled(live_stack, alice_api):
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.selectors import compared_series

    r = alice_api.post("/api/jobs/", job_payload(steps=100000, profile_every=3), format="json")
    job_id = r.json()["id"]
    wait_until("7 steps of attempt 1", lambda: len(train_steps_of(job_id, 1)) >= 7)
    alice_api.post(f"/api/jobs/{job_id}/cancel/")
    wait_for_state(job_id, {"cancelled"}, timeout=60)
    r = alice_api.post(f"/api/jobs/{job_id}/relaunch/")
    assert r.status_code == 202 and r.json()["attempts"] == 2
    wait_until("4 steps of attempt 2", lambda: len(train_steps_of(job_id, 2)) >= 4)
    alice_api.post(f"/api/jobs/{job_id}/cancel/")
    wait_for_state(job_id, {"cancelled"}, timeout=60)
    wait_until(
        "the second cancel stored",
        lambda: [e for e in stored(job_id, "event") if e.values.get("state") == "cancelled"][1:],
    )

    events = stored(job_id)
    second_launch = next(
        e.seq for e in events if e.values.get("state") == "queued" and e.values.get("attempt") == 2
    )
    train = [e for e in events if e.kind == "train"]
    assert train and all(e.values["attempt"] == (1 if e.seq < second_launch else 2) for e in train)
    # each attempt starts again at step 1: the pages must not join them into one line
    assert train_steps_of(job_id, 2)[0] == 1 and train_steps_of(job_id, 1)[:3] == [1, 2, 3]
    assert [e.values.get("profiled", False) for e in train] == [e.step % 3 == 0 for e in train]
    lifecycle = [(e.values["state"], e.values.get("attempt")) for e in events if e.values.get("state")]
    for state in ("queued", "running", "started", "cancelled"):
        assert (state, 1) in lifecycle and (state, 2) in lifecycle, (state, lifecycle)
    logs = [e for e in events if e.values.get("log")]
    assert {e.values["attempt"] for e in logs} == {1, 2}

    # the compare page's series: every point with its attempt and whether it was profiled
    (series,) = compared_series([TrainingJob.objects.get(pk=job_id)])
    assert series["attempt"] == [e.values["attempt"] for e in train]
    assert series["profiled"] == [e.step % 3 == 0 for e in train]
    assert series["attempts"] == 2


# --- what the pages start from (no processes) -----------------------------------------------------------

DP2 = {"tp": 1, "pp": 1, "dp": 2, "ep": 1, "cp": 1, "vpp": 1, "micro_batch_size": 2}


def store(job, rows: list[tuple[str, int | None, dict]]) -> None:
    from controlplane.live.models import StreamEvent

    now = datetime.now(UTC)
    StreamEvent.objects.bulk_create(
        StreamEvent(stream=job.stream, seq=i, time=now, kind=kind, step=step, values=values)
        for i, (kind, step, values) in enumerate(rows, start=1)
    )


def page_data(client, job_id: int) -> dict:
    html = client.get(f"/jobs/{job_id}/").content.decode()
    return json.loads(html.split('<script id="job-page" type="application/json">')[1].split("</script>")[0])


@pytest.mark.django_db
def test_older_events_without_an_attempt_belong_to_the_launch_before_them(alice):
    """Streams written before events carried ``attempt``: each "queued" event starts the next attempt."""
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.selectors import compared_series

    job = TrainingJob.objects.create(
        team=alice.teams.first(), name="old", config={"strategy": DP2}, attempts=2
    )
    train = {"loss": 5.0, "tokens_per_s": 1000.0, "step_time_s": 0.1}
    store(
        job,
        [
            ("event", None, {"state": "queued"}),
            ("train", 1, train),
            ("train", 2, train),
            ("event", None, {"state": "cancelled"}),
            ("event", None, {"state": "queued"}),
            ("train", 1, train),
        ],
    )
    (series,) = compared_series([job])
    assert series["step"] == [1, 2, 1] and series["attempt"] == [1, 1, 2]


@pytest.mark.django_db
def test_a_cancelled_job_shows_the_same_figures_on_the_list_and_on_its_page(alice, client):
    from controlplane.jobs.models import TrainingJob

    client.login(username="alice", password=PASSWORD)
    job = TrainingJob.objects.create(
        team=alice.teams.first(), name="stopped", config={"strategy": DP2, "steps": 100}, state="cancelled"
    )
    rows: list[tuple[str, int | None, dict]] = [("event", None, {"state": "queued", "attempt": 1})]
    for step in range(1, 25):  # every 5th step profiled: 3x slower
        profiled = step % 5 == 0
        values = {"attempt": 1, "loss": 5.0, "step_time_s": 0.3 if profiled else 0.1 + step / 1000}
        values["tokens_per_s"] = 1000 / values["step_time_s"]
        if profiled:
            values["profiled"] = True
        rows.append(("train", step, values))
    store(job, rows)

    row = next(r for r in client.get("/jobs/").context["rows"] if r.job.pk == job.pk)
    figures = page_data(client, job.pk)["figures"]
    assert figures == {
        "step_time_s": row.measured_step_time_s,
        "tokens_per_s": row.tokens_per_s,
        "final": False,
    }
    steady = [s for s in range(1, 25) if s % 5][-10:]  # the last ten steps the profiler left alone
    assert figures["step_time_s"] == pytest.approx(sum(0.1 + s / 1000 for s in steady) / 10)


@pytest.mark.django_db
def test_an_uncalibrated_cpu_plan_carries_its_caveat_to_the_plan_and_job_pages(
    alice, client, tmp_path, monkeypatch
):
    from controlplane.jobs.models import TrainingJob
    from controlplane.planning.models import StoredPlan

    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))  # no `cann-train calibrate` output here
    client.login(username="alice", password=PASSWORD)
    api = APIClient()
    api.force_authenticate(alice)
    plan = import_tiny_cpu_plan(api)
    stored_plan = StoredPlan.objects.get(pk=plan["id"])
    caveat = "uncalibrated: run `cann-train calibrate`"
    assert stored_plan.predicted["efficiency_profile"]["note"] == caveat
    assert caveat in client.get(f"/planning/plans/{plan['id']}/").content.decode()

    job = TrainingJob.objects.create(
        team=alice.teams.first(),
        name="from the plan",
        config={"strategy": DP2},
        plan={**stored_plan.to_contract(), "id": stored_plan.pk},
        source_plan=stored_plan,
    )
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="prediction-caveat"' in html and "Uncalibrated: run `cann-train calibrate`" in html
    assert page_data(client, job.pk)["plan_predicted"]["efficiency_profile"]["note"] == caveat
