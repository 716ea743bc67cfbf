"""The plan page's Launch form reaches the options the job API has (issue 35): under "Options", the node
count, the communication hook, the hang timeout and restarts, the risk policy, snapshots, the grid zone, PUE
and price, a carbon-aware start or a stored green schedule. What is set reaches the job (read back through
``GET /api/jobs/<id>/``); a value the API refuses is its message beside the form and beside the field, and
no job is made."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.browser.test_crawl import OVERFLOW, VIEWPORT_PX
from tests.conftest import PASSWORD, import_tiny_cpu_plan
from tests.integration.test_job_schedules import stored_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


def open_plan_options(page, base_url: str, plan_id: int, *, log_in: bool) -> None:
    if log_in:
        page.goto(base_url + f"/login/?next=/planning/plans/{plan_id}/")
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"**/planning/plans/{plan_id}/")
    else:
        page.goto(base_url + f"/planning/plans/{plan_id}/")
    page.wait_for_selector("#view-memory[data-ready='1']", timeout=20000)
    page.click("#launch-options > summary")


def launched_job(page, api) -> dict:
    page.click("#launch button[type=submit]")
    page.wait_for_function(
        "() => location.pathname.startsWith('/jobs/') || document.querySelector('#launch .launch-errors li.error')",
        timeout=20000,
    )
    if "/jobs/" not in page.url:
        raise AssertionError(f"launch refused: {page.inner_text('#launch .launch-errors')}")
    page.wait_for_url("**/jobs/*/", timeout=20000)
    job_id = int(page.url.rstrip("/").split("/")[-1])
    r = api.get(f"/api/jobs/{job_id}/")
    assert r.status_code == 200, r.content
    return r.json()


def test_each_launch_option_set_in_the_form_reaches_the_job(live_stack, page, make_member):
    alice = make_member("alice", "Team A")
    api = APIClient()
    api.force_authenticate(alice)
    plan_id = import_tiny_cpu_plan(api)["id"]  # dp2: two ranks, on one node or two
    schedule = stored_schedule(
        api, values=[400, 100, 100, 400], duration_h=1, deadline_h=2, interruptible=False
    )

    page.set_viewport_size({"width": VIEWPORT_PX, "height": 900})
    open_plan_options(page, live_stack.base_url, plan_id, log_in=True)
    form = "#launch"
    # the choices are the server's: the node counts that divide the plan's 2 ranks, the hooks, the zones
    nodes = page.eval_on_selector_all(f"{form} [name=nnodes] option", "os => os.map(o => o.value)")
    assert nodes == ["", "2"]
    hooks = page.eval_on_selector_all(f"{form} [name=comm_hook] option", "os => os.map(o => o.value)")
    assert {"topk_ef", "powerSGD", "fp16"} <= set(hooks)
    assert "GB" in page.inner_text(
        f"{form} [name='energy.zone'] option:first-child"
    )  # the deployment's default
    listed = page.eval_on_selector_all(f"{form} [name=green_schedule] option", "os => os.map(o => o.value)")
    assert str(schedule["id"]) in listed
    assert page.evaluate(OVERFLOW) == []  # the open options fit a 1,280 px window

    page.select_option(f"{form} [name=nnodes]", "2")
    page.select_option(f"{form} [name=comm_hook]", "topk_ef")
    page.fill(f"{form} [name=comm_hook-options]", "density=0.05")
    page.fill(f"{form} [name=hang_timeout_s]", "30")
    page.fill(f"{form} [name=max_restarts]", "5")
    page.select_option(f"{form} [name=risk_policy]", "observe")
    page.fill(f"{form} [name=snapshot_every]", "4")
    page.select_option(f"{form} [name='energy.zone']", "DE")
    page.fill(f"{form} [name='energy.pue']", "1.2")
    page.fill(f"{form} [name='energy.pue_source']", "the site's meter, 2025")
    page.fill(f"{form} [name='energy.price_per_kwh']", "0.3")
    page.fill(f"{form} [name='energy.currency']", "EUR")
    # a carbon-aware start: its fields open when it is ticked
    assert page.is_disabled(f"{form} [name='carbon_aware.deadline_h']")
    page.check(f"{form} [name=carbon_aware]")
    page.fill(f"{form} [name='carbon_aware.deadline_h']", "24")
    page.fill(f"{form} [name='carbon_aware.duration_h']", "0.5")
    page.fill(f"{form} [name='carbon_aware.power_kw']", "0.2")
    job = launched_job(page, api)

    config = job["config"]
    assert job["nnodes"] == 2 and job["nproc_per_node"] == 1
    assert config["comm_hook"] == "topk_ef:density=0.05"
    assert job["hang_timeout_s"] == 30 and job["max_restarts"] == 5
    assert config["risk_policy"] == "observe" and config["snapshot_every"] == 4
    energy = config["energy"]
    assert (
        energy["zone"] == "DE" and energy["pue"] == 1.2 and energy["pue_source"] == "the site's meter, 2025"
    )
    assert energy["price_per_kwh"] == 0.3 and energy["currency"] == "EUR"
    assert job["schedule"] is not None and job["schedule"]["zone"] == "DE"
    assert job["state"] in {"scheduled", "queued", "launching", "running", "failed"}  # its window may be now
    assert config["profile_every"] == 5  # what the page has always sent
    # what was left empty took the API's default
    assert "seed" not in config or config["seed"] == 0
    assert config["device"] == "auto"

    # a stored green schedule of the team, picked from the list
    open_plan_options(page, live_stack.base_url, plan_id, log_in=False)
    page.select_option(f"{form} [name=green_schedule]", str(schedule["id"]))
    job = launched_job(page, api)
    assert job["schedule"]["id"] == schedule["id"] and job["state"] == "scheduled"
    assert job["config"]["energy"]["zone"] == "GB" and job["nnodes"] == 1
    assert page.js_errors == []


def test_a_value_the_api_refuses_is_shown_beside_its_field_and_no_job_is_made(live_stack, page, make_member):
    from controlplane.jobs.models import TrainingJob

    alice = make_member("alice", "Team A")
    api = APIClient()
    api.force_authenticate(alice)
    plan_id = import_tiny_cpu_plan(api)["id"]
    open_plan_options(page, live_stack.base_url, plan_id, log_in=True)
    page.fill("#launch [name=hang_timeout_s]", "0")
    page.fill("#launch [name='energy.pue']", "0.5")
    page.fill("#launch [name='energy.pue_source']", "a guess")
    page.check("#launch [name=carbon_aware]")  # and no deadline
    page.click("#launch button[type=submit]")
    page.wait_for_selector("#launch .launch-errors li.error")

    lines = page.eval_on_selector_all("#launch .launch-errors li.error", "ls => ls.map(l => l.textContent)")
    text = "\n".join(lines)
    assert "energy.pue must be a number >= 1, got 0.5" in text and "energy: energy.pue" not in text
    assert "Hang timeout (s) — hang_timeout_s:" in text and "greater than or equal to 5" in text
    assert "Finish within (h) — carbon_aware.deadline_h: This field is required." in text
    for name in ("hang_timeout_s", "energy.pue", "carbon_aware.deadline_h"):
        field = f"#launch .option-field[data-field='{name}']"
        assert page.get_attribute(f"{field} [name='{name}']", "aria-invalid") == "true"
        assert page.is_visible(f"{field} .field-error")
    assert "/planning/plans/" in page.url
    assert not TrainingJob.objects.exists()

    # fixed, it launches
    page.fill("#launch [name=hang_timeout_s]", "45")
    page.fill("#launch [name='energy.pue']", "1.1")
    page.fill("#launch [name='carbon_aware.deadline_h']", "12")
    page.fill("#launch [name='carbon_aware.duration_h']", "0.5")
    page.fill("#launch [name='carbon_aware.power_kw']", "0.2")
    job = launched_job(page, api)
    assert job["hang_timeout_s"] == 45 and job["config"]["energy"]["pue"] == 1.1 and job["schedule"]
    assert page.js_errors == []
