"""The job page in a real Chromium against the real stack: each attempt of a relaunched job is its own
trace (and the compare page does not join them), the log streams while the job runs with the noise left
out, a cancel reads "Cancelled by <user>", charts wait for the first step with the time since launch, and
the plan and job pages write measured against predicted the same way, with the uncalibrated-cpu caveat."""

from __future__ import annotations

import os
import re

import pytest

from tests.browser.test_job_pages import log_in, wait_for_points
from tests.conftest import import_tiny_cpu_plan
from tests.integration.test_jobs import job_payload, wait_for_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

NAMES = "(id) => document.getElementById(id).data.map(t => t.name)"
LOG = "() => document.getElementById('job-log').textContent"


def shot(page, name: str) -> None:
    """A screenshot for a person to look at, when CANN_TRAIN_SCREENSHOTS names a folder."""
    if folder := os.environ.get("CANN_TRAIN_SCREENSHOTS"):
        page.screenshot(path=f"{folder}/{name}.png", full_page=True)


@pytest.mark.long
def test_relaunch_is_a_trace_of_its_own_and_the_log_streams_while_it_runs(live_stack, page, alice_api):
    r = alice_api.post("/api/jobs/", job_payload(steps=100000, profile_every=2, name="twice"), format="json")
    assert r.status_code == 201, r.content
    job = r.json()
    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/{job['id']}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)

    # the log grows while the job runs: the runtime's step lines, never the profiler's markers
    page.wait_for_function(
        "() => /^step \\d+\\/100000/m.test(document.getElementById('job-log').textContent)", timeout=90000
    )
    assert page.get_attribute("#job-state", "data-state") == "running"
    first_lines = int(page.get_attribute("#job-log", "data-lines"))
    page.wait_for_function(
        "(n) => Number(document.getElementById('job-log').dataset.lines) > n", arg=first_lines, timeout=30000
    )
    assert "profiler_" not in page.evaluate(LOG) and "FutureWarning" not in page.evaluate(LOG)
    wait_for_points(page, 4)

    page.once("dialog", lambda dialog: dialog.accept())  # "Cancel this job?"
    page.click("#cancel-button")
    page.wait_for_selector("#job-state[data-state=cancelled]", timeout=60000)
    page.wait_for_selector("#job-error:not([hidden])", timeout=10000)
    assert page.inner_text("#job-error") == "Cancelled by alice."
    assert page.get_attribute("#job-error", "class") == "muted"
    assert "Traceback" not in page.evaluate(LOG) and "SignalException" not in page.evaluate(LOG)
    attempt_1_steps = page.evaluate("() => document.getElementById('chart-loss').data[0].x.length")

    page.click("#relaunch-button")
    page.wait_for_function(
        "() => { const d = document.getElementById('chart-loss').data; return d.length === 6 && d[3].x.length >= 4; }",
        timeout=90000,
    )
    # attempt 1 keeps its line; attempt 2 is a new trace, from step 1, in every chart
    assert page.evaluate(NAMES, "chart-tokens") == ["attempt 1", "attempt 2"]
    assert page.evaluate(NAMES, "chart-memory") == ["attempt 1", "attempt 2"]
    assert page.evaluate(NAMES, "chart-loss") == [
        "attempt 1 (raw)",
        "attempt 1",
        "attempt 1 validation",  # empty and out of the legend: the job has no validation split
        "attempt 2 (raw)",
        "attempt 2",
        "attempt 2 validation",
    ]
    legend = "() => document.getElementById('chart-loss').data.map(t => t.showlegend !== false)"
    assert page.evaluate(legend) == [False, True, False, False, True, False]
    step_groups = page.evaluate("() => document.getElementById('chart-step').data.map(t => t.legendgroup)")
    assert step_groups == ["attempt-1"] * 4 + ["attempt-2"] * 4
    xs = page.evaluate("() => document.getElementById('chart-loss').data.map(t => t.x)")
    assert len(xs[0]) >= attempt_1_steps and xs[0][:3] == [1, 2, 3]
    assert xs[3][:4] == [1, 2, 3, 4] and xs[2] == [] and xs[5] == []
    # the energy chart (the job's totals over its attempts) breaks where attempt 2 starts again at step 1,
    # instead of joining it onto attempt 1 as one zig-zag line
    page.wait_for_function(
        "() => document.getElementById('chart-energy').data[0].x.includes(null)", timeout=90000
    )
    energy_x = page.evaluate("() => document.getElementById('chart-energy').data[0].x")
    gap = energy_x.index(None)
    assert gap > 0 and energy_x[gap + 1] <= energy_x[gap - 1] and energy_x.count(None) == 1
    # profiled steps (every 2nd) are not on the throughput line
    tokens_x = page.evaluate("() => document.getElementById('chart-tokens').data[1].x")
    assert tokens_x[:2] == [1, 3] and all(x % 2 for x in tokens_x)
    assert page.inner_text("#job-attempts") == "2"
    page.wait_for_function("() => document.getElementById('job-log').textContent.includes('── attempt 2 ──')")
    shot(page, "job-two-attempts")

    alice_api.post(f"/api/jobs/{job['id']}/cancel/")
    page.wait_for_selector("#job-state[data-state=cancelled]", timeout=60000)
    wait_for_state(job["id"], {"cancelled"}, timeout=30)

    # the compare page: one line per attempt, none joining attempt 1's last step to attempt 2's first
    page.goto(f"{live_stack.base_url}/jobs/compare/?ids={job['id']}")
    page.wait_for_function("() => document.getElementById('compare-loss')?.data?.length === 2")
    name = f"#{job['id']} twice (tp1-pp1-dp2-ep1)"
    assert page.evaluate(NAMES, "compare-loss") == [f"{name} · attempt 1", f"{name} · attempt 2"]
    for x in page.evaluate("() => document.getElementById('compare-loss').data.map(t => t.x)"):
        assert x[0] == 1 and x == sorted(set(x))
    shot(page, "compare-two-attempts")
    assert page.js_errors == []


