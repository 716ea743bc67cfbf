"""'Compare communication methods' on a job page in a real browser: while it runs the panel says which
method runs, its step k of n and the time left; Cancel stops it and keeps the method measured before; a
comparison that ends draws bytes per step against step time and recommends a method for the link, saying
the loss tolerance. Needs root and network namespaces, like the comparison itself."""

from __future__ import annotations

import re

import pytest

from tests.browser.test_visualizer import log_in, shoot
from workers.training.comm import netem
from workers.training.examples import example

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(bool(netem.unavailable_reason()), reason=netem.unavailable_reason() or "n/a"),
]


def start(page, methods: list[str], steps: int) -> None:
    for box in page.locator("#comm-compare-form input[name=methods]").all():
        box.set_checked(box.get_attribute("value") in methods)
    page.fill("#comm-compare-form input[name=steps]", str(steps))
    page.fill("#comm-compare-form input[name=nodes]", "2")
    page.fill("#comm-compare-form input[name=ranks_per_node]", "1")
    page.click("#comm-compare-form button[type=submit]")


@pytest.mark.long
def test_comparison_shows_progress_cancels_and_recommends(live_stack, page, make_member):
    from controlplane.jobs.models import CommComparison, TrainingJob

    alice = make_member("alice", "Team A")
    job = TrainingJob.objects.create(
        team=alice.teams.get(),
        name="tiny",
        config={"model": example("tiny-dense.json"), "strategy": {"dp": 2}},
        state="succeeded",
        created_by=alice,
    )
    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/jobs/{job.pk}/")

    # a long comparison: dense's 150 steps end, then fp16 is cancelled while it runs (its 150 steps leave
    # the page several seconds to show its progress)
    start(page, ["dense", "fp16", "topk_ef"], 150)
    page.wait_for_selector("#comm-compare-progress:not([hidden])", timeout=15_000)
    page.wait_for_function(
        "() => /^fp16 \\(2 of 3\\): step \\d+ of 150 .* left/.test("
        "document.querySelector('#comm-compare-progress .progress-text').textContent)",
        timeout=300_000,
    )
    text = page.inner_text("#comm-compare-progress .progress-text")
    assert re.search(r"about (\d+ s|\d+ min \d+ s) left \(from the measured step times\)", text), text
    assert page.get_attribute("#comm-compare-progress li[data-method=dense]", "data-done") == "1"
    assert page.get_attribute("#comm-compare-progress li[data-method=fp16]", "data-done") == "running"
    assert page.get_attribute("#comm-compare-progress li[data-method=topk_ef]", "data-done") == "0"
    assert page.locator("#comm-compare-table tbody tr").count() == 1
    shoot(page, "comm-progress", "#comm-compare-form")
    page.click("#comm-compare-cancel")
    page.wait_for_selector("#comm-compare[data-state=cancelled]", timeout=60_000)
    assert not page.is_visible("#comm-compare-progress")
    assert "Cancelled by alice while fp16 ran" in page.inner_text("#comm-compare-status")
    assert page.locator("#comm-compare-table tbody tr[data-method=dense]").count() == 1
    first = CommComparison.objects.order_by("pk").first()
    assert first.state == "cancelled" and list(first.result["methods"]) == ["dense"]

    # a short one that ends: the chart of bytes vs step time, and the recommendation with its rule
    start(page, ["dense", "fp16"], 6)
    page.wait_for_selector("#comm-compare[data-state=succeeded]", timeout=240_000)
    page.wait_for_selector("#comm-compare-chart[data-ready='1']", timeout=10_000)
    points = page.evaluate("() => document.querySelector('#comm-compare-chart').data[0].text")
    assert points == ["dense", "fp16"]
    advice = page.inner_text("#comm-compare-recommendation")
    last = CommComparison.objects.order_by("pk").last()
    recommended = last.result["recommendation"]["method"]
    assert advice.startswith(f"Recommended for this link: {recommended}")
    assert "at most 2% above dense's" in advice
    assert page.locator(f"#comm-compare-table tbody tr.best[data-method={recommended}]").count() == 1
    shoot(page, "comm-result", "#comm-compare-form")
    assert page.js_errors == []
