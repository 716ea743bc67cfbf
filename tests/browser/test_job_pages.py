"""The job pages in a real Chromium against the real stack: a 2-rank CPU job trains live on its page
(predicted vs measured step time, loss points appended as they come, the zoom kept, its fault risk and node
telemetry), the launch form, cancel from the page, and the compare page."""

from __future__ import annotations

import io
import time

import pytest
import requests
from pypdf import PdfReader
from rest_framework.test import APIClient

from tests.conftest import PASSWORD
from tests.integration.test_jobs import example, job_payload, wait_for_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

POINTS = "(id) => { const d = document.getElementById(id); return d && d.data ? d.data[0].x.length : -1; }"
X_VALUES = "(id) => document.getElementById(id).data[0].x"


def log_in(page, base_url: str, username: str) -> None:
    page.goto(base_url + "/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/")


def wait_for_points(page, more_than: int, chart: str = "chart-loss", timeout: float = 90) -> int:
    page.wait_for_function(
        "([id, n]) => { const d = document.getElementById(id); return d && d.data && d.data[0].x.length > n; }",
        arg=[chart, more_than],
        timeout=timeout * 1000,
    )
    return page.evaluate(POINTS, chart)


def wait_for_train_events(job, count: int, timeout: float = 90) -> None:
    from controlplane.live.models import StreamEvent

    deadline = time.monotonic() + timeout
    while StreamEvent.objects.filter(stream=job.stream, kind="train").count() < count:
        assert time.monotonic() < deadline, f"fewer than {count} train events of {job.stream} stored"
        time.sleep(0.2)


