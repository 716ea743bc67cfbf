"""Every page a signed-in user can reach, walked link by link in a real Chromium against the real stack
(daphne runs with DEBUG on, as `make run` does): no link lands in the raw REST API (``/api/<kind>/<id>/``),
no page is a server error, a broken link or Django's debug page, and a missing object is the app's own
404 page, with the navigation and a way back."""

from __future__ import annotations

import re
from collections import deque
from urllib.parse import urldefrag, urlsplit

import pytest
from rest_framework.test import APIClient

from tests.conftest import PASSWORD, import_tiny_cpu_plan
from tests.integration.test_jobs import example, wait_for_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

MAX_PAGES = 300
RENDERED_PER_ROUTE = 3
"""Pages of one URL route (one view, one template: ``/failure-patterns/<key>/``) opened in Chromium, their
links followed and their scripts' errors collected; the others of that route are still fetched and checked
(status, debug page). Rendering every one of the 19 failure-pattern pages alone took ~15 s."""
# one object of the REST API: a page that links here sends the user to a JSON dump of the row instead of
# its page (the planner's labelled "JSON" export links to whole lists, /api/plans/, are deliberate)
API_OBJECT = re.compile(r"^/api/[\w-]+/\d+/$")
# what only Django's technical 404 / 500 pages say
DEBUG_PAGE = ("You’re seeing this error because you have", "You're seeing this error because you have")
VIEWPORT_PX = 1280
"""The browser window's width (Playwright's default viewport): no page may need a wider one (issue 35)."""
# what does not fit the window: the page scrolls sideways, an element ends past its right edge (a chart's
# own SVG drawing aside), or a table's scroll box hides columns (the jobs list's Tags and Age were cut off)
OVERFLOW = """() => {
  const w = window.innerWidth, out = [];
  if (document.documentElement.scrollWidth > w + 1) out.push(`the page scrolls sideways to ${document.documentElement.scrollWidth} px`);
  for (const e of document.querySelectorAll("body *")) {
    if (e.closest("svg, .js-plotly-plot, [hidden]") || getComputedStyle(e).position === "fixed") continue;
    const r = e.getBoundingClientRect();
    if (r.width && r.right > w + 1) { out.push(`${e.tagName.toLowerCase()}#${e.id || ""}.${e.className || ""} ends at ${Math.round(r.right)} px`); break; }
  }
  for (const box of document.querySelectorAll(".table-scroll")) {
    if (box.scrollWidth > box.clientWidth + 1 && box.offsetParent) out.push(`a table needs ${box.scrollWidth} px in a ${box.clientWidth} px box (${box.querySelector("table")?.id || "?"})`);
  }
  return out;
}"""
MISSING = (
    "/jobs/999999/",
    "/planning/plans/999999/",
    "/planning/searches/999999/",
    "/failure-patterns/no_such_kind/",
    "/clusters/999999/",
    "/models/999999/",
    "/hardware/999999/",
)


def log_in(page, base_url: str, username: str) -> None:
    page.goto(base_url + "/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/")


def wait_search(search_id: int, timeout: float = 120):
    import time

    from controlplane.planning.models import StrategySearch

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        search = StrategySearch.objects.get(pk=search_id)
        if search.is_finished:
            return search
        time.sleep(0.2)
    raise AssertionError(f"search {search_id} still {search.state} after {timeout}s")


