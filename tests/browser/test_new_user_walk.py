"""A new user's walk (issue 35), in a real Chromium at 1,280 px against the real stack, on a fresh database:
a plan that runs here launched from its page with snapshots and two faults (a rank killed at step 8, a rank
hung for good at step 20); the page's risk rises while the rank hangs and the hang is cut early, not at the
60 s timeout; the job's figures agree on its list row, its page and the API; its energy report covers the
whole job (both restarts, the steps trained twice as badput) and says so; a copy with an altered figure
does not verify, by its page or by anyone without an account, while the genuine one does; no page of the walk
is wider than the window."""

from __future__ import annotations

import re

import pytest
import requests
from playwright.sync_api import expect
from rest_framework.test import APIClient

from tests.browser.test_crawl import OVERFLOW, VIEWPORT_PX
from tests.browser.test_plan_launch_options import launched_job, open_plan_options
from tests.conftest import import_tiny_cpu_plan
from tests.integration.test_jobs import wait_for_state

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.long,
]

STEPS = 40
FAULTS = "kill-rank@step=8,hang-rank@step=20:rank=1"


def fits(page, where: str) -> None:
    assert page.evaluate(OVERFLOW) == [], f"{where} is wider than {VIEWPORT_PX} px"


def test_a_new_user_walks_a_faulted_job_to_a_report_anyone_can_check(live_stack, page, browser, make_member):
    from controlplane.green.certificate_models import GreenCertificate
    from workers.green.certificate import render_pdf

    alice = make_member("alice", "Walk team")
    api = APIClient()
    api.force_authenticate(alice)
    base = live_stack.base_url
    plan_id = import_tiny_cpu_plan(api)["id"]
    page.set_viewport_size({"width": VIEWPORT_PX, "height": 900})

    # launched from the plan page, with snapshots and the faults to inject among its options
    open_plan_options(page, base, plan_id, log_in=True)
    fits(page, "the plan page with its launch options open")
    page.fill("#launch [name=steps]", str(STEPS))
    page.fill("#launch [name=snapshot_every]", "4")
    page.fill("#launch [name=inject]", FAULTS)
    job = launched_job(page, api)
    assert job["config"]["inject"] == FAULTS and job["config"]["snapshot_every"] == 4

    # the hung rank: the risk rises on the page while no step is committed (it stayed "low" for 60 s)
    expect(page.locator("#risk-badge")).to_have_attribute(
        "data-badge", re.compile("medium|high"), timeout=90_000
    )
    ended = wait_for_state(job["id"], {"succeeded", "failed"}, timeout=240)
    assert ended.state == "succeeded", (ended.human_readable_error, ended.log_tail[-2000:])
    expect(page.locator("#job-state")).to_have_text("succeeded", timeout=30_000)
    detail = api.get(f"/api/jobs/{job['id']}/").json()
    kinds = [f["kind"] for f in detail["faults"]]
    assert kinds == ["rank-killed", "rank-hung"], detail["faults"]
    hang = detail["faults"][1]
    assert "cut early by the job's risk policy" in hang["message"], hang["message"]
    assert ("cut-hang", "requested") in [(a["action"], a["status"]) for a in detail["risk"]["actions"]]
    expect(page.locator("#fault-table tbody tr")).to_have_count(2)
    fits(page, "the job page with its faults")

    # one figure, one value: the list row, the job page and the API
    row = api.get(f"/api/jobs/rows/?ids={job['id']}").json()[0]
    page_step = page.inner_text("#measured-step-time")
    page.goto(f"{base}/jobs/")
    fits(page, "the jobs list")
    listed = page.locator(f"tr[data-job='{job['id']}'] td[data-col=measured]").inner_text()
    s = row["measured_step_time_s"]
    shown = f"{s * 1000:.{2 if s < 0.01 else 1}f} ms" if s < 1 else f"{s:.3f} s"  # formatSeconds, common.js
    assert shown in listed and shown in page_step, (listed, page_step, row)

    # the report: issued from the job page; it covers the whole job and says so in its headline
    page.goto(f"{base}/jobs/{job['id']}/")
    with page.expect_download(timeout=90_000) as download:
        page.click("#report-button")
    pdf = download.value.path().read_bytes()
    code = page.get_attribute("#report-code", "data-code")
    report = GreenCertificate.objects.get(code=code)
    results = report.document["results"]
    segments = [(s["attempt"], s["restart"]) for s in results["segments"]]
    assert segments == [(1, 0), (1, 1), (1, 2)], segments
    assert results["recomputed"]["steps"] > 0 and results["recomputed"]["kwh_facility"] > 0
    with page.expect_navigation():
        page.click("#report-code a")
    expect(page.locator("#report-covers")).to_contain_text("Covers the whole job: 1 attempt and 2 restarts")
    expect(page.locator("#report-segments tbody tr")).to_have_count(3)
    expect(page.locator("#verdict")).to_contain_text("Verified.")
    fits(page, "the report's page")

    # a copy with one printed figure cut by 80% does not verify, named; the genuine copy does
    forged = {**report.document, "results": {**results, "kwh": {**results["kwh"]}}}
    forged["results"]["kwh"]["facility"] = round(results["kwh"]["facility"] * 0.2, 9)
    page.set_input_files(
        "#pdf-check input[type=file]",
        files=[{"name": "forwarded.pdf", "mimeType": "application/pdf", "buffer": render_pdf(forged)}],
    )
    with page.expect_navigation():
        page.click("#pdf-check button[type=submit]")
    expect(page.locator("#verdict")).to_contain_text("Does not verify")
    expect(page.locator("#pdf-mismatches")).to_contain_text("Facility energy (IT energy x PUE)")

    # anyone holding the report checks it by its code, with no account: the same verdicts
    anonymous = browser.new_context()
    try:
        url = f"{base}/api/public/certificates/{code}/verify"
        genuine = anonymous.request.post(url, multipart={"file": {"name": "r.pdf", "mimeType": "application/pdf",
                                                                  "buffer": pdf}})  # fmt: skip
        assert genuine.status == 200 and genuine.json()["valid"], genuine.text()
        tampered = anonymous.request.post(url, multipart={"file": {"name": "r.pdf", "mimeType": "application/pdf",
                                                                   "buffer": render_pdf(forged)}})  # fmt: skip
        assert tampered.status == 200 and not tampered.json()["valid"]
        assert anonymous.request.get(f"{base}/api/jobs/{job['id']}/").status in (401, 403)
    finally:
        anonymous.close()
    assert requests.get(url, timeout=30).json()["valid"]
    assert not page.js_errors, page.js_errors