@pytest.mark.long
def test_planned_job_trains_live_on_its_page_and_ends_succeeded(live_stack, page, alice, token_for, tmp_path):
    from controlplane.jobs.models import TrainingJob

    client = APIClient()
    client.force_authenticate(alice)
    plan = {
        "strategy": example("dp2.json"),
        "predicted": {
            "step_time_s": 0.05,
            "tokens_per_s": 5120.0,
            # the cost model's communication: 0.02 s of DP all-reduce, 0.005 s of it exposed -> 75 % hidden
            "comm_s": {"tp": 0.0, "pp": 0.0, "dp": 0.02, "ep": 0.0, "cp": 0.0},
            "exposed_comm_s": 0.005,
        },
    }
    steps = 40
    r = client.post(
        "/api/jobs/",
        job_payload(steps=steps, plan=plan, profile_every=5, name="planned-live"),
        format="json",
    )
    assert r.status_code == 201, r.content
    job_id = r.json()["id"]

    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/{job_id}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    assert page.inner_text("#predicted-step-time") == "50.0 ms"
    first = page.evaluate(POINTS, "chart-loss")
    assert 0 <= first < steps, "the page opened after the run ended: nothing left to see live"

    # points arrive one by one while the page stays open
    seen = wait_for_points(page, max(first, 1))
    more = wait_for_points(page, seen)
    assert first < seen < more
    # the measured step time shows up beside the prediction while the job runs
    page.wait_for_function(
        "() => document.getElementById('measured-step-time').dataset.value !== undefined", timeout=60000
    )

    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=120000)
    job = TrainingJob.objects.get(pk=job_id)
    assert job.state == "succeeded"
    # the header, figures, log and timeline updated without a reload
    page.wait_for_function("() => document.getElementById('job-log').textContent.length > 40", timeout=10000)
    assert page.evaluate(POINTS, "chart-loss") == steps
    assert page.evaluate(X_VALUES, "chart-loss") == list(range(1, steps + 1))  # no duplicate, no gap
    measured = float(page.get_attribute("#measured-step-time", "data-value"))
    assert measured == pytest.approx(job.measured["step_time_s"])
    ratio = float(page.get_attribute("#step-time-ratio", "data-value"))
    assert ratio == pytest.approx(job.measured["step_time_s"] / 0.05)
    # the overlap ratio: measured on the profiled steps (every collective), the plan's beside it
    assert page.inner_text("#predicted-overlap") == "75.0%"
    assert "profiler" in job.measured["overlap_source"] and 0 <= job.measured["overlap_ratio"] <= 1
    page.wait_for_function(
        "(v) => Number(document.getElementById('measured-overlap').dataset.value) === v",
        arg=job.measured["overlap_ratio"],
        timeout=10000,
    )
    assert "run summary" in page.inner_text("#overlap-note")
    states = page.eval_on_selector_all("#job-events li", "els => els.map(e => e.dataset.state)")
    assert (
        states[0] == "queued" and "started" in states and "finished" in states and states[-1] == "succeeded"
    )
    assert page.is_hidden("#cancel-button")
    # the step-time split: compute and exposed comm from the profiled steps, stacked under the prediction
    split = page.evaluate(
        "() => document.getElementById('chart-step').data.map(t => t.y.reduce((a, b) => a + b, 0))"
    )
    assert split[0] > 0 and len(split) == 4
    shapes = page.evaluate("() => document.getElementById('chart-step').layout.shapes.map(s => s.y0)")
    assert shapes == [0.05]
    # the loss smoothing slider recomputes the smoothed trace client-side
    raw_last = page.evaluate("() => document.getElementById('chart-loss').data[1].y.at(-1)")
    page.eval_on_selector(
        "#loss-smoothing", "el => { el.value = '0'; el.dispatchEvent(new Event('input')); }"
    )
    assert page.evaluate("() => document.getElementById('chart-loss').data[1].y.at(-1)") == pytest.approx(
        job.measured["loss_last"], rel=1e-4
    )
    assert raw_last != page.evaluate("() => document.getElementById('chart-loss').data[1].y.at(-1)")

    # energy and carbon, live from the job's energy events: an estimate on this machine, and labelled so
    page.wait_for_function(
        "() => document.getElementById('energy-kgco2e').dataset.value !== undefined", timeout=30000
    )
    assert float(page.get_attribute("#energy-kwh", "data-value")) > 0
    assert float(page.get_attribute("#energy-kgco2e", "data-value")) > 0
    assert page.inner_text("#energy-method") == "estimate" and page.is_visible("#energy-estimate")
    assert "Estimated, not measured" in page.inner_text("#energy-estimate")
    assert "history" in page.inner_text("#energy-intensity")  # GB's 2020 history standing in, and said so
    assert page.evaluate("() => document.getElementById('chart-energy').data[0].x.length") == steps // 5

    # the energy and carbon report: issued and downloaded from the page, its text read back
    with page.expect_download(timeout=60000) as download:
        page.click("#report-button")
    pdf = download.value.path().read_bytes()
    code = page.get_attribute("#report-code", "data-code")
    text = "\n".join(p.extract_text() for p in PdfReader(io.BytesIO(pdf)).pages)
    assert pdf.startswith(b"%PDF") and code in text and "estimate" in text.lower() and "planned-live" in text
    # verified by the server that issued it (its secret key signs the code)
    check = requests.post(
        f"{live_stack.base_url}/api/certificates/{code}/verify",
        headers={"Authorization": f"Token {token_for(alice)}"},
        files={"file": ("report.pdf", pdf, "application/pdf")},
        timeout=60,
    )
    assert check.status_code == 200 and check.json()["valid"], check.content
    # the page's "verify" link opens the report's page, which verifies it and checks an uploaded copy
    job_url = page.url
    with page.expect_navigation():
        page.click("#report-code a")
    assert page.url.endswith(f"/green/reports/{code}/")
    assert page.get_attribute("#report-verification", "data-valid") == "true"
    assert page.inner_text("#verdict").startswith("Verified.") and page.is_visible("#report-estimate")
    saved = tmp_path / "report.pdf"
    saved.write_bytes(pdf)
    page.set_input_files("#pdf-check input[type=file]", str(saved))
    with page.expect_navigation():
        page.click("#pdf-check button[type=submit]")
    assert "uploaded PDF" in page.inner_text("#verdict") and page.inner_text("#pdf-errors") == ""
    page.goto(job_url)

    # a page opened after the run draws the same points from the stored history
    page.reload()
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    assert page.evaluate(X_VALUES, "chart-loss") == list(range(1, steps + 1))
    assert page.inner_text("#job-state") == "succeeded"
    assert code in page.inner_text("#report-code")  # the report issued before
    assert float(page.get_attribute("#energy-kwh", "data-value")) > 0
    assert page.js_errors == []


