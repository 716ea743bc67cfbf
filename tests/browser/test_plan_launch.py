"""From a plan page: Launch → the job page shows a 2-rank CPU run live with predicted vs measured step
time → the finished job's figures land beside the plan's prediction in the knowledge base."""

from __future__ import annotations

import pytest

from tests.conftest import PASSWORD, import_tiny_cpu_plan

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


def test_launch_from_a_plan_page_trains_live_and_the_plan_learns(live_stack, page, make_member):
    from rest_framework.test import APIClient

    from controlplane.planning.models import StoredPlan

    alice = make_member("alice", "Team A")
    api = APIClient()
    api.force_authenticate(alice)
    imported = import_tiny_cpu_plan(api)
    plan_id, predicted = imported["id"], imported["predicted"]["step_time_s"]

    page.goto(live_stack.base_url + f"/login/?next=/planning/plans/{plan_id}/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"**/planning/plans/{plan_id}/")
    page.wait_for_selector("#view-memory[data-ready='1']", timeout=20000)
    page.fill("#launch input[name=steps]", "12")
    page.click("#launch button[type=submit]")
    page.wait_for_url("**/jobs/*/", timeout=20000)
    job_id = int(page.url.rstrip("/").split("/")[-1])

    # predicted beside measured on the job page, the measured one filling in live
    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=180000)
    assert page.inner_text("#predicted-step-time") != "—"
    assert page.inner_text("#measured-step-time") != "—"
    points = page.evaluate("document.querySelector('#chart-loss').data[0].x.length")
    assert points == 12

    plan = StoredPlan.objects.get(pk=plan_id)
    assert plan.measured["step_time_s"] > 0 and plan.measured_source == f"job/{job_id}"
    assert plan.predicted["step_time_s"] == predicted
    page.goto(live_stack.base_url + f"/planning/plans/{plan_id}/")
    page.wait_for_selector("#view-measured[data-ready='1']", timeout=20000)
    assert page.js_errors == []
