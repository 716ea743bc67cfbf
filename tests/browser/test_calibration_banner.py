"""This machine's calibration on the pages, in a real Chromium against the real stack: uncalibrated, every
page says so with a "Calibrate now" button; the planner page has the fuller card instead of the banner; while
a calibration is under way the text follows its progress and the button waits, and when it is gone the
page says uncalibrated again without a reload. (The measuring itself, on the real worker, is
``tests/integration/test_calibration_api.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.test_job_pages import log_in
from tests.conftest import calibration_held

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


def test_every_page_says_when_predictions_here_are_uncalibrated_and_follows_a_calibration(
    live_stack, page, make_member
):
    make_member("alice", "Team A")
    base = live_stack.base_url
    directory = Path(live_stack.env["CANN_TRAIN_VAR_DIR"]) / "calibration"
    assert not (directory / "cpu.json").exists()
    log_in(page, base, "alice")
    for path in ("/", "/jobs/", "/clusters/", "/green/"):
        page.goto(base + path)
        banner = page.locator("#calibration-banner")
        expect(banner).to_contain_text("Uncalibrated: predictions for this machine")
        expect(banner.locator(".calibrate-button")).to_be_enabled()
    page.goto(base + "/planning/")
    expect(page.locator("#calibration-banner")).to_have_count(0)
    expect(page.locator("#calibration-card")).to_contain_text("Uncalibrated")

    with calibration_held(live_stack):
        (directory / "status.json").write_text(
            json.dumps({"state": "running", "what": "GEMM throughput by shape (fp32)", "fraction": 0.35})
        )
        page.goto(base + "/jobs/")
        banner = page.locator("#calibration-banner")
        expect(banner).to_contain_text("Calibrating this machine for the planner: GEMM throughput by shape")
        expect(banner).to_contain_text("(35%)")
        expect(banner.locator(".calibrate-button")).to_be_disabled()
        # a second request while it runs: the API's 409, shown beside the button
        answer = page.evaluate(
            """async () => { const r = await fetch('/api/calibration/', {method: 'POST', credentials: 'same-origin',
               headers: {'Content-Type': 'application/json', 'X-CSRFToken': document.cookie.match(/csrftoken=([^;]+)/)[1]},
               body: '{}'}); return r.status; }"""
        )
        assert answer == 409
    # the calibration is gone (failed or removed): the page, following it, says uncalibrated again
    expect(banner).to_contain_text("Uncalibrated", timeout=10_000)
    expect(banner.locator(".calibrate-button")).to_be_enabled()
    assert not page.js_errors, page.js_errors