def test_launch_form_then_reload_mid_run_keeps_zoom_and_cancel_ends_it(live_stack, page, alice):
    from controlplane.jobs.models import TrainingJob

    log_in(page, live_stack.base_url, "alice")
    page.goto(live_stack.base_url + "/jobs/")
    page.fill("#launch-form input[name=name]", "from-the-form")
    page.select_option("#launch-form select[name=model]", "tiny-dense")
    page.select_option("#launch-form select[name=strategy]", "dp2")
    page.fill("#launch-form input[name=steps]", "100000")
    page.fill("#launch-form input[name=profile_every]", "0")
    page.click("#launch-button")
    page.wait_for_url(f"{live_stack.base_url}/jobs/*/")
    job = TrainingJob.objects.get(name="from-the-form")
    assert page.url.endswith(f"/jobs/{job.pk}/")
    assert job.world_size == 2 and job.config["device"] == "cpu" and job.plan is None
    assert page.inner_text("#predicted-step-time") == "no plan"

    # open it again mid-run: the stored history first, then live points, no duplicate and no gap
    wait_for_train_events(job, 3)
    page.reload()
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    n = wait_for_points(page, 3)
    n = wait_for_points(page, n + 2)
    xs = page.evaluate(X_VALUES, "chart-loss")
    assert xs == list(range(1, len(xs) + 1))

    # a zoom the user chose survives new points
    page.evaluate("() => Plotly.relayout('chart-loss', {'xaxis.range': [1, 3]})")
    wait_for_points(page, page.evaluate(POINTS, "chart-loss") + 3)
    assert page.evaluate("() => document.getElementById('chart-loss').layout.xaxis.range") == [1, 3]

    # fault risk, from the node supervisor's telemetry and risk events: two ranks are too few to find a
    # straggler, no failure model is configured, and a job without snapshots is unprotected
    page.wait_for_function(
        "() => document.querySelector('#risk-nodes .straggler')?.textContent"
        ".includes('2 rank(s): a straggler needs at least 3')",
        timeout=30000,
    )
    assert "no failure model configured" in page.inner_text("#risk-nodes .failure-model")
    assert page.get_attribute("#risk-badge", "data-badge") == "unprotected"
    page.wait_for_function(
        "() => document.querySelector('#telemetry-nodes .chart')?.data"
        "?.some(t => t.meta === 'cpu.util_pct' && t.y.some(y => y != null))",
        timeout=15000,
    )
    assert page.locator("#telemetry-nodes .absent-sources li").count() >= 1  # npu-smi or NVML, with why
    # the dashboard's row of the running job carries the same badge
    dashboard = page.context.new_page()
    dashboard.goto(live_stack.base_url + "/")
    badge = f"#dashboard-jobs tr[data-job='{job.pk}'] .risk-badge[data-badge=unprotected]"
    dashboard.wait_for_selector(badge, timeout=15000)
    assert "no snapshots" in dashboard.get_attribute(badge, "title")
    dashboard.close()

    # a cancel asks first: dismissed, nothing is sent and the job runs on
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click("#cancel-button")
    assert asked and asked[0].startswith("Cancel this job?") and "snapshots are kept" in asked[0]
    assert page.get_attribute("#job-state", "data-state") == "running" and page.is_enabled("#cancel-button")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-button")
    page.wait_for_selector("#job-state[data-state=cancelled]", timeout=60000)
    assert wait_for_state(job.pk, {"cancelled", "failed", "succeeded"}, timeout=30).state == "cancelled"
    # a job that no longer runs has no live risk, on its page as in the dashboard's row (issue 35: the page
    # kept "low" or "unprotected" while the lists showed "—")
    page.wait_for_selector("#risk-badge[data-badge=none]", timeout=10000)
    assert page.get_attribute("#risk-badge", "title") == "not running: no live risk score"
    assert page.is_visible("#relaunch-button") and page.is_hidden("#cancel-button")
    assert page.js_errors == []


