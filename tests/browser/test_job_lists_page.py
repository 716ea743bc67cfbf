"""The job lists in a real Chromium against the real stack: the jobs page and the dashboard follow a job
launched from the API (it appears, runs and succeeds without a reload), the run table sorts and filters,
tags and notes are edited from the list and the job page, every chart exports its data as CSV and its
picture as PNG, and the dashboard's live panel reads as a timeline."""

from __future__ import annotations

import csv
import io

import pytest
from playwright.sync_api import expect
from rest_framework.test import APIClient

from tests.browser.test_job_pages import log_in
from tests.conftest import http
from tests.integration.test_jobs import job_payload

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

ORDER = (
    "() => [...document.querySelectorAll('#job-table tbody tr[data-job]')].map(tr => Number(tr.dataset.job))"
)
SHOWN = (
    "() => [...document.querySelectorAll('#job-table tbody tr[data-job]')]"
    ".filter(tr => !tr.hidden).map(tr => Number(tr.dataset.job))"
)


def a_job(user, name, **fields):
    from controlplane.jobs.models import TrainingJob

    config = {"steps": 10, "model": {"name": fields.pop("model", "tiny-dense")}}
    return TrainingJob.objects.create(team=user.teams.first(), name=name, config=config, **fields)


def test_a_job_launched_from_the_api_appears_and_finishes_live_on_the_list_and_the_dashboard(
    live_stack, browser, alice
):
    context = browser.new_context()
    jobs_page, dashboard = context.new_page(), context.new_page()
    errors = []
    for p in (jobs_page, dashboard):
        p.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(jobs_page, live_stack.base_url, "alice")
    jobs_page.goto(live_stack.base_url + "/jobs/")
    dashboard.goto(live_stack.base_url + "/")
    for p in (jobs_page, dashboard):  # the team feed is on before the job exists
        p.wait_for_selector("body[data-jobs-feed=watching]", timeout=15000)
    assert jobs_page.locator("#job-table tbody tr[data-job]").count() == 0

    client = APIClient()
    client.force_authenticate(alice)
    r = client.post("/api/jobs/", job_payload(steps=12, name="from-the-api", profile_every=0), format="json")
    assert r.status_code == 201, r.content
    job_id = r.json()["id"]

    row = f"#job-table tr[data-job='{job_id}']"
    jobs_page.wait_for_selector(row, timeout=20000)
    assert jobs_page.inner_text(f"{row} td[data-col=name]") == "from-the-api"
    dash_row = f"#dashboard-jobs tr[data-job='{job_id}']"
    dashboard.wait_for_selector(dash_row, timeout=20000)
    # while it trains: running, with progress and live figures from its stream
    jobs_page.wait_for_selector(f"{row}[data-state=running] .mini-bar", timeout=120000)
    jobs_page.wait_for_function(
        "(sel) => document.querySelector(sel + ' td[data-col=tokens]').textContent.trim() !== '—'",
        arg=row,
        timeout=120000,
    )
    # and it ends succeeded on both pages, with the run summary's figures, without a reload
    jobs_page.wait_for_selector(f"{row}[data-state=succeeded]", timeout=180000)
    dashboard.wait_for_selector(f"{dash_row}[data-state=succeeded]", timeout=30000)
    from controlplane.jobs.models import TrainingJob

    job = TrainingJob.objects.get(pk=job_id)
    assert job.state == "succeeded"
    jobs_page.wait_for_function(
        "(sel) => !document.querySelector(sel + ' td[data-col=measured]').textContent.includes('live')",
        arg=row,
        timeout=15000,
    )
    assert jobs_page.inner_text(f"{row} td[data-col=state]") == "succeeded"
    assert jobs_page.inner_text(f"{row} .progress-text") == "12/12"
    tokens = jobs_page.inner_text(f"{row} td[data-col=tokens]").replace(",", "")
    assert int(tokens) == round(job.measured["tokens_per_s"])
    assert dashboard.inner_text(f"{dash_row} td[data-col=state]") == "succeeded"
    # the dashboard's row takes the run summary's figure from the same end-of-run update, which may land a
    # moment after its state: wait for it, then compare
    final = jobs_page.inner_text(f"{row} td[data-col=tokens]")
    dashboard.wait_for_function(
        "([sel, want]) => document.querySelector(sel + ' td[data-col=tokens]').textContent.trim() === want",
        arg=[dash_row, final],
        timeout=15000,
    )
    assert dashboard.inner_text(f"{dash_row} td[data-col=tokens]") == final
    # the dashboard's live panel offers the new job's stream
    assert dashboard.locator(f"#live-stream option[value='job/{job_id}']").count() == 1
    assert errors == []
    context.close()


