"""A job that runs a user's own script (the SDK's DDP example) on its page in a real Chromium: the loss drawn
live as the script reports it (points appended, no gap), its own figure (``lr``) in the events, the script's
name in the jobs list, and a cancel from the page answered by the script stopping itself."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from tests.browser.test_job_pages import X_VALUES, log_in, wait_for_points, wait_for_train_events
from tests.integration.test_jobs import wait_for_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_a_user_script_trains_live_on_its_page_and_stops_when_cancelled(live_stack, page, alice, alice_api):
    from controlplane.jobs.models import TrainingJob

    code = Path(settings.CODE_ROOTS[0]) / f"test-{uuid.uuid4().hex[:8]}"
    code.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "sdk" / "ddp_loop.py", code / "ddp_loop.py")
    body = {
        "name": "my own loop",
        # ~0.1 s steps: the page sees them come
        "entrypoint": {
            "script": str(code / "ddp_loop.py"),
            "args": ["--steps", "100000", "--batch", "16", "--seq", "64"],
        },
        "steps": 100000,
        "device": "cpu",
        "snapshot_every": 1000,
    }
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    job = TrainingJob.objects.get(pk=r.json()["id"])

    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/")
    page.wait_for_selector(f"tr[data-job='{job.pk}']", timeout=15000)
    assert "ddp_loop.py" in page.inner_text(f"tr[data-job='{job.pk}']")
    wait_for_train_events(job, 3)
    page.goto(f"{live_stack.base_url}/jobs/{job.pk}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    n = wait_for_points(page, 3)
    wait_for_points(page, n + 5)  # appended live as the script reports
    xs = page.evaluate(X_VALUES, "chart-loss")
    assert xs == list(range(1, len(xs) + 1))
    assert wait_for_points(page, 0, chart="chart-tokens") > 0  # tokens/s from the tokens it reports

    page.once("dialog", lambda dialog: dialog.accept())  # "Cancel this job?"
    page.click("#cancel-button")
    page.wait_for_selector("#job-state[data-state=cancelled]", timeout=90000)
    job = wait_for_state(job.pk, {"cancelled", "failed", "succeeded"}, timeout=30)
    assert job.state == "cancelled" and "stopping after step" in job.log_tail
    assert page.js_errors == []
    shutil.rmtree(code, ignore_errors=True)