def test_compare_page_overlays_two_jobs_and_appends_the_running_one(live_stack, page, alice):
    from controlplane.jobs.models import TrainingJob
    from controlplane.live.services import publish

    team = alice.teams.first()
    done = TrainingJob.objects.create(
        team=team, name="done", state="succeeded", config={"strategy": example("dp2.json")}
    )
    running = TrainingJob.objects.create(
        team=team, name="running", state="running", config={"strategy": example("single.json")}
    )

    def train(job, step):
        values = {"loss": 6.0 - 0.1 * step, "tokens_per_s": 1000.0 + step, "step_time_s": 0.1}
        publish(job.stream, "train", values, step=step)

    for step in range(1, 6):
        train(done, step)
    for step in range(1, 4):
        train(running, step)
    wait_for_train_events(done, 5)
    wait_for_train_events(running, 3)

    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/compare/?ids={done.pk},{running.pk}")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    lengths = "(id) => document.getElementById(id).data.map(t => t.x.length)"
    assert page.evaluate(lengths, "compare-loss") == [5, 3]
    assert page.evaluate(lengths, "compare-tokens") == [5, 3]
    names = page.evaluate("() => document.getElementById('compare-loss').data.map(t => t.name)")
    assert names == [f"#{done.pk} done (tp1-pp1-dp2-ep1)", f"#{running.pk} running (tp1-pp1-dp1-ep1)"]

    train(running, 4)
    publish(running.stream, "event", {"state": "succeeded"})
    page.wait_for_function(
        "() => document.getElementById('compare-loss').data[1].x.length === 4", timeout=20000
    )
    page.wait_for_selector(f"#compared-jobs tr[data-job='{running.pk}'] .state[data-state=succeeded]")

    # from the list: tick two jobs, Compare
    page.goto(live_stack.base_url + "/jobs/")
    page.check(f"input.pick[value='{done.pk}']")
    page.check(f"input.pick[value='{running.pk}']")
    page.click("#compare-button")
    page.wait_for_url(f"**/jobs/compare/?ids={done.pk}%2C{running.pk}")
    assert page.locator("#compared-jobs tbody tr").count() == 2
    assert page.js_errors == []


