"""The strategy visualizer in a real browser: the seed scenario (the 1.25T MoE on the Atlas 900 pod) is
searched through the API, its page shows the progress and then all seven views with data; clicking a
point of the Pareto plot changes the breakdowns; a what-if child page compares the best plans; the plan
page does not offer to launch a model this machine cannot run, showing why (and the scaled-down launch)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import PASSWORD, ROOT, http

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

# the planner's vendored copy of the contracts, else the shared originals beside the repository
CONTRACTS = next(
    (p for p in (ROOT / "workers/planner/data/contracts", ROOT.parent / "shared/contracts") if p.exists()),
    ROOT / "workers/planner/data/contracts",
)


def contract(name: str) -> dict:
    return json.loads(Path(CONTRACTS, name).read_text())


VIEWS = ["pareto", "memory", "steptime", "schedule", "placement", "diff", "whatif"]

# the data arrays of a view's Plotly traces, to compare a view before and after a click
TRACE_DATA = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  if (!gd || !gd.data) return null;
  return JSON.stringify(gd.data.map((t) => [t.name, t.x, t.y, t.z, t.base]));
}"""

# points a view draws: the longest x / y / z array over its traces
POINTS = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  if (!gd || !gd.data) return 0;
  return Math.max(0, ...gd.data.map((t) => Math.max((t.x || []).length, (t.y || []).length, (t.z || []).length)));
}"""

# an isolated candidate with a pipeline (pp >= 4), far from the best plan's star, and its pixel position
PICK_POINT = """() => {
  const gd = document.querySelector('#view-pareto .js-plotly-plot');
  const fl = gd._fullLayout, xa = fl.xaxis, ya = fl.yaxis, box = gd.getBoundingClientRect();
  const px = (x, y) => [box.left + xa._offset + xa.l2p(x), box.top + ya._offset + ya.l2p(y)];
  const cands = window.__viz.data.candidates;
  const pts = cands.map((c) => px(c.memory_GiB, c.tokens_per_s));
  const star = gd.data.find((t) => t.name === "best plan");
  const [sx, sy] = px(star.x[0], star.y[0]);
  let best = null;
  cands.forEach((c, i) => {
    if (c.strategy.pp < 4) return;
    const [x, y] = pts[i];
    if (Math.hypot(x - sx, y - sy) < 40) return;
    let near = Infinity;
    pts.forEach(([u, v], j) => { if (j !== i) near = Math.min(near, Math.hypot(u - x, v - y)); });
    if (!best || near > best.near) best = { i, near, x, y, strategy: c.strategy };
  });
  return best;
}"""


# VISUALIZER_SCREENSHOTS=docs/img saves a picture of each view on the way (for docs/visualizer.md)
SHOTS = os.environ.get("VISUALIZER_SCREENSHOTS")


def shoot(page, name, selector=None):
    if not SHOTS:
        return
    Path(SHOTS).mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(400)  # let Plotly finish its transitions
    target = page.locator(selector).locator("xpath=..") if selector else page
    kwargs = {} if selector else {"full_page": True}
    target.screenshot(path=str(Path(SHOTS, f"visualizer-{name}.png")), **kwargs)


def log_in(page, base_url, username):
    page.goto(base_url + "/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/")


def wait_views(page, views, timeout=45_000):
    for v in views:
        page.wait_for_selector(f"#view-{v}[data-ready='1']", timeout=timeout)
        assert page.evaluate(POINTS, f"#view-{v}") > 0, f"view {v} has no data"


@pytest.mark.long
def test_seed_scenario_visualizer(live_stack, page, make_member, token_for):
    alice = make_member("alice", "Team A")
    token = token_for(alice)
    base = live_stack.base_url
    status, search = http(
        "POST",
        base + "/api/searches/",
        token,
        {
            "cluster_doc": contract("cluster-atlas900.json"),
            "model_doc": contract("model-moe.json"),
            "training": contract("training.json"),
        },
    )
    assert status == 201, search
    log_in(page, base, "alice")
    page_path = f"/planning/searches/{search['id']}/"
    page.goto(base + page_path)
    # from here on the page gets its data from the API, never by fetching its own HTML again
    requested = []
    page.on("request", lambda r: requested.append(urlsplit(r.url).path))
    opened_as = page.get_attribute("#search-progress", "data-state")

    # the progress bar runs to the end (live events, or the API poll when the search beat the page)
    page.wait_for_selector("#search-progress[data-state='succeeded'][data-fraction='1']", timeout=45_000)
    assert page.locator("#search-progress .bar > span").evaluate("e => e.style.width") == "100%"
    assert "layouts evaluated" in page.inner_text("#search-progress .progress-text")

    wait_views(page, VIEWS)
    seen = page.evaluate("() => window.__viz.progress")  # fractions of the progress events received
    if opened_as in ("queued", "running"):
        # the page watched the search: live progress events (replayed from seq 0 if it was quick)
        assert seen and seen[-1] == 1 and seen == sorted(seen), seen
    for table in ("plan-table", "similar-plans"):
        page.wait_for_selector(f"#{table}[data-ready='1']", timeout=5_000)
    assert page.locator("#plan-table tbody tr").count() >= 10
    data = page.evaluate("() => window.__viz.data")
    assert len(data["candidates"]) > 100 and data["visuals"]["schedule"]["blocks"]
    # the runner-up's bars are the server's breakdown of it (nothing re-derived in the browser)
    second = next(p for p in data["plans"] if p["rank"] == 2)
    bars = page.evaluate(
        "() => ['#view-memory', '#view-steptime'].map((id) => "
        "document.querySelector(`${id} .js-plotly-plot`).data[0].x)"
    )
    assert bars[0][1] == pytest.approx(second["breakdown"]["memory"]["parts"]["params"])
    assert bars[1][1] == pytest.approx(second["breakdown"]["step_time"]["parts"]["compute"])
    assert bars[0][0] == pytest.approx(data["visuals"]["memory"]["parts"]["params"])
    assert page.locator("#view-placement table.placement-links tr[data-kind='ep']").count() == 1
    assert page.inner_text("#search-state") == "succeeded"
    for v in ("pareto", "memory", "steptime", "schedule", "placement", "diff"):
        shoot(page, f"{v}-best", f"#view-{v}")
    shoot(page, "search-page")

    # click a point of the Pareto plot with the mouse: views 2-5 redraw for that strategy
    before = {
        v: page.evaluate(TRACE_DATA, f"#view-{v}") for v in ("memory", "steptime", "schedule", "placement")
    }
    best_text = page.get_attribute("#selection", "data-strategy")
    page.evaluate("() => document.querySelector('#view-pareto').scrollIntoView({block: 'center'})")
    target = page.evaluate(PICK_POINT)
    assert target, "no isolated pipelined candidate to click"
    page.mouse.move(target["x"], target["y"])
    page.mouse.click(target["x"], target["y"])
    page.wait_for_function(
        "(old) => document.querySelector('#selection').dataset.strategy !== old && "
        "!document.querySelector('.selection-status').textContent",
        arg=best_text,
        timeout=15_000,
    )
    chosen = page.get_attribute("#selection", "data-strategy")
    assert f"PP{target['strategy']['pp']}" in chosen and f"TP{target['strategy']['tp']}" in chosen
    for v, old in before.items():
        page.wait_for_function(f"(old) => ({TRACE_DATA})('#view-{v}') !== old", arg=old, timeout=10_000)
    stages = page.evaluate(
        "() => document.querySelector('#view-schedule .js-plotly-plot').layout.yaxis.categoryarray.length"
    )
    assert stages == target["strategy"]["pp"]
    for v in ("pareto", "schedule", "placement"):
        shoot(page, f"{v}-selected", f"#view-{v}")

    # the runner-up from the plan table; its placement coloured by pipeline stage
    second = next(p for p in data["plans"] if p["rank"] == 2)
    picked = page.get_attribute("#selection", "data-strategy")
    page.click("#plan-table tr:nth-child(2) a.pick-plan")
    page.wait_for_function(
        "(old) => document.querySelector('#selection').dataset.strategy !== old", arg=picked, timeout=15_000
    )
    page.wait_for_function(
        "(pp) => document.querySelector('#view-schedule .js-plotly-plot').layout.yaxis.categoryarray.length === pp",
        arg=second["strategy"]["pp"],
        timeout=10_000,
    )
    before_colour = page.evaluate(TRACE_DATA, "#view-placement")
    page.select_option("#view-placement select.placement-kind", "pp")
    page.wait_for_function(f"(old) => ({TRACE_DATA})('#view-placement') !== old", arg=before_colour)
    shoot(page, "schedule-runner-up", "#view-schedule")
    shoot(page, "placement-runner-up", "#view-placement")

    assert page_path not in requested, "the search page fetched its own HTML again"

    # the plan page of the best plan: its views, and no launch the CPU machine would refuse
    best_id = data["best_plan_id"]
    page.goto(f"{base}/planning/plans/{best_id}/")
    wait_views(page, ["memory", "steptime", "schedule", "placement"])
    # (its Launch is disabled with the reason, and the scaled-down launch is offered instead)
    assert page.is_disabled("#launch-button")
    assert "cannot run on this machine" in page.get_attribute("#launch-button", "title")
    assert "cannot run on this machine" in page.inner_text("#not-here") and page.is_visible("#scale-down")
    shoot(page, "plan-page")
    assert page.url.endswith(f"/planning/plans/{best_id}/")

    # what-if: lose half the pod, land on the child search, compare the best plans
    page.goto(f"{base}/planning/searches/{search['id']}/")
    wait_views(page, ["whatif"])
    page.fill("#view-whatif input[name=lose_nodes]", "64")
    page.click("#view-whatif button[type=submit]")
    page.wait_for_url(
        lambda url: "/planning/searches/" in url and f"/{search['id']}/" not in url, timeout=15_000
    )
    page.wait_for_selector("#search-progress[data-state='succeeded']", timeout=45_000)
    wait_views(page, ["whatif", "diff"])
    summary = page.inner_text("#view-whatif .what-if-summary")
    assert "Losing 64 of 128 nodes" in summary, summary
    whatif = json.loads(page.evaluate(TRACE_DATA, "#view-whatif"))
    assert len(whatif) == 2  # before and after
    shoot(page, "whatif", "#view-whatif")
    shoot(page, "diff-whatif", "#view-diff")

    # the full diff page of the two best plans
    page.click("#view-diff a.diff-link")
    page.wait_for_url(lambda url: "/planning/plans/diff/?a=" in url)
    wait_views(page, ["diff"])
    assert page.locator("#diff-table tr.differs[data-field='predicted.tokens_per_s']").count() == 1
    assert page.js_errors == []
