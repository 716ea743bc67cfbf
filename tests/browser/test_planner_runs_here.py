"""The planner pages in a real browser, for plans that run here: a search that fails shows one message
with what to change and no views or controls; a Pareto point the search did not store is saved, opened
and launched; a plan for 1024 devices is launched scaled down (the diff shown first) as a job labelled
"scaled-down from plan #N" that runs to the end on this machine."""

from __future__ import annotations

import re

import pytest

from tests.browser.test_visualizer import contract, log_in, shoot
from tests.conftest import http

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

# the candidate the search did not store that lies farthest from any other on the Pareto plot, in pixels
UNSTORED_POINT = """() => {
  const gd = document.querySelector('#view-pareto .js-plotly-plot');
  const fl = gd._fullLayout, xa = fl.xaxis, ya = fl.yaxis, box = gd.getBoundingClientRect();
  const px = (c) => [box.left + xa._offset + xa.l2p(c.memory_GiB), box.top + ya._offset + ya.l2p(c.tokens_per_s)];
  const data = window.__viz.data;
  const key = (s) => JSON.stringify(Object.keys(s).sort().map((k) => [k, s[k]]));
  const stored = new Set(data.plans.map((p) => key(p.strategy)));
  const pts = data.candidates.map(px);
  let best = null;
  data.candidates.forEach((c, i) => {
    if (stored.has(key(c.strategy))) return;
    let near = Infinity;
    pts.forEach(([u, v], j) => { if (j !== i) near = Math.min(near, Math.hypot(u - pts[i][0], v - pts[i][1])); });
    if (!best || near > best.near) best = { near, x: pts[i][0], y: pts[i][1], strategy: c.strategy };
  });
  return best;
}"""

# what a user could press or type in the page's content (the navigation bar left out)
# the search's own controls (the machine's calibration banner, on every page while uncalibrated, is not one)
ACTIVE_CONTROLS = """() => [...document.querySelectorAll('main button, main input, main select, main textarea')]
  .filter((el) => !el.disabled && el.offsetParent !== null && !el.closest('[data-calibration]'))
  .map((el) => el.outerHTML.slice(0, 80))"""


def wait_search_state(search_id: int, timeout: float = 60):
    from tests.integration.test_planning import wait_search

    return wait_search(search_id, timeout)


def test_a_failed_search_shows_one_message_with_what_to_change_and_no_views(
    live_stack, page, make_member, token_for
):
    alice = make_member("alice", "Team A")
    base = live_stack.base_url
    training = {**contract("training.json"), "global_batch_size": 7}
    status, body = http(
        "POST",
        base + "/api/searches/",
        token_for(alice),
        {
            "cluster_doc": contract("cluster.json"),
            "model_doc": contract("model-moe.json"),
            "training": training,
            # pinned: unpinned, dp 1 takes any batch (pp 48 runs the 64 layers as uneven stages); at pp 16
            # the 384 devices leave dp 3, 6, 12 or 24
            "strategy": {"pp": 16, "cp": 1},
        },
    )
    assert status == 201, body
    search = wait_search_state(body["id"])
    assert search.state == "failed"
    rejected = sum(search.stats["rejected"].values())

    log_in(page, base, "alice")
    page.goto(f"{base}/planning/searches/{search.pk}/")
    page.wait_for_selector("#search-progress[data-ready='1']")
    # one state: badge, progress text (no bar: a failed search is not "x% done")
    assert page.inner_text("#search-state") == "failed"
    text = page.inner_text("#search-progress .progress-text")
    assert text.startswith(f"failed · {rejected:,} layouts rejected"), text
    assert "layouts evaluated" not in text
    assert not page.is_visible("#search-progress .bar")
    # one message naming the batch and what would work, then a way on
    assert page.is_visible("#search-outcome")
    message = page.inner_text("#search-outcome .outcome-message")
    assert "global_batch_size 7 is not divisible by any data-parallel degree" in message
    change = page.inner_text("#search-outcome .outcome-change")
    assert change.startswith("What to change: use a global batch") and "e.g. 6 or 9" in change, change
    assert "pp does not divide" not in message
    assert page.inner_text("main").count("global_batch_size 7 is not divisible") == 1
    assert page.is_visible("#search-outcome a.new-search-link")
    # the seven views and every control of them are gone
    assert not page.is_visible("#viz-views")
    for view in ("pareto", "memory", "steptime", "schedule", "placement", "diff", "whatif"):
        assert not page.is_visible(f"#view-{view}")
    assert page.evaluate(ACTIVE_CONTROLS) == []
    shoot(page, "failed-search")
    # "Edit and run again": the planner page's form, filled in with this search's request; fixing the batch
    # the message named runs it again (issue 35: a failed search could not be edited)
    page.click("#edit-search")
    page.wait_for_selector("#new-search-from:not([hidden])")
    assert f"Filled in from search {search.pk}" in page.inner_text("#new-search-from")
    assert page.input_value("#new-search [name=global_batch_size]") == "7"
    assert (
        page.input_value("#new-search [name=pp]") == "16" and page.input_value("#new-search [name=cp]") == "1"
    )
    # its cluster and model were documents, not stored ones: the form says to pick them
    assert search.cluster_id is None and "sent as a document" in page.inner_text("#new-search-from")
    # from the knowledge base: the cluster and the model are picked again too, and the fixed batch runs
    token = token_for(alice)
    cluster = http("POST", base + "/api/clusters/", token, contract("cluster.json"))[1]["id"]
    model = http("POST", base + "/api/models/", token, contract("model-moe.json"))[1]["id"]
    ids = {"cluster": cluster, "model": model, "training": training, "strategy": {"pp": 16, "cp": 1}}
    status, body = http("POST", base + "/api/searches/", token, ids)
    assert status == 201, body
    failed = wait_search_state(body["id"])
    assert failed.state == "failed"
    page.goto(f"{base}/planning/?from={failed.pk}")
    page.wait_for_selector("#new-search-from:not([hidden])")
    assert "sent as a document" not in page.inner_text("#new-search-from")
    assert page.input_value("#new-search [name=cluster]") == str(cluster)
    assert page.input_value("#new-search [name=model]") == str(model)
    page.fill("#new-search [name=global_batch_size]", "6")
    page.click("#new-search button[type=submit]")
    page.wait_for_url(re.compile(r".*/planning/searches/\d+/$"))
    again = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert again not in (search.pk, failed.pk)
    rerun = wait_search_state(again)
    assert rerun.request["training"]["global_batch_size"] == 6 and rerun.request["strategy"]["pp"] == 16
    assert page.js_errors == []