def test_fault_risk_panel_shows_a_flagged_rank_its_reason_and_the_failure_models_training_data(
    live_stack, page, alice
):
    """Risk and telemetry events published as a node's supervisor does (no training): a flagged rank makes
    the job high on the dashboard and its page (the reason, the flag on the timeline and the risk chart, the
    failure model's training data, the prevention action it set off); a metric the fixed series leave out
    can be charted; a cleared flag comes live."""
    from controlplane.jobs.models import TrainingJob
    from controlplane.live.models import StreamEvent
    from controlplane.live.services import publish

    job = TrainingJob.objects.create(
        team=alice.teams.first(), name="risky", state="running", attempts=1, config={}
    )
    reason = "rank 3 spent on average 46% of the time computing (not waiting) beyond the median rank"
    failure = {"risk": 0.12, "model": "lstm", "trained_on": "42 simulated node-days (Llama 3 Table 5)"}
    straggler = {"signal": "compute", "steps_scored": 120, "buckets_scored": 9, "min_ranks": 3}

    def telemetry(step, cpu):
        metrics = {"cpu.util_pct": cpu, "mem.used_pct": 5.2, "gpu0.power_W": 212.0}
        metrics |= {f"job.rank{r}.step_time_p50_s": 0.05 + 0.1 * (r == 3) for r in range(4)}
        values = {"node": "node-a", "node_rank": 0, "attempt": 1, "metrics": metrics}
        absent = {"absent": {"npu-smi": "npu-smi is not on PATH"}} if step == 1 else {}  # sent once
        publish(job.stream, "telemetry", values | absent, step)

    def risk(step, score, flag=None):
        flagged = score == 1.0
        rank = dict(rank=3, score=score, share=0.45, flagged=flagged, reason=reason if flagged else None)
        values = {"node": "node-a", "node_rank": 0, "attempt": 1, "risk": score, "ranks": [rank]}
        values |= {"level": "high" if score >= 0.85 else "low", "straggler": straggler, "failure": failure}
        publish(job.stream, "risk", values | ({"flag": flag} if flag else {}), step)

    telemetry(1, 50.0)
    risk(1, 0.12)
    flag = {"rank": 3, "event": "raised", "reason": reason, "score": 1.0, "share": 0.45, "step": 118}
    risk(118, 1.0, flag)
    # the prevention policy's answer, an event of its own that carries no scores
    action = {"action": "snapshot-now", "status": "refused", "risk": 1.0, "reason": reason}
    action["note"] = "the job takes no snapshots: nothing to protect it with"
    node_a = {"node": "node-a", "node_rank": 0, "attempt": 1}
    publish(job.stream, "risk", node_a | {"risk": 1.0, "level": "high", "action": action}, 118)
    telemetry(120, 90.0)
    deadline = time.monotonic() + 20
    while StreamEvent.objects.filter(stream=job.stream).count() < 5:
        assert time.monotonic() < deadline, "the relay did not store the events"
        time.sleep(0.2)

    log_in(page, live_stack.base_url, "alice")
    badge = f"#dashboard-jobs tr[data-job='{job.pk}'] .risk-badge[data-badge=high]"
    page.wait_for_selector(badge, timeout=15000)
    assert page.get_attribute(badge, "title").startswith("risk 1.00 (high)")

    page.goto(f"{live_stack.base_url}/jobs/{job.pk}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    assert page.get_attribute("#risk-badge", "data-badge") == "high"
    node = page.inner_text("#risk-nodes .risk-node[data-node=node-a]")
    assert "rank 3" in node and reason in node and "42 simulated node-days" in node and "9 bucket(s)" in node
    assert "at step 118" in page.inner_text("#risk-flags li[data-event=raised]")
    refused = page.inner_text("#risk-flags li[data-action=snapshot-now][data-status=refused]")
    assert "nothing to protect it with" in refused
    names = page.evaluate("() => document.getElementById('chart-risk').data.map(t => t.name)")
    assert names == ["node-a", "flag raised", "actions"]
    telemetry_names = page.evaluate(
        "() => document.querySelector('#telemetry-nodes .chart').data.map(t => t.name)"
    )
    assert telemetry_names[:2] == ["CPU util %", "memory used %"] and len(telemetry_names) == 6
    page.select_option("#telemetry-extra", "gpu0.power_W")  # any other metric the node reports
    last = page.evaluate("() => document.querySelector('#telemetry-nodes .chart').data.at(-1)")
    assert last["name"] == "gpu0.power_W" and last["y"] == [212.0, 212.0]
    assert "npu-smi is not on PATH" in page.inner_text("#telemetry-nodes .absent-sources")

    # live: the flag clears; the node is low again, which for a job without snapshots is "unprotected"
    risk(130, 0.1, flag | {"event": "cleared", "step": 130})
    page.wait_for_selector("#risk-flags li[data-event=cleared]", timeout=15000)
    page.wait_for_selector("#risk-badge[data-badge=unprotected]", timeout=15000)
    assert page.js_errors == []
