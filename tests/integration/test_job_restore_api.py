"""Elastic recovery in the control plane, through the API and the services the recovery engine calls:
restore from a snapshot (validation, team scoping, the new attempt's config), relaunches that resume, the
restart policy fields, faults / recoveries / snapshots / goodput as the engine reports them, and the reaper
resuming a job whose worker was lost.

No worker runs here: the database is rolled back after each test, so nothing these writes would enqueue or
publish after their commit goes out (the real-process path is ``test_job_recovery.py``)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from workers.training.examples import example

pytestmark = pytest.mark.django_db

TINY_TRAINING = {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"}


def _config(tmp_path: Path | None, **extra) -> dict:
    from controlplane.jobs.services import job_config_of, validated_config

    config = job_config_of(
        model=example("tiny-dense.json"), strategy={"dp": 2}, training=TINY_TRAINING, steps=40, device="cpu"
    )
    if tmp_path is not None:
        config.update(snapshot_every=5, snapshot_dir=str(tmp_path / "snapshots"))
    return validated_config({**config, **extra})


def _job(team, *, state="failed", attempts=1, tmp_path=None, **fields):
    from controlplane.jobs.models import TrainingJob

    return TrainingJob.objects.create(
        team=team,
        name=f"{state} job",
        config=_config(tmp_path),
        nproc_per_node=2,
        attempts=attempts,
        state=state,
        **fields,
    )


def _snapshot(job, step: int, *, verified=True, kind="full") -> dict:
    """A snapshot as the engine reports it (``ElasticWatch(on_snapshot=...)``), recorded by the service."""
    from controlplane.jobs.services.faults import record_snapshot

    snap = {
        "name": f"step-{step:08d}",
        "step": step,
        "kind": kind,
        "bytes_written": 1000 + step,
        "raw_bytes": 4000,
        "base": None if kind == "full" else "step-00000005",
        "created_unix": time.time(),
        "verified": verified,
    }
    record_snapshot(job_id=job.pk, attempt=job.attempts, snapshot=snap)
    return snap


@pytest.fixture
def bob(make_member):
    user = make_member("bob", "Team B")
    client = APIClient()
    client.force_authenticate(user)
    return client


# --- restore -------------------------------------------------------------------------------------------


def test_restore_starts_a_new_attempt_that_resumes_from_exactly_that_snapshot(alice_api):
    job = _job(alice_api.team, tmp_path=Path("/nonexistent-elsewhere"))  # a directory this host does not see
    for step in (5, 10, 15):
        _snapshot(job, step)
    r = alice_api.post(f"/api/jobs/{job.pk}/restore/", {"snapshot": "step-00000010"}, format="json")
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["state"] == "queued" and body["attempts"] == 2
    assert body["config"]["resume_from"] == "step-00000010" and body["config"]["resume"] is True
    job.refresh_from_db()
    assert job.restart_budget_from == 2  # a person launched it: the restart budget starts again

    # a later relaunch resumes from the newest good snapshot, not from the restored one again
    job.state = "failed"
    job.save()
    r = alice_api.post(f"/api/jobs/{job.pk}/relaunch/")
    assert r.status_code == 202, r.content
    assert "resume_from" not in r.json()["config"] and r.json()["config"]["resume"] is True


def test_a_succeeded_job_can_be_restored_too(alice_api):
    job = _job(alice_api.team, state="succeeded", tmp_path=Path("/nonexistent-elsewhere"))
    _snapshot(job, 20)
    r = alice_api.post(f"/api/jobs/{job.pk}/restore/", {"snapshot": "step-00000020"}, format="json")
    assert r.status_code == 202, r.content


def test_restore_refuses_a_snapshot_the_job_does_not_have_naming_those_it_has(alice_api):
    job = _job(alice_api.team, tmp_path=Path("/nonexistent-elsewhere"))
    _snapshot(job, 5)
    _snapshot(job, 10)
    r = alice_api.post(f"/api/jobs/{job.pk}/restore/", {"snapshot": "step-00000030"}, format="json")
    assert r.status_code == 400
    message = r.json()["snapshot"][0]
    assert "no snapshot 'step-00000030'" in message and "step-00000010, step-00000005" in message

    plain = _job(alice_api.team)  # takes no snapshots
    r = alice_api.post(f"/api/jobs/{plain.pk}/restore/", {"snapshot": "step-00000005"}, format="json")
    assert r.status_code == 400 and "snapshot_every > 0" in r.json()["snapshot"][0]


def test_restore_refuses_unverified_removed_and_set_aside_snapshots(alice_api, tmp_path):
    job = _job(alice_api.team, tmp_path=tmp_path)
    root = tmp_path / "snapshots"
    root.mkdir()
    _snapshot(job, 5, verified=False)
    _snapshot(job, 10)  # removed by retention: not in the directory any more
    _snapshot(job, 15)
    (root / "step-00000015.superseded").mkdir()  # set aside by an earlier restore
    answers = {
        name: alice_api.post(f"/api/jobs/{job.pk}/restore/", {"snapshot": name}, format="json")
        for name in ("step-00000005", "step-00000010", "step-00000015")
    }
    assert all(r.status_code == 400 for r in answers.values())
    assert "did not verify" in answers["step-00000005"].json()["snapshot"][0]
    assert "removed by retention" in answers["step-00000010"].json()["snapshot"][0]
    assert "set aside as superseded" in answers["step-00000015"].json()["snapshot"][0]
    rows = {s["name"]: s for s in alice_api.get(f"/api/jobs/{job.pk}/").json()["snapshots"]}
    assert rows["step-00000010"]["on_disk"] == "removed" and not rows["step-00000010"]["restorable"]


@pytest.mark.parametrize("state", ["queued", "launching", "running", "recovering"])
def test_restore_of_a_job_that_has_not_ended_is_a_409(alice_api, state):
    job = _job(alice_api.team, state=state, tmp_path=Path("/nonexistent-elsewhere"))
    _snapshot(job, 5)
    r = alice_api.post(f"/api/jobs/{job.pk}/restore/", {"snapshot": "step-00000005"}, format="json")
    assert r.status_code == 409 and "cancel it" in r.json()["detail"]


def test_restore_of_another_teams_job_is_a_404_like_no_job(alice_api, bob):
    job = _job(alice_api.team, tmp_path=Path("/nonexistent-elsewhere"))
    _snapshot(job, 5)
    mine = bob.post(f"/api/jobs/{job.pk}/restore/", {"snapshot": "step-00000005"}, format="json")
    none = bob.post("/api/jobs/987654321/restore/", {"snapshot": "step-00000005"}, format="json")
    assert mine.status_code == none.status_code == 404
    assert mine.json() == none.json()
    job.refresh_from_db()
    assert job.attempts == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "snapshot"),
        ({"snapshot": 5}, "snapshot"),
        ({"snapshot": "latest"}, "snapshot"),
        ({"snapshot": "step-5"}, "snapshot"),
        ({"snapshot": "step-00000005", "force": True}, "force"),
        (["step-00000005"], "non_field_errors"),
    ],
)
def test_restore_with_a_bad_body_is_a_400_naming_the_problem(alice_api, body, field):
    job = _job(alice_api.team, tmp_path=Path("/nonexistent-elsewhere"))
    _snapshot(job, 5)
    r = alice_api.post(f"/api/jobs/{job.pk}/restore/", body, format="json")
    assert r.status_code == 400 and field in r.json(), r.content


def test_restore_counts_against_the_teams_quota(alice_api):
    from controlplane.jobs import services

    job = _job(alice_api.team, tmp_path=Path("/nonexistent-elsewhere"))
    _snapshot(job, 5)
    for _ in range(services.MAX_ACTIVE_JOBS_PER_TEAM):
        _job(alice_api.team, state="queued")
    r = alice_api.post(f"/api/jobs/{job.pk}/restore/", {"snapshot": "step-00000005"}, format="json")
    assert r.status_code == 429


def test_the_schema_documents_restore_and_the_recovery_fields(alice_api):
    schema = alice_api.get("/api/schema/?format=json").json()
    restore = schema["paths"]["/api/jobs/{id}/restore/"]["post"]
    assert {"202", "400", "404", "409", "429"} <= set(restore["responses"])
    job = schema["components"]["schemas"]["TrainingJob"]["properties"]
    assert {"faults", "snapshots", "goodput", "max_restarts", "hang_timeout_s"} <= set(job)
    create = schema["components"]["schemas"]["JobCreate"]["properties"]
    assert create["max_restarts"]["maximum"] == 100 and create["hang_timeout_s"]["minimum"] == 5


# --- submit: the restart policy ------------------------------------------------------------------------


def job_body(**extra) -> dict:
    """A request for a tiny two-rank CPU job, ``extra`` on top (also used by test_elastic_jobs)."""
    return {
        "name": "elastic",
        "model": example("tiny-dense.json"),
        "strategy": {"dp": 2},
        "training": TINY_TRAINING,
        "steps": 20,
        "device": "cpu",
        **extra,
    }


def _submit(client, **extra):
    return client.post("/api/jobs/", job_body(**extra), format="json")


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ({"max_restarts": -1}, "max_restarts", "greater than or equal to 0"),
        ({"max_restarts": 101}, "max_restarts", "less than or equal to 100"),
        ({"max_restarts": "many"}, "max_restarts", "valid integer"),
        ({"hang_timeout_s": 1}, "hang_timeout_s", "greater than or equal to 5"),
        ({"hang_timeout_s": 7200}, "hang_timeout_s", "less than or equal to 3600"),
        ({"snapshot_every": -2}, "snapshot_every", "greater than or equal to 0"),
        ({"inject": "explode@step=3"}, "inject", "not a fault kind"),
        ({"inject": "kill-rank@step=3:rank=5"}, "inject", "ranks 0-1"),
        ({"inject": "corrupt-snapshot@step=3"}, "inject", "takes no snapshots"),
        ({"inject": "kill-worker@step=3", "snapshot_every": 2}, "inject", "other teams'"),
        ({"inject": "drop-link@step=3:rank=1", "snapshot_every": 2}, "inject", "emulated two-tier network"),
        ({"snapshot_delta": "zip", "snapshot_every": 2}, "snapshot_delta", "not a valid choice"),
        (
            {"snapshot_delta": "log", "snapshot_every": 5},
            "snapshot_every",
            "at most 3 with snapshot_delta log",
        ),
        ({"snapshot_memory_every": -1}, "snapshot_memory_every", "greater than or equal to 0"),
    ],
)
def test_submit_validates_the_restart_policy_and_the_faults_to_inject(alice_api, extra, field, words):
    r = _submit(alice_api, **extra)
    assert r.status_code == 400 and field in r.json(), r.content
    assert words in " ".join(r.json()[field]), r.json()


def test_a_job_that_snapshots_gets_its_own_snapshot_directory_and_its_policy(alice_api):
    from controlplane.jobs.models import TrainingJob

    r = _submit(alice_api, snapshot_every=5, max_restarts=7, hang_timeout_s=30, inject="kill-rank@step=6",
                snapshot_memory_every=2)  # fmt: skip
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["max_restarts"] == 7 and body["hang_timeout_s"] == 30
    assert body["config"]["snapshot_memory_every"] == 2
    logs = _submit(alice_api, snapshot_every=2, snapshot_full_every=4, snapshot_delta="log")
    assert logs.status_code == 201 and logs.json()["config"]["snapshot_delta"] == "log", logs.content
    job = TrainingJob.objects.get(pk=body["id"])
    assert body["config"]["snapshot_dir"] == str(
        Path(settings.VAR_DIR) / "jobs" / str(job.pk) / f"snapshots-{job.files_stamp}"
    )
    assert body["config"]["inject"] == "kill-rank@step=6"
    assert body["faults"] == [] and body["snapshots"] == [] and body["goodput"] is None
    plain = _submit(alice_api).json()
    assert (
        plain["max_restarts"] == 3 and plain["hang_timeout_s"] == 60 and not plain["config"]["snapshot_dir"]
    )


def test_the_service_bounds_the_policy_too(alice_api):
    from rest_framework.exceptions import ValidationError

    from controlplane.jobs.services import job_create

    with pytest.raises(ValidationError) as err:
        job_create(team=alice_api.team, name="x", config=_config(None), max_restarts=500, launch=False)
    assert "max_restarts" in err.value.detail


# --- what the recovery engine reports ------------------------------------------------------------------


def test_a_fault_makes_the_job_recovering_and_its_recovery_running_again(alice_api, bob):
    from controlplane.jobs.services.faults import record_fault, record_recovery

    job = _job(alice_api.team, state="running", tmp_path=Path("/nonexistent-elsewhere"))
    detected = time.time()
    fault = {
        "kind": "rank-killed",
        "rank": 1,
        "step": 12,
        "restart": 0,
        "detected_unix": detected,
        "message": "rank 1 (pid 4242) was killed by SIGKILL",
    }
    record_fault(job_id=job.pk, attempt=1, fault=fault)
    job.refresh_from_db()
    assert job.state == "recovering"
    body = alice_api.get(f"/api/jobs/{job.pk}/").json()
    assert body["state"] == "recovering" and body["faults"][0]["kind"] == "rank-killed"
    assert body["faults"][0]["recovered_at"] is None and body["faults"][0]["step"] == 12

    recovery = {
        **fault,
        "resumed_from_step": 10,
        "snapshot": "step-00000010",
        "steps_lost": 2,
        "rto_s": 3.25,
        "recovered_unix": detected + 3.25,
    }
    record_recovery(job_id=job.pk, attempt=1, recovery=recovery)
    job.refresh_from_db()
    assert job.state == "running"
    [row] = alice_api.get(f"/api/jobs/{job.pk}/").json()["faults"]
    assert (row["resumed_from_step"], row["snapshot"], row["steps_lost"], row["rto_s"]) == (
        10,
        "step-00000010",
        2,
        3.25,
    )
    # the rows are the job's team's: another team sees no job, and no fault in its lists
    assert bob.get(f"/api/jobs/{job.pk}/").status_code == 404
    assert bob.get("/api/jobs/?state=running").json()["results"] == []


def test_a_recovery_whose_fault_was_never_recorded_is_kept_whole(alice_api):
    from controlplane.jobs.services.faults import record_recovery

    job = _job(alice_api.team, state="running")
    now = time.time()
    record_recovery(
        job_id=job.pk,
        attempt=1,
        recovery={
            "kind": "rank-hung",
            "rank": 0,
            "step": 8,
            "restart": 1,
            "detected_unix": now - 61,
            "message": "no step for 60 s",
            "resumed_from_step": 5,
            "snapshot": "step-00000005",
            "steps_lost": 3,
            "rto_s": 61.0,
            "recovered_unix": now,
            "skipped": [{"name": "step-00000008", "reason": "rank00000.bin: sha256 mismatch"}],
        },
    )
    [fault] = job.faults.all()
    assert fault.kind == "rank-hung" and fault.restart == 1 and fault.rto_s == 61.0
    assert (
        fault.message
        == "no step for 60 s · the resume skipped step-00000008 (rank00000.bin: sha256 mismatch)"
    )


def test_a_snapshot_reported_again_replaces_its_row(alice_api):
    job = _job(alice_api.team, state="running", tmp_path=Path("/nonexistent-elsewhere"))
    _snapshot(job, 10, kind="full")
    _snapshot(job, 10, kind="delta")  # a restore's new attempt wrote step 10 again
    [row] = alice_api.get(f"/api/jobs/{job.pk}/").json()["snapshots"]
    assert row["kind"] == "delta" and row["base"] == "step-00000005" and row["on_disk"] is None


def test_the_end_of_run_report_stores_goodput_and_snapshots(alice_api):
    from controlplane.common.models import JobState
    from controlplane.jobs.models import JobNode
    from controlplane.jobs.services import node_finished

    job = _job(alice_api.team, state="running", tmp_path=Path("/nonexistent-elsewhere"))
    node = JobNode.objects.create(job=job, attempt=1, node_rank=0, state=JobState.RUNNING)
    goodput = {
        "wall_s": 100.0,
        "productive_s": 91.5,
        "goodput": 0.915,
        "badput": {
            "startup_s": 4.0,
            "restore_s": 0.5,
            "snapshot_stall_s": 1.0,
            "lost_progress_s": 2.0,
            "fault_wait_s": 1.0,
            "other_s": 0.0,
        },
    }
    missed = {  # a fault whose callbacks never reached the database: the report has it whole
        "kind": "rank-killed",
        "rank": 1,
        "step": 7,
        "restart": 0,
        "detected_unix": time.time() - 5,
        "message": "rank 1 killed",
        "resumed_from_step": 5,
        "snapshot": "step-00000005",
        "steps_lost": 2,
        "rto_s": 2.5,
        "recovered_unix": time.time() - 2.5,
    }
    report = {
        "faults": [missed],
        "restarts": 1,
        "goodput": goodput,
        "snapshots": [
            {
                "name": "step-00000005",
                "step": 5,
                "kind": "full",
                "bytes_written": 10,
                "raw_bytes": 40,
                "base": None,
                "created_unix": time.time(),
                "verified": True,
            }
        ],
    }
    node_finished(node=node, exit_code=0, cancelled=False, log_tail="", summary={"steps": 40}, elastic=report)
    body = alice_api.get(f"/api/jobs/{job.pk}/").json()
    assert body["state"] == "succeeded"
    assert body["goodput"]["goodput"] == 0.915 and body["goodput"]["restarts"] == 1
    assert body["goodput"]["badput"]["lost_progress_s"] == 2.0
    assert body["measured"]["goodput"]["goodput"] == 0.915 and body["measured"]["steps"] == 40
    assert [s["name"] for s in body["snapshots"]] == ["step-00000005"]
    [fault] = body["faults"]
    assert (fault["kind"], fault["step"], fault["steps_lost"], fault["rto_s"]) == ("rank-killed", 7, 2, 2.5)


# --- a lost worker -------------------------------------------------------------------------------------


def _running_with_silent_supervisor(team, tmp_path=None, **fields):
    from controlplane.common.models import JobState
    from controlplane.jobs.models import JobNode
    from controlplane.live.models import StreamEvent

    beat = timezone.now() - timedelta(seconds=30)
    job = _job(team, state=JobState.RUNNING, tmp_path=tmp_path, heartbeat_at=beat, started_at=beat, **fields)
    JobNode.objects.create(
        job=job, attempt=1, node_rank=0, node_name="gone", state="running", heartbeat_at=beat
    )
    StreamEvent.objects.bulk_create(
        StreamEvent(
            stream=job.stream,
            seq=s,
            time=beat,
            kind="train",
            step=s,
            values={"attempt": 1, "restart": 0, "loss": 3.0},
        )
        for s in range(1, 13)
    )
    return job


def test_a_lost_worker_resumes_a_job_that_snapshots_as_a_new_attempt(alice_api):
    from controlplane.jobs.services import job_progress_from_events, reap_orphans

    job = _running_with_silent_supervisor(alice_api.team, tmp_path=Path("/nonexistent-elsewhere"))
    _snapshot(job, 10)
    assert reap_orphans(stale_after=timedelta(seconds=5)) == [job.pk]
    job.refresh_from_db()
    assert job.state == "queued" and job.attempts == 2 and job.config["resume"] is True
    assert job.restart_budget_from == 1  # automatic: its faults keep counting
    [fault] = job.faults.all()
    assert (fault.kind, fault.attempt, fault.step, fault.recovered_at) == ("worker-lost", 1, 12, None)
    assert "stopped answering" in fault.message
    assert job.nodes.get(attempt=1).state == "failed"

    # the new attempt's first step closes the fault: resumed after step 10, 2 steps lost
    later = timezone.now()
    job_progress_from_events(
        job.stream,
        [
            {
                "stream": job.stream,
                "seq": 40,
                "time": later.isoformat(),
                "kind": "train",
                "step": 11,
                "values": {"attempt": 2, "restart": 0, "loss": 2.9},
            }
        ],
    )
    fault.refresh_from_db()
    assert (fault.resumed_from_step, fault.steps_lost, fault.snapshot) == (10, 2, "step-00000010")
    assert fault.rto_s == pytest.approx((fault.recovered_at - fault.detected_at).total_seconds())


def test_a_lost_worker_fails_a_job_without_snapshots_or_restarts_left_saying_why(alice_api):
    from controlplane.jobs.services import reap_orphans
    from controlplane.jobs.services.faults import record_fault

    plain = _running_with_silent_supervisor(alice_api.team)
    spent = _running_with_silent_supervisor(
        alice_api.team, tmp_path=Path("/nonexistent-elsewhere"), max_restarts=1
    )
    record_fault(
        job_id=spent.pk, attempt=1, fault={"kind": "rank-killed", "rank": 0, "step": 4, "restart": 0}
    )
    assert sorted(reap_orphans(stale_after=timedelta(seconds=5))) == sorted([plain.pk, spent.pk])
    plain.refresh_from_db()
    spent.refresh_from_db()
    assert plain.state == spent.state == "failed"
    assert "stopped answering" in plain.human_readable_error
    assert "takes no snapshots" in plain.human_readable_error and "Relaunch" in plain.human_readable_error
    assert "used its 1 automatic recoveries" in spent.human_readable_error
    assert spent.attempts == 1 and not spent.faults.filter(kind="worker-lost").exists()
