"""The planner's front page in a browser: the measured plans show each prediction's error, and the
new-search form names the field the API refused, then opens the page of a search it started."""

from __future__ import annotations

import re

import pytest

from tests.browser.test_visualizer import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


def test_new_search_form_names_a_refused_field_and_opens_a_started_search(live_stack, page, make_member):
    from controlplane.planning.seed import seed_knowledge_base

    alice = make_member("alice", "Team A")
    seed_knowledge_base(team=alice.teams.first())
    base = live_stack.base_url
    log_in(page, base, "alice")
    page.goto(base + "/planning/")

    errors = page.locator("#measured-plans td.rel-error").all_inner_texts()
    assert errors and all(re.fullmatch(r"-?\d+\.\d%", e) for e in errors), errors

    # past the browser's own checks, the API refuses a global batch of 0 and names the field
    page.evaluate("() => { document.getElementById('new-search').noValidate = true; }")
    page.fill("#new-search input[name=global_batch_size]", "0")
    page.click("#new-search button[type=submit]")
    page.wait_for_function("() => document.getElementById('new-search-error').textContent !== ''")
    assert page.inner_text("#new-search-error").startswith("training.global_batch_size")

    page.fill("#new-search input[name=global_batch_size]", "1536")
    page.click("#new-search button[type=submit]")
    page.wait_for_url(re.compile(r".*/planning/searches/\d+/$"), timeout=15_000)
    page.wait_for_selector("#search-progress[data-ready='1']")
    assert page.js_errors == []
