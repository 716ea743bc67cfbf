"""The failure patterns pages in a real Chromium against the real stack: the navigation leads to the list,
a kind's link opens its page with its figures and their sources, and an incident list uploaded through the
page's form extends the counts (and a bad one is refused naming its line)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.test_job_pages import log_in
from workers.reliability.risk.simulator import KINDS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

INCIDENTS = (
    b"node,time,kind\ngpu-node-01,2026-01-01T00:28:00Z,GPU HBM3 Memory\ngpu-node-02,1767225600,Kernel panic\n"
)


def test_the_list_links_each_kind_to_its_page_and_an_upload_extends_the_counts(live_stack, page, make_member):
    make_member("alice", "Team A")
    base = live_stack.base_url
    log_in(page, base, "alice")
    page.click("header.topbar nav a:has-text('Failures')")
    page.wait_for_url(base + "/failure-patterns/")
    rows = page.locator("#pattern-table tbody tr")
    expect(rows).to_have_count(len(KINDS))
    hbm = page.locator("tr[data-pattern=gpu_hbm3]")
    expect(hbm.locator("td[data-col=imported]")).to_have_text("0")
    expect(hbm.locator("td[data-col=prevention]")).to_have_text("snapshot now, then drain the node")

    # a bad list is refused, naming the line
    page.set_input_files(
        "#incident-form input[name=file]",
        files=[{"name": "bad.csv", "mimeType": "text/csv", "buffer": b"node,time,kind\nn1,yesterday,nic\n"}],
    )
    page.click("#incident-submit")
    expect(page.locator("#incident-errors li")).to_contain_text("bad.csv, line 2: time 'yesterday'")

    page.set_input_files(
        "#incident-form input[name=file]",
        files=[{"name": "tickets.csv", "mimeType": "text/csv", "buffer": INCIDENTS}],
    )
    page.click("#incident-submit")
    expect(page.locator("#incident-result")).to_contain_text("tickets.csv: 2 of 2 incidents imported")
    expect(hbm.locator("td[data-col=imported]")).to_have_text("1")
    expect(rows).to_have_count(len(KINDS) + 1)
    expect(page.locator("tr[data-pattern=kernel_panic]")).to_contain_text("imported, no published rate")

    hbm.locator("td[data-col=kind] a").click()
    page.wait_for_url(base + "/failure-patterns/gpu_hbm3/")
    expect(page.locator("h1")).to_contain_text("GPU HBM3 Memory")
    expect(page.locator("#pattern-published")).to_contain_text("72 of 419")
    expect(page.locator("#precursor-signals")).to_contain_text("single-bit ECC errors")
    expect(page.locator("#pattern-prevention")).to_have_attribute("data-action", "snapshot-then-drain")
    expect(page.locator("#observed-count")).to_have_text("1")
    expect(page.locator("#pattern-incidents")).to_contain_text("tickets.csv, line 2")
    expect(page.locator("#pattern-sources")).to_contain_text("Dubey et al. 2024")
    assert not page.js_errors, page.js_errors