def small_example_search_page(live_stack, page, alice) -> dict:
    """The small example searched through the API (by its stored ids), and its page open, views drawn."""
    from rest_framework.test import APIClient

    from controlplane.clusters.models import Cluster
    from controlplane.planning.models import StoredModelSpec
    from controlplane.planning.seed import seed_knowledge_base
    from workers.planner.examples import small_example

    team = alice.teams.get()
    seed_knowledge_base(team=team)
    docs = small_example()
    client = APIClient()
    client.force_authenticate(alice)
    r = client.post(
        "/api/searches/",
        {
            "cluster": Cluster.objects.get(team=team, name="this-machine-cpu").pk,
            "model": StoredModelSpec.objects.get(team=team, name="tiny-gpt").pk,
            "training": docs["training"],
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    search = wait_search_state(r.json()["id"])
    assert search.state == "succeeded", search.human_readable_error
    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/planning/searches/{search.pk}/")
    page.wait_for_selector("#view-pareto[data-ready='1']", timeout=30_000)
    page.wait_for_selector("#selection[data-strategy]", timeout=15_000)
    return {"search": search, "client": client}


@pytest.mark.long
def test_a_pareto_point_is_saved_then_opened_and_launched(live_stack, page, make_member):
    from controlplane.planning.models import StoredPlan

    alice = make_member("alice", "Team A")
    found = small_example_search_page(live_stack, page, alice)
    search = found["search"]
    # badge, bar and text tell one state
    assert page.inner_text("#search-state") == "succeeded"
    assert page.get_attribute("#search-progress", "data-fraction") == "1"
    assert page.inner_text("#search-progress .progress-text").startswith("succeeded · 100%")
    assert page.is_visible("#viz-views") and not page.is_visible("#search-outcome")

    page.evaluate("() => document.querySelector('#view-pareto').scrollIntoView({block: 'center'})")
    target = page.evaluate(UNSTORED_POINT)
    assert target, "every candidate is a stored plan"
    before = page.get_attribute("#selection", "data-strategy")
    page.mouse.click(target["x"], target["y"])
    page.wait_for_function(
        "(old) => document.querySelector('#selection').dataset.strategy !== old", arg=before, timeout=15_000
    )
    save = page.locator("#selection button.save-selected")
    save.wait_for(timeout=10_000)
    assert page.get_attribute("#selection", "data-plan-id") == ""
    save.click()
    open_link = page.locator("#selection a.open-selected")
    open_link.wait_for(timeout=15_000)
    plan_id = int(page.get_attribute("#selection", "data-plan-id"))
    shoot(page, "saved-point", "#view-pareto")
    saved = StoredPlan.objects.get(pk=plan_id)
    assert saved.search_id == search.pk and saved.team_id == search.team_id and saved.rank is None
    assert page.locator(f"#plan-table tr[data-plan-id='{plan_id}']").count() == 1

    open_link.click()
    page.wait_for_url(f"**/planning/plans/{plan_id}/")
    page.wait_for_selector("#view-memory[data-ready='1']", timeout=20_000)
    assert not page.is_visible("#scale-down")  # it runs here as it is
    page.fill("#launch input[name=steps]", "4")
    page.click("#launch button[type=submit]")
    page.wait_for_url("**/jobs/*/", timeout=20_000)
    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=180_000)
    job_id = int(page.url.rstrip("/").split("/")[-1])
    assert StoredPlan.objects.get(pk=plan_id).measured_source == f"job/{job_id}"
    assert page.js_errors == []


@pytest.mark.long
def test_a_big_plan_launches_scaled_down_as_a_labelled_job_that_runs_here(live_stack, page, make_member):
    from rest_framework.test import APIClient

    from controlplane.jobs.models import TrainingJob
    from tests.integration.test_plans_that_run_here import import_seed_best_plan

    alice = make_member("alice", "Team A")
    client = APIClient()
    client.force_authenticate(alice)
    r = import_seed_best_plan(client)
    plan_id = r.json()["id"]
    log_in(page, live_stack.base_url, "alice")
    page.goto(f"{live_stack.base_url}/planning/plans/{plan_id}/")
    page.wait_for_selector("#scale-down")
    assert "1,024 devices" in page.inner_text("#not-here")
    # its own Launch could only fail ("use more nodes"): disabled, saying why; the scaled-down one is offered
    assert page.is_disabled("#launch-button")
    assert "cannot run on this machine" in page.get_attribute("#launch-button", "title")
    section = page.inner_text("#scale-down")
    assert f'"scaled-down from plan #{plan_id}"' in section and "cp, ep, dp" in section
    row = page.locator("#scale-down-diff tr[data-field='cluster.devices'] td")
    assert row.all_inner_texts()[1:3] == ["1,024", "4"]  # as the page prints figures (thousands separated)
    assert page.locator("#scale-down-diff tr[data-field='strategy.ep'] td").all_inner_texts()[1:3] == [
        "128",
        "2",
    ]
    assert page.locator("#scale-down-diff tr[data-field='model.num_layers']").count() == 1

    shoot(page, "scale-down", "#scale-down-diff")
    page.fill("#scale-down-form input[name=steps]", "4")
    page.click("#scale-down-form button[type=submit]")
    page.wait_for_url("**/jobs/*/", timeout=30_000)
    job_id = int(page.url.rstrip("/").split("/")[-1])
    assert f"scaled-down from plan #{plan_id}" in page.inner_text("h1")
    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=240_000)
    job = TrainingJob.objects.get(pk=job_id)
    assert job.name == f"scaled-down from plan #{plan_id}" and job.world_size == 4
    assert job.source_plan.name == job.name and job.source_plan_id != plan_id
    assert page.js_errors == []