def seed_objects(user) -> dict:
    """The knowledge base's examples, an imported plan, a search that finished and a job run from the
    plan, all through the API and the real worker."""
    from controlplane.accounts.selectors import teams_of
    from controlplane.planning.seed import local_cpu_cluster, seed_knowledge_base

    client = APIClient()
    client.force_authenticate(user)
    seed_knowledge_base(team=teams_of(user).get())
    plan = import_tiny_cpu_plan(client, "crawled plan")
    cpu, _ = local_cpu_cluster()
    r = client.post(
        "/api/searches/",
        {
            "cluster_doc": {**cpu, "num_nodes": 1, "devices_per_node": 2},
            "model_doc": example("tiny-dense.json"),
            "training": {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"},
            "top_k": 3,
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    search = wait_search(r.json()["id"])
    assert search.state == "succeeded", search.human_readable_error
    r = client.post(
        "/api/jobs/",
        {"name": "crawled job", "plan_id": plan["id"], "steps": 3, "device": "cpu"},
        format="json",
    )
    assert r.status_code == 201, r.content
    job = wait_for_state(r.json()["id"], {"succeeded", "failed"})
    assert job.state == "succeeded", job.log_tail[-2000:]
    from controlplane.clusters.models import Cluster, HardwareProfile
    from controlplane.planning.models import StoredModelSpec

    team = teams_of(user).get()
    return {
        "plan": plan["id"],
        "search": search.pk,
        "job": job.pk,
        "cluster": Cluster.objects.filter(team=team).order_by("name").first().pk,
        "model": StoredModelSpec.objects.filter(team=team).order_by("name").first().pk,
        "profile": HardwareProfile.objects.filter(team=team).order_by("name").first().pk,
    }


def links_on(page) -> list[str]:
    """The absolute targets of the page's links, once its scripts have drawn what they draw."""
    try:
        page.wait_for_load_state("networkidle", timeout=3000)
    except Exception:  # noqa: BLE001 - a page that keeps polling never goes idle; take what is there
        pass
    return page.eval_on_selector_all("a[href]", "els => els.map((e) => e.href)")


def route_of(path: str) -> str:
    """The URL pattern that serves ``path`` (``jobs/<int:pk>/``), or the path itself."""
    from django.urls import Resolver404, resolve

    try:
        return resolve(path).route or path
    except Resolver404:
        return path


def crawl(page, base_url: str, start: str = "/") -> tuple[dict[str, int], list[str]]:
    """Breadth-first over same-origin links from ``start``; returns {url: status} and the problems."""
    origin = urlsplit(base_url).netloc
    queue: deque[tuple[str, str]] = deque([(start, "(start)")])
    seen: dict[str, int] = {}
    problems: list[str] = []
    rendered: dict[str, int] = {}
    while queue and len(seen) < MAX_PAGES:
        url, came_from = queue.popleft()
        if url in seen:
            continue
        path = urlsplit(url).path
        # every target is fetched first: its status and body (a download or JSON too)
        response = page.request.get(base_url + url, max_redirects=5)
        seen[url] = response.status
        body = response.text() if "text" in response.headers.get("content-type", "") else ""
        if response.status >= 500:
            problems.append(f"{url} (linked from {came_from}) answered {response.status}")
        elif response.status >= 400:
            problems.append(f"{url} (linked from {came_from}) is a broken link: {response.status}")
        if any(marker in body for marker in DEBUG_PAGE):
            problems.append(f"{url} (linked from {came_from}) is Django's debug page")
        html = "text/html" in response.headers.get("content-type", "")
        if not html or response.status >= 400 or path.startswith("/api/"):
            continue  # the API's own pages (Swagger UI) are the API's, not ours to walk
        route = route_of(path)
        rendered[route] = rendered.get(route, 0) + 1
        if rendered[route] > RENDERED_PER_ROUTE:
            continue
        errors_before = len(page.js_errors)
        page.goto(base_url + url, wait_until="load")
        for href in links_on(page):
            target, _ = urldefrag(href)
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or parts.netloc != origin:
                continue
            if parts.path.startswith(("/logout/", "/admin/", "/static/")):
                continue
            if API_OBJECT.match(parts.path):
                problems.append(f"{url} links to the raw API: {parts.path}")
                continue
            relative = parts.path + (f"?{parts.query}" if parts.query else "")
            if relative not in seen:
                queue.append((relative, url))
        problems += [f"{url}: script error: {e}" for e in page.js_errors[errors_before:]]
        problems += [f"{url}: wider than the {VIEWPORT_PX} px window: {w}" for w in page.evaluate(OVERFLOW)]
    return seen, problems


def test_every_reachable_page_stays_in_the_app(live_stack, page, make_member):
    alice = make_member("alice", "Team A")
    ids = seed_objects(alice)
    log_in(page, live_stack.base_url, "alice")

    seen, problems = crawl(page, live_stack.base_url)

    assert not problems, "\n".join(problems)
    # the walk reached the pages of every kind of object seeded, through links a user can click
    for wanted in (
        f"/jobs/{ids['job']}/",
        f"/planning/searches/{ids['search']}/",
        f"/planning/plans/{ids['plan']}/",
        "/failure-patterns/gpu_hbm3/",
        "/clusters/",
        "/clusters/new/",
        f"/clusters/{ids['cluster']}/",
        f"/clusters/{ids['cluster']}/edit/",
        f"/clusters/{ids['cluster']}/copy/",
        "/models/",
        "/models/new/",
        f"/models/{ids['model']}/",
        "/hardware/",
        f"/hardware/{ids['profile']}/",
        "/planning/plans/",
    ):
        assert wanted in seen, f"no link reaches {wanted}; walked {sorted(seen)}"
    assert len(seen) < MAX_PAGES, "the walk hit its bound: some pages were never visited"


def test_a_missing_object_is_the_apps_404_page(live_stack, page, make_member):
    make_member("alice", "Team A")
    log_in(page, live_stack.base_url, "alice")
    for path in MISSING:
        response = page.goto(live_stack.base_url + path)
        assert response.status == 404, path
        text = page.inner_text("body")
        assert not any(marker in text for marker in DEBUG_PAGE), f"{path} is Django's debug page"
        assert page.locator("header.topbar nav a", has_text="Jobs").count() == 1, f"{path} has no navigation"
        assert page.locator("main a.way-back").count() >= 1, f"{path} offers no way back"
        assert "Page not found" in page.inner_text("main h1")
    # the API keeps answering JSON
    response = page.request.get(live_stack.base_url + "/api/jobs/999999/")
    assert response.status == 404 and response.headers["content-type"].startswith("application/json")