def test_charts_wait_for_the_first_step_and_say_since_when(live_stack, page, alice):
    from controlplane.jobs.models import TrainingJob
    from controlplane.live.services import publish

    job = TrainingJob.objects.create(
        team=alice.teams.first(), name="waiting", state="queued", attempts=1, config={"steps": 10}
    )
    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/{job.pk}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    waiting = page.locator(".chart-waiting")
    assert waiting.count() == 4 and all(waiting.nth(i).is_visible() for i in range(4))
    pattern = re.compile(r"^waiting for the first step \(launched (\d+) s ago\)$")
    first = int(pattern.match(waiting.first.inner_text()).group(1))
    page.wait_for_function(
        "(n) => { const m = document.querySelector('.chart-waiting').textContent.match(/launched (\\d+) s/); return m && Number(m[1]) > n; }",
        arg=first,
        timeout=5000,
    )
    shot(page, "job-waiting")

    values = {"attempt": 1, "loss": 5.0, "tokens_per_s": 1000.0, "step_time_s": 0.1, "memory_GiB": 0.1}
    publish(job.stream, "train", values, step=1)
    page.wait_for_function(
        "() => document.getElementById('chart-loss').data[0].x.length === 1", timeout=20000
    )
    page.wait_for_selector(".chart-waiting", state="hidden")
    assert all(waiting.nth(i).is_hidden() for i in range(4))
    assert page.js_errors == []


def test_plan_and_job_pages_write_measured_against_predicted_alike(
    live_stack, page, alice, alice_api, tmp_path, monkeypatch
):
    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))  # no `cann-train calibrate` output here
    plan = import_tiny_cpu_plan(alice_api)
    r = alice_api.post("/api/jobs/", {"name": "measured", "plan_id": plan["id"], "steps": 8}, format="json")
    assert r.status_code == 201, r.content
    assert wait_for_state(r.json()["id"], {"succeeded", "failed"}).state == "succeeded"

    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/{r.json()['id']}/")
    page.wait_for_function("() => document.getElementById('step-time-ratio').dataset.value !== undefined")
    on_job_page = page.inner_text("#step-time-ratio")
    assert re.fullmatch(r"[\d,.]+×", on_job_page), on_job_page
    assert "Uncalibrated: run `cann-train calibrate`" in page.inner_text("#prediction-caveat")
    shot(page, "job-vs-predicted")

    page.goto(f"{live_stack.base_url}/planning/plans/{plan['id']}/")
    cell = "#view-measured tr[data-field=step_time_s] td:last-child"
    page.wait_for_selector(cell)
    assert page.inner_text(cell) == on_job_page
    assert "uncalibrated: run `cann-train calibrate`" in page.inner_text(".prediction-caveat")
    assert "uncalibrated" in page.inner_text("#plan-caveat")
    shot(page, "plan-vs-predicted")
    assert page.js_errors == []