# every change of the header badge or the progress block, as the user saw it: badge text, the block's
# state, its fraction, the bar's width and the text's first word
RECORD_STATES = """() => {
  window.__seen = [];
  const snap = () => {
    const badge = document.getElementById('search-state'), root = document.getElementById('search-progress');
    if (!badge || !root || !root.dataset.ready) return;
    const text = root.querySelector('.progress-text').textContent;
    window.__seen.push({ badge: badge.textContent, state: root.dataset.state, fraction: root.dataset.fraction,
                         width: root.querySelector('.bar > span').style.width, text: text.split(' ')[0] });
  };
  new MutationObserver(snap).observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
}"""


def test_the_search_page_tells_one_state_while_the_search_runs_and_after(
    live_stack, page, make_member, token_for
):
    alice = make_member("alice", "Team A")
    base = live_stack.base_url
    log_in(page, base, "alice")
    page.add_init_script(f"document.addEventListener('DOMContentLoaded', {RECORD_STATES})")
    status, body = http(
        "POST",
        base + "/api/searches/",
        token_for(alice),
        {
            "cluster_doc": contract("cluster-atlas900.json"),
            "model_doc": contract("model-moe.json"),
            "training": contract("training.json"),
        },
    )
    assert status == 201, body
    page.goto(f"{base}/planning/searches/{body['id']}/")
    page.wait_for_selector("#search-progress[data-state='succeeded']", timeout=60_000)
    page.wait_for_selector("#view-pareto[data-ready='1']", timeout=30_000)
    seen = page.evaluate("() => window.__seen")
    assert seen, "nothing recorded"
    for s in seen:
        assert s["badge"] == s["state"] == s["text"], s  # one state, wherever it is shown
        if s["state"] == "succeeded":
            assert s["fraction"] == "1" and s["width"] == "100%", s
    assert seen[-1]["state"] == "succeeded"

    # the rule itself: once the search ended the page data wins over any live report, and a failed
    # search counts its rejections
    views = page.evaluate(
        """async () => {
          const { progressView } = await import('/static/js/visualizer.js');
          return [
            progressView({ state: 'running', progress: 0.45, stats: {} }, { state: 'succeeded', fraction: 0.45 }),
            progressView({ state: 'succeeded', progress: 1, stats: { evaluated: 10 } }, { state: 'running', fraction: 0.45 }),
            progressView({ state: 'failed', progress: 1, stats: { evaluated: 0, rejected: { a: 600, b: 26 } } }, {}),
          ];
        }"""
    )
    assert (views[0]["state"], views[0]["fraction"]) == ("succeeded", 1)
    assert (views[1]["state"], views[1]["fraction"], views[1]["evaluated"]) == ("succeeded", 1, 10)
    assert (views[2]["state"], views[2]["rejected"]) == ("failed", 626)
    assert page.js_errors == []
