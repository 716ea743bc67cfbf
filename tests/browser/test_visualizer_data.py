"""How the search page follows a search, seen from the browser's network traffic: while its websocket is
open it never polls the search API; with the socket down it polls, and stops once the search ended; it asks
``/api/searches/<id>/page-data/`` for its views' data once it has painted and again at the end (never its
own HTML again), and updates the state badge in place from that JSON."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from tests.browser.test_visualizer import log_in, wait_views
from tests.integration.test_search_page_data import queued_search, run_search

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

POLL_S = 3  # the page's poll interval (POLL_MS in visualizer.js)

# a WebSocket that never opens: every connection attempt closes at once, as when the server is down
DEAD_SOCKET = """
window.WebSocket = class extends EventTarget {
  static CONNECTING = 0; static OPEN = 1; static CLOSING = 2; static CLOSED = 3;
  constructor(url) {
    super();
    this.url = url;
    this.readyState = 3;
    setTimeout(() => this.dispatchEvent(Object.assign(new Event("close"), { code: 1006 })), 20);
  }
  send() {}
  close() {}
};
"""


@dataclass
class Traffic:
    """The requests of a page (time, path) and the intervals its websockets were open, in one clock."""

    requests: list = field(default_factory=list)
    sockets: list = field(default_factory=list)  # [opened_at, closed_at or None]

    def watch(self, page) -> Traffic:
        page.on("request", lambda r: self.requests.append((time.monotonic(), urlsplit(r.url).path)))
        page.on("websocket", self._socket)
        return self

    def _socket(self, ws):
        interval = [None, None]
        self.sockets.append(interval)

        def opened(_frame):  # the first frame from the server: the socket is open
            if interval[0] is None:
                interval[0] = time.monotonic()

        ws.on("framereceived", opened)
        ws.on("close", lambda _ws: interval.__setitem__(1, time.monotonic()))

    def to(self, path: str, after: float = 0.0) -> list[float]:
        return [t for t, p in self.requests if p == path and t > after]

    def while_open(self, path: str) -> list[float]:
        now = time.monotonic()
        return [
            t
            for t in self.to(path)
            if any(start is not None and start <= t <= (end or now) for start, end in self.sockets)
        ]


def paths(search_id: int) -> dict:
    return {
        "page": f"/planning/searches/{search_id}/",
        "poll": f"/api/searches/{search_id}/",
        "page_data": f"/api/searches/{search_id}/page-data/",
    }


def open_search_page(page, base, search_id) -> tuple[Traffic, float]:
    """Open the page with its traffic watched; returns the traffic and the time the page had loaded."""
    traffic = Traffic().watch(page)
    page.goto(f"{base}/planning/searches/{search_id}/")
    loaded = time.monotonic()
    # the badge node itself: updating it in place keeps this reference the page's badge
    page.evaluate("() => { window.__badge = document.getElementById('search-state'); }")
    return traffic, loaded


def assert_badge_is(page, state):
    page.wait_for_function(
        "(s) => document.getElementById('search-state').textContent === s", arg=state, timeout=30_000
    )
    assert page.get_attribute("#search-state", "class") == f"state {state}"
    assert page.evaluate("() => window.__badge === document.getElementById('search-state')"), (
        "the badge was replaced, not updated"
    )


@pytest.mark.long
def test_with_the_socket_open_the_page_never_polls_and_ends_from_page_data(live_stack, page, make_member):
    alice = make_member("alice", "Team A")
    search = queued_search(alice.teams.first())
    url = paths(search.pk)
    log_in(page, live_stack.base_url, "alice")
    traffic, loaded = open_search_page(page, live_stack.base_url, search.pk)
    assert page.inner_text("#search-state") == "queued"

    page.wait_for_selector("#search-progress[data-live='live']", timeout=15_000)
    page.wait_for_timeout(2.5 * POLL_S * 1000)  # the socket is open: no poll comes, however long we wait
    assert traffic.while_open(url["poll"]) == []

    run_search(search)  # progress and the end arrive over the websocket
    assert_badge_is(page, "succeeded")
    page.wait_for_selector("#search-progress[data-state='succeeded'][data-fraction='1']", timeout=15_000)
    wait_views(page, ["pareto", "memory", "steptime", "schedule", "placement", "diff"])
    assert len(traffic.to(url["page_data"])) == 2  # once painted, and at the end
    assert traffic.while_open(url["poll"]) == []
    ended = time.monotonic()
    page.wait_for_timeout(1.5 * POLL_S * 1000)
    assert traffic.to(url["poll"], after=ended) == [], "the page polls after the search ended"
    assert traffic.to(url["page"], after=loaded) == [], "the page fetched its own HTML again"
    assert page.js_errors == []

    # a finished search's page: nothing to follow; its views' data fetched once, nothing else after it loaded
    traffic, loaded = open_search_page(page, live_stack.base_url, search.pk)
    wait_views(page, ["pareto", "memory", "steptime", "schedule", "placement", "diff"])
    page.wait_for_timeout(1.5 * POLL_S * 1000)
    assert len(traffic.to(url["page_data"])) == 1
    for path in (url["page"], url["poll"]):
        assert traffic.to(path, after=loaded) == [], path
    assert traffic.sockets == []


def test_with_the_socket_down_the_page_polls_until_the_search_ends(live_stack, page, make_member):
    alice = make_member("alice", "Team A")
    search = queued_search(alice.teams.first())
    url = paths(search.pk)
    log_in(page, live_stack.base_url, "alice")
    page.add_init_script(DEAD_SOCKET)
    traffic, loaded = open_search_page(page, live_stack.base_url, search.pk)

    page.wait_for_function(
        "() => ['connecting', 'reconnecting'].includes(document.getElementById('search-progress').dataset.live)"
    )
    deadline = time.monotonic() + 3 * POLL_S
    while not traffic.to(url["poll"]) and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert traffic.to(url["poll"]), "no poll while the websocket is down"

    run_search(search)  # the next poll sees the end
    assert_badge_is(page, "succeeded")
    wait_views(page, ["pareto", "memory", "steptime", "schedule", "placement", "diff"])
    assert len(traffic.to(url["page_data"])) == 2  # once painted, and at the end
    ended = time.monotonic()
    page.wait_for_timeout(1.5 * POLL_S * 1000)
    assert traffic.to(url["poll"], after=ended) == [], "the page polls after the search ended"
    assert traffic.to(url["page"], after=loaded) == [], "the page fetched its own HTML again"
    assert page.js_errors == []