def test_the_run_table_sorts_by_a_column_and_filters_by_state_team_tag_and_text(
    live_stack, page, alice, token_for
):
    a = a_job(alice, "alpha", state="failed", tags=["baseline"], model="tiny-moe")
    b = a_job(alice, "charlie", state="succeeded", measured={"step_time_s": 0.2, "tokens_per_s": 900.0})
    c = a_job(alice, "bravo", state="succeeded", tags=["baseline", "sweep"], notes="lr 3e-4 looks best")
    c.measured = {"step_time_s": 0.1, "tokens_per_s": 2000.0}
    c.save()

    log_in(page, live_stack.base_url, "alice")
    page.goto(live_stack.base_url + "/jobs/")
    page.wait_for_selector("body[data-jobs-feed=watching]", timeout=15000)
    assert page.evaluate(ORDER) == [c.pk, b.pk, a.pk]  # newest first

    page.click("#job-table th[data-sort=name] button")
    assert page.evaluate(ORDER) == [a.pk, c.pk, b.pk]
    assert page.get_attribute("#job-table th[data-sort=name]", "aria-sort") == "ascending"
    page.click("#job-table th[data-sort=name] button")
    assert page.evaluate(ORDER) == [b.pk, c.pk, a.pk]
    page.click("#job-table th[data-sort=tokens] button")  # numbers, and a job without figures last
    assert page.evaluate(ORDER) == [b.pk, c.pk, a.pk]
    page.click("#job-table th[data-sort=tokens] button")
    assert page.evaluate(ORDER) == [c.pk, b.pk, a.pk]

    page.select_option("#job-filters select[name=state]", "failed")
    assert page.evaluate(SHOWN) == [a.pk]
    page.select_option("#job-filters select[name=state]", "")
    page.select_option("#job-filters select[name=tag]", "baseline")
    assert page.evaluate(SHOWN) == [c.pk, a.pk]
    page.fill("#job-filters input[name=q]", "moe")  # the model
    assert page.evaluate(SHOWN) == [a.pk]
    page.fill("#job-filters input[name=q]", "looks best")  # the notes
    assert page.evaluate(SHOWN) == [c.pk]
    page.select_option("#job-filters select[name=state]", "failed")
    assert page.evaluate(SHOWN) == []
    assert page.is_visible("#job-table tr.no-match-row")
    page.select_option("#job-filters select[name=state]", "")
    page.select_option("#job-filters select[name=tag]", "")
    assert page.evaluate(SHOWN) == [c.pk]
    assert page.is_hidden("#job-table tr.no-match-row")
    assert page.inner_text("#job-count") == "1 of 3 jobs shown"
    page.select_option("#job-filters select[name=team]", "team-a")
    assert page.evaluate(SHOWN) == [c.pk]

    # the view is in the URL: a reload (or a shared link) shows the same
    assert "q=looks+best" in page.url and "sort=tokens" in page.url and "dir=desc" in page.url
    page.reload()
    page.wait_for_selector("body[data-jobs-feed=watching]", timeout=15000)
    assert page.evaluate(SHOWN) == [c.pk]
    page.click("#clear-filters")
    assert page.evaluate(SHOWN) == [c.pk, b.pk, a.pk]

    # a tag chip filters by its tag; filters keep working when a row changes live
    page.click(f"#job-table tr[data-job='{a.pk}'] .tag[data-tag=baseline]")
    assert page.evaluate(SHOWN) == [c.pk, a.pk]
    # (through the real web process: a notice is sent from a request thread, as in production)
    status, _ = http(
        "PATCH", f"{live_stack.base_url}/api/jobs/{b.pk}/", token_for(alice), {"tags": ["baseline"]}
    )
    assert status == 200
    page.wait_for_function(
        f"() => !document.querySelector(\"#job-table tr[data-job='{b.pk}']\").hidden", timeout=15000
    )
    assert page.evaluate(SHOWN) == [c.pk, b.pk, a.pk]
    assert page.js_errors == []


