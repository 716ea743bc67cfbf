"""Elastic recovery on the job page, in a real Chromium against the real stack: fault markers on the loss
chart (hover: kind, RTO, steps lost), the faults and snapshots tables, the goodput panel, the restart
policy, the `recovering` state, live updates as the recovery engine reports, and "Restore from this
snapshot" (confirm, then the API's answer).

The faults, recoveries, snapshots and goodput are written through the services the recovery engine's
callbacks call (``controlplane.jobs.services.faults``), so every live update travels the real path: commit ->
Redis stream -> relay -> websocket -> page."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.utils import timezone

from tests.browser.test_job_pages import log_in
from workers.training.examples import example

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

TINY_TRAINING = {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"}
FAULT_TRACE = "() => document.getElementById('chart-loss').data.find(t => t.name === 'faults')"


def _snapshot(job, step: int) -> None:
    from controlplane.jobs.services.faults import record_snapshot

    record_snapshot(
        job_id=job.pk,
        attempt=1,
        snapshot={
            "name": f"step-{step:08d}",
            "step": step,
            "kind": "full" if step % 10 == 5 else "delta",
            "bytes_written": 2_000_000 + step,
            "raw_bytes": 4_800_000,
            "base": None if step % 10 == 5 else f"step-{step - 5:08d}",
            "created_unix": time.time(),
            "verified": True,
        },
    )


def _running_job_with_a_recovered_fault(team):
    """A running 2-rank job: steps 1-12, rank 1 killed after step 12, resumed from the snapshot of step 10
    (restart 1), steps 11-16 again; snapshots at 5, 10, 15."""
    from controlplane.jobs.models import JobNode, TrainingJob
    from controlplane.jobs.services import job_config_of, validated_config
    from controlplane.jobs.services.faults import record_fault, record_recovery
    from controlplane.live.models import StreamEvent

    config = job_config_of(
        model=example("tiny-dense.json"), strategy={"dp": 2}, training=TINY_TRAINING, steps=30, device="cpu"
    )
    config.update(snapshot_every=5, snapshot_dir=str(Path("/nonexistent-elsewhere") / "snapshots"))
    now = timezone.now()
    job = TrainingJob.objects.create(
        team=team,
        name="survives",
        config=validated_config(config),
        nproc_per_node=2,
        attempts=1,
        state="running",
        started_at=now,
        heartbeat_at=now,
        max_restarts=5,
        hang_timeout_s=30,
    )
    JobNode.objects.create(job=job, attempt=1, node_rank=0, state="running", heartbeat_at=now)
    steps = [(s, 0) for s in range(1, 13)] + [(s, 1) for s in range(11, 17)]
    events = [
        StreamEvent(
            stream=job.stream, seq=1, time=now, kind="event", values={"state": "queued", "attempt": 1}
        )
    ]
    for seq, (step, restart) in enumerate(steps, start=2):
        values = {
            "attempt": 1,
            "restart": restart,
            "loss": 6.0 - 0.1 * step,
            "tokens_per_s": 900.0,
            "step_time_s": 0.2,
        }
        events.append(
            StreamEvent(stream=job.stream, seq=seq, time=now, kind="train", step=step, values=values)
        )
    StreamEvent.objects.bulk_create(events)
    for step in (5, 10, 15):
        _snapshot(job, step)
    detected = time.time() - 60
    fault = {
        "kind": "rank-killed",
        "rank": 1,
        "step": 12,
        "restart": 0,
        "detected_unix": detected,
        "message": "rank 1 (pid 4242) killed by SIGKILL",
    }
    record_fault(job_id=job.pk, attempt=1, fault=fault)
    record_recovery(
        job_id=job.pk,
        attempt=1,
        recovery={
            **fault,
            "resumed_from_step": 10,
            "snapshot": "step-00000010",
            "steps_lost": 2,
            "rto_s": 3.4,
            "recovered_unix": detected + 3.4,
        },
    )
    return job


def test_faults_snapshots_and_goodput_show_and_update_live_on_the_job_page(live_stack, page, alice):
    from controlplane.jobs.models import JobNode, TrainingJob
    from controlplane.jobs.services import MAX_ACTIVE_JOBS_PER_TEAM, node_finished
    from controlplane.jobs.services.faults import record_fault, record_recovery

    team = alice.teams.first()
    job = _running_job_with_a_recovered_fault(team)
    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/{job.pk}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)

    # the recovered fault: a marker at step 12 whose hover says kind, RTO and steps lost; a dotted line there
    # and the two steps trained again shaded
    marker = page.evaluate(FAULT_TRACE)
    assert marker["x"] == [12] and marker["text"] == ["rank-killed"]
    assert "RTO 3.400 s" in marker["hovertext"][0] and "2 step(s) lost" in marker["hovertext"][0]
    assert "resumed from step 10 (step-00000010)" in marker["hovertext"][0]
    shapes = page.evaluate(
        "() => document.getElementById('chart-loss').layout.shapes.map(s => [s.type, s.x0, s.x1])"
    )
    assert ["line", 12, 12] in shapes and ["rect", 10, 12] in shapes
    # the loss line breaks where the restart went back to step 11
    xs = page.evaluate("() => document.getElementById('chart-loss').data[0].x")
    assert xs[:12] == list(range(1, 13)) and xs[12] is None and xs[13:] == list(range(11, 17))
    assert page.inner_text("#fault-table tbody tr[data-fault] td:nth-child(7)") == "3.400 s"
    # the policy, the snapshots (newest first; a restore waits until the job has ended), no goodput yet
    assert "5 restarts (4 left) · hang after 30 s" in page.inner_text("#job-policy")
    assert "every 5 steps" in page.inner_text("#job-snapshot-policy")
    names = page.eval_on_selector_all("#snapshot-table tbody tr", "rows => rows.map(r => r.dataset.snapshot)")
    assert names == ["step-00000015", "step-00000010", "step-00000005"]
    assert page.is_disabled("#snapshot-table button[data-snapshot=step-00000010]")
    assert page.inner_text("#goodput-value") == "—" and page.is_visible("#goodput-empty")

    # live: a rank hangs after step 16 -> recovering, a second marker; its recovery -> running, with its RTO
    hang = {
        "kind": "rank-hung",
        "rank": 0,
        "step": 16,
        "restart": 1,
        "detected_unix": time.time(),
        "message": "no step for 30 s",
    }
    record_fault(job_id=job.pk, attempt=1, fault=hang)
    page.wait_for_selector("#job-state[data-state=recovering]", timeout=20000)
    page.wait_for_function(f"() => ({FAULT_TRACE})()?.x.length === 2", timeout=10000)
    # the restarts left follow the fault without a reload (issue 35: it stayed "4 left" until one)
    page.wait_for_selector("#job-restarts-left[data-value='3']", timeout=10000)
    assert "5 restarts (3 left)" in page.inner_text("#job-policy")
    assert "not recovered (yet)" in page.evaluate(FAULT_TRACE)["hovertext"][1]
    assert page.locator("#fault-table tbody tr[data-recovered=no]").count() == 1
    record_recovery(
        job_id=job.pk,
        attempt=1,
        recovery={
            **hang,
            "resumed_from_step": 15,
            "snapshot": "step-00000015",
            "steps_lost": 1,
            "rto_s": 31.5,
            "recovered_unix": time.time(),
        },
    )
    page.wait_for_selector("#job-state[data-state=running]", timeout=20000)
    page.wait_for_function(f"() => ({FAULT_TRACE})()?.hovertext[1].includes('RTO 31.50 s')", timeout=10000)
    _snapshot(job, 20)
    page.wait_for_selector("#snapshot-table tbody tr[data-snapshot=step-00000020]", timeout=20000)

    # the attempt ends: the engine's report brings the goodput, and the snapshots can be restored from
    node = JobNode.objects.get(job=job, attempt=1)
    badput = {
        "startup_s": 6.0,
        "restore_s": 0.8,
        "snapshot_stall_s": 0.4,
        "lost_progress_s": 0.6,
        "fault_wait_s": 34.9,
        "other_s": 0.3,
    }
    report = {
        "faults": [],
        "restarts": 2,
        "snapshots": [],
        "goodput": {"wall_s": 500.0, "productive_s": 457.0, "goodput": 0.914, "badput": badput},
    }
    node_finished(node=node, exit_code=0, cancelled=False, log_tail="", summary={"steps": 30}, elastic=report)
    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=20000)
    page.wait_for_function(
        "() => document.getElementById('goodput-value').dataset.value === '0.914'", timeout=10000
    )
    assert page.inner_text("#goodput-value") == "91.4%"
    # the Elastic Training Index panel says the same goodput without a reload (issue 35: "Goodput — no
    # timeline recorded" beside a goodput card of 55.1%)
    page.wait_for_function(
        "() => document.querySelector('#eti-factors tr[data-factor=goodput] td.num')?.textContent.trim() === '0.914'",
        timeout=10000,
    )
    assert "no timeline recorded" not in page.inner_text("#eti-panel")
    # with faults, snapshots and goodput filled in, the page fits a 1,280 px window (nothing clipped)
    from tests.browser.test_crawl import OVERFLOW

    assert page.evaluate(OVERFLOW) == []
    seconds = page.eval_on_selector_all(
        "#badput-table tbody tr",
        "rows => Object.fromEntries(rows.map(r => [r.dataset.badput, Number(r.lastChild.dataset.value)]))",
    )
    assert seconds == badput
    assert "restart" in page.inner_text("#goodput-detail")
    restore = "#snapshot-table button[data-snapshot=step-00000010]"
    assert page.is_enabled(restore)

    # Restore from this snapshot: dismissing the confirm sends nothing; accepting posts to the API, whose
    # answer shows (the team's queue is full here, so no training starts: a 429 that says so)
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click(restore)
    assert TrainingJob.objects.get(pk=job.pk).attempts == 1
    for _ in range(MAX_ACTIVE_JOBS_PER_TEAM):
        TrainingJob.objects.create(team=team, name="waiting", config={}, attempts=1, state="queued")
    messages = []
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    page.click(restore)
    page.wait_for_selector("#action-error:not([hidden])", timeout=10000)
    assert "step-00000010 (step 10)" in messages[0]
    assert "queued or running" in page.inner_text("#action-error")
    assert TrainingJob.objects.get(pk=job.pk).attempts == 1

    # a page opened now draws the same from the rows and the stored history
    page.reload()
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    assert page.evaluate(FAULT_TRACE)["x"] == [12, 16]
    assert page.inner_text("#goodput-value") == "91.4%"
    assert page.locator("#snapshot-table tbody tr").count() == 4
    assert page.js_errors == []


def test_a_real_job_whose_rank_is_killed_shows_the_fault_and_goodput_and_restores_from_the_page(
    live_stack, page, alice
):
    """A 2-rank job that snapshots every 4 steps, rank 1 SIGKILLed once it committed step 10 (the recovery
    engine's ``kill-rank`` injection): torchrun restarts both ranks from the newest good snapshot, the page
    draws the fault where it happened with its RTO and the steps lost, the run ends succeeded with its
    goodput; then "Restore from this snapshot" runs a new attempt from the chosen step to the end."""
    from rest_framework.test import APIClient

    from controlplane.jobs.selectors import snapshot_rows
    from controlplane.live.models import StreamEvent
    from tests.integration.test_jobs import job_payload, wait_for_state

    client = APIClient()
    client.force_authenticate(alice)
    steps = 24
    r = client.post(
        "/api/jobs/",
        job_payload(
            steps=steps, profile_every=0, name="killed rank", snapshot_every=4, inject="kill-rank@step=10"
        ),
        format="json",
    )
    assert r.status_code == 201, r.content
    job_id = r.json()["id"]
    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/{job_id}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    assert "kill-rank@step=10" in page.inner_text("#job-inject")

    # the marker comes when the engine finds the killed rank, its RTO when the restarted group trains again
    page.wait_for_function(f"() => ({FAULT_TRACE})()?.x.length === 1", timeout=120000)
    page.wait_for_function(f"() => ({FAULT_TRACE})()?.hovertext[0].includes('RTO')", timeout=120000)
    job = wait_for_state(job_id, {"succeeded", "failed", "cancelled"}, timeout=180)
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=30000)

    [fault] = job.faults.all()
    assert (fault.kind, fault.rank, fault.attempt, fault.restart) == ("rank-killed", 1, 1, 0)
    assert fault.step >= 10 and fault.resumed_from_step % 4 == 0 and fault.resumed_from_step <= fault.step
    assert (
        fault.steps_lost == fault.step - fault.resumed_from_step
        and fault.snapshot == f"step-{fault.resumed_from_step:08d}"
    )
    assert fault.rto_s > 0 and fault.recovered_at is not None
    marker = page.evaluate(FAULT_TRACE)
    assert marker["x"] == [fault.step] and marker["text"] == ["rank-killed"]
    assert f"{fault.steps_lost} step(s) lost" in marker["hovertext"][0]
    assert f"resumed from step {fault.resumed_from_step} ({fault.snapshot})" in marker["hovertext"][0]
    assert page.locator("#job-events li[data-state=recovering]").count() == 1
    # the loss line goes back to the step after the snapshot (a gap, then the same steps again)
    xs = page.evaluate("() => document.getElementById('chart-loss').data[0].x")
    if fault.steps_lost:
        gap = xs.index(None)
        # the line before the gap ends at the last step the first group published: the step the engine
        # reports, or the one before it when the group was killed between committing that step and its
        # train event leaving the rank (CI ci11, 2026-12-07: the engine said 12, the stream held up to 11)
        stored = list(
            StreamEvent.objects.filter(stream=job.stream, kind="train")
            .order_by("seq")
            .values_list("step", flat=True)
        )
        first_run = stored[
            : next((i for i in range(1, len(stored)) if stored[i] <= stored[i - 1]), len(stored))
        ]
        assert xs[gap - 1] == first_run[-1] and fault.step - 1 <= first_run[-1] <= fault.step, (
            first_run,
            fault.step,
        )
        assert xs[gap + 1] == fault.resumed_from_step + 1 and xs[-1] == steps
    else:  # killed just after the snapshot it resumed from (the injector fires when it sees the step: late
        # under load, CI 2026-12-04): nothing trained again, one unbroken line
        assert None not in xs and xs == list(range(1, steps + 1))

    # goodput, as the engine measured it, with its badput parts
    page.wait_for_function(
        "() => document.getElementById('goodput-value').dataset.value !== undefined", timeout=20000
    )
    assert float(page.get_attribute("#goodput-value", "data-value")) == pytest.approx(job.goodput["goodput"])
    assert 0 < job.goodput["goodput"] < 1
    assert job.goodput["badput"]["lost_progress_s"] > 0 or not fault.steps_lost
    parts = page.eval_on_selector_all("#badput-table tbody tr", "rows => rows.map(r => r.dataset.badput)")
    assert set(parts) == set(job.goodput["badput"])

    # restore from the newest snapshot but one that is still on disk: a new attempt trains from there
    restorable = [s for s in snapshot_rows(job) if s["restorable"]]
    chosen = restorable[1]
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#snapshot-table button[data-snapshot={chosen['name']}]")
    page.wait_for_selector("#job-attempts:text('2')", timeout=10000)
    job = wait_for_state(job_id, {"succeeded", "failed", "cancelled"}, timeout=180)
    assert job.attempts == 2 and job.config["resume_from"] == chosen["name"]
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    assert (
        job.measured["resumed"]["from"] == chosen["name"] and job.measured["steps"] == steps - chosen["step"]
    )
    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=30000)
    assert page.js_errors == []
