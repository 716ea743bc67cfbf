"""Log in through the real login page, open the dashboard, and see a live event arrive."""

from __future__ import annotations

import pytest

from tests.conftest import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


def test_login_dashboard_and_live_event(live_stack, page, make_member):
    from controlplane.jobs.models import TrainingJob

    alice = make_member("alice", "Team A")
    job = TrainingJob.objects.create(team=alice.teams.first(), name="browser-job", config={})

    page.goto(live_stack.base_url + "/")
    assert "/login/" in page.url
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(live_stack.base_url + "/")
    assert page.locator("h2", has_text="Live events").is_visible()
    page.wait_for_selector("#live-status[data-state=live]", timeout=15000)
    assert page.locator("#live-stream").input_value() == f"job/{job.pk}"
    # the health card is filled from /healthz
    page.wait_for_selector("#health li.ok", timeout=15000)

    page.click("#send-probe")
    event = page.wait_for_selector("#live-events li.event", timeout=20000)
    text = event.inner_text()
    assert f"job/{job.pk}" in text and "probe from the dashboard" in text and "celery" in text
    assert event.get_attribute("data-seq") == "1"
    page.click("#send-probe")
    page.wait_for_selector("#live-events li.event[data-seq='2']", timeout=20000)
    assert page.js_errors == []


def test_numbers_are_formatted_as_people_read_them(live_stack, page):
    """The pages' one formatter (frontend/static/js/common.js): thousands separators, fixed decimals, and
    nothing that rounds to zero printed as "-0.0%" or "-0.00" (issue 35)."""
    page.goto(live_stack.base_url + "/login/")
    got = page.evaluate(
        """async () => {
          const m = await import("/static/js/common.js");
          return [m.formatPercent(-0.00001), m.formatPercent(-0.00001, 1, { signed: true }),
                  m.formatPercent(0.1234), m.formatPercent(-0.04, 1, { signed: true }),
                  m.formatNumber(-0.0001, 2), m.formatNumber(68946900.0), m.formatNumber(1234.5678, 2),
                  m.formatSeconds(0.0041)];
        }"""
    )
    assert got == ["0.0%", "+0.0%", "12.3%", "-4.0%", "0.00", "68,946,900", "1,234.57", "4.10 ms"]


def test_wrong_password_stays_on_login(live_stack, page, make_member):
    make_member("alice", "Team A")
    page.goto(live_stack.base_url + "/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    assert page.locator(".error").inner_text().startswith("Your username and password didn't match")