def test_tags_and_notes_are_edited_from_the_list_and_the_job_page(live_stack, page, alice):
    from controlplane.jobs.models import TrainingJob

    job = a_job(alice, "annotated", state="succeeded")
    log_in(page, live_stack.base_url, "alice")
    page.goto(live_stack.base_url + "/jobs/")
    page.click(f"#job-table tr[data-job='{job.pk}'] button.annotate")
    page.wait_for_selector("#annotate-dialog[open]")
    # the server's check shows in the editor, which stays open
    page.fill("#annotate-tags", "baseline, " + "x" * 41)
    page.click("#annotate-save")
    page.wait_for_selector("#annotate-errors li")
    assert page.inner_text("#annotate-errors").startswith("tags: tag 2 has 41 characters")
    assert page.is_visible("#annotate-dialog")
    page.fill("#annotate-tags", "baseline, lr-sweep,")
    page.fill("#annotate-notes", "first try\nwith lr 3e-4")
    page.click("#annotate-save")
    page.wait_for_selector("#annotate-dialog", state="hidden")
    chips = f"#job-table tr[data-job='{job.pk}'] td[data-col=tags] .tag"
    expect(page.locator(chips)).to_have_text(["baseline", "lr-sweep"])  # the row is redrawn after the save
    assert "first try" in page.inner_text(f"#job-table tr[data-job='{job.pk}'] .note-snippet")
    job.refresh_from_db()
    assert job.tags == ["baseline", "lr-sweep"] and job.notes == "first try\nwith lr 3e-4"

    page.reload()
    assert page.locator(chips).all_inner_texts() == ["baseline", "lr-sweep"]

    page.goto(f"{live_stack.base_url}/jobs/{job.pk}/")
    assert page.locator("#job-tags .tag").all_inner_texts() == ["baseline", "lr-sweep"]
    assert page.inner_text("#job-notes") == "first try\nwith lr 3e-4"
    page.click("#annotate-button")
    assert page.input_value("#annotate-tags") == "baseline, lr-sweep"
    page.fill("#annotate-tags", "final")
    page.click("#annotate-save")
    page.wait_for_selector("#annotate-dialog", state="hidden")
    assert page.locator("#job-tags .tag").all_inner_texts() == ["final"]
    assert TrainingJob.objects.get(pk=job.pk).tags == ["final"]
    assert page.js_errors == []


def test_a_chart_downloads_its_data_as_csv_and_its_picture_as_png(live_stack, page, alice):
    from controlplane.live.services import publish
    from tests.browser.test_job_pages import wait_for_train_events

    job = a_job(alice, "exported", state="running")
    for step in range(1, 6):
        publish(job.stream, "train", {"loss": 6.0 - 0.5 * step, "tokens_per_s": 1000.0 + step}, step=step)
    wait_for_train_events(job, 5)

    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/{job.pk}/")
    page.wait_for_function("() => document.getElementById('chart-loss').data !== undefined", timeout=15000)
    page.hover("#chart-loss")
    with page.expect_download() as info:
        page.click("#chart-loss .modebar-btn[data-title='Download data as CSV']")
    download = info.value
    assert download.suggested_filename == f"jobs-{job.pk}-loss.csv"
    rows = list(csv.reader(io.StringIO(open(download.path()).read())))
    assert rows[0] == ["trace", "x", "y"]
    traces = page.evaluate("() => document.getElementById('chart-loss').data.map(t => t.name)")
    raw = [r for r in rows[1:] if r[0] == traces[0]]
    assert [int(r[1]) for r in raw] == [1, 2, 3, 4, 5]
    assert [float(r[2]) for r in raw] == [5.5, 5.0, 4.5, 4.0, 3.5]

    page.hover("#chart-tokens")
    with page.expect_download() as info:
        page.click("#chart-tokens .modebar-btn[data-title='Download plot as PNG']")
    png = info.value
    assert png.suggested_filename == f"jobs-{job.pk}-throughput.png"
    assert open(png.path(), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert page.js_errors == []


def test_the_dashboard_shows_live_events_as_a_readable_timeline(live_stack, page, alice):
    from controlplane.live.services import publish

    job = a_job(alice, "timeline", state="running")
    log_in(page, live_stack.base_url, "alice")
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    assert page.input_value("#live-stream") == f"job/{job.pk}"

    page.click("#send-probe")
    probe = page.wait_for_selector("#live-events li.event[data-seq='1']", timeout=20000)
    text = probe.inner_text()
    assert "probe from " in text and " via celery: “probe from the dashboard”" in text
    assert "{" not in text  # no raw JSON until asked for
    publish(
        job.stream,
        "train",
        {"loss": 3.4213, "tokens_per_s": 1234.4, "step_time_s": 0.0412, "note": "x" * 400},
        step=12,
    )
    train = page.wait_for_selector("#live-events li.event[data-seq='2']", timeout=20000)
    assert "step 12 · loss 3.421 · 1,234 tokens/s · 41.2 ms/step" in train.inner_text()
    publish(job.stream, "event", {"state": "succeeded", "exit_codes": [0, 0]})
    state = page.wait_for_selector("#live-events li.event[data-seq='3']", timeout=20000)
    assert "now succeeded: exit codes 0, 0" in state.inner_text()

    # the raw JSON opens on click, and wraps inside the card
    train.click()
    raw = page.wait_for_selector("#live-events li.event[data-seq='2'] pre.raw", state="visible")
    assert '"tokens_per_s": 1234.4' in raw.inner_text()
    overflow = page.evaluate(
        """() => {
          const panel = document.getElementById('live-panel').getBoundingClientRect();
          const list = document.getElementById('live-events');
          return {wide: list.scrollWidth > list.clientWidth,
                  outside: [...list.querySelectorAll('li, pre')].some(el => el.getBoundingClientRect().right > panel.right + 1)};
        }"""
    )
    assert overflow == {"wide": False, "outside": False}
    assert page.js_errors == []
