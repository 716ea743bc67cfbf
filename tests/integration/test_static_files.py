"""Static files as a chart page's browser gets them from the real daphne (issue 35): the page names plotly.js
and its ES modules by their content's hash, and each comes with a ten-year ``immutable`` Cache-Control and
Brotli or gzip as asked; the modules' imports name hashed files too, so nothing a page loads is asked again."""

from __future__ import annotations

import gzip
import re
import urllib.request

import brotli
import pytest
from django.test import Client

from tests.conftest import build_static_once

pytestmark = [pytest.mark.django_db(transaction=True)]

HASHED = r"\.[0-9a-f]{12}\."
TEN_YEARS_S = 10 * 365 * 24 * 3600


def get(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=15) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()


def signed_in_page(live_stack, user, path: str) -> str:
    browser = Client()
    browser.force_login(user)  # the session is in the database the stack's daphne reads
    status, _, html = get(
        live_stack.base_url + path, {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}
    )
    assert status == 200
    return html.decode()


def assert_cached_for_good(headers: dict) -> None:
    cache = headers["cache-control"]
    assert "immutable" in cache and int(re.search(r"max-age=(\d+)", cache).group(1)) >= TEN_YEARS_S, cache


def test_a_chart_page_loads_hashed_compressed_files_cached_for_good(live_stack, alice):
    html = signed_in_page(live_stack, alice, "/green/")
    # the green page names plotly.js for its first chart to load (charts.js: loadPlotly)
    plotly = re.search(rf'<meta name="plotly-src" content="(/static/plotly/plotly\.min{HASHED}js)">', html)
    assert plotly, "the page names plotly.js by its hash"
    plain = None
    for encoding, decompress in (("br", brotli.decompress), ("gzip", gzip.decompress), ("identity", None)):
        status, headers, body = get(live_stack.base_url + plotly.group(1), {"Accept-Encoding": encoding})
        assert status == 200
        assert_cached_for_good(headers)
        if decompress:
            assert headers["content-encoding"] == encoding and "accept-encoding" in headers["vary"].lower()
            body = decompress(body)
        else:
            assert "content-encoding" not in headers
        assert plain is None or body == plain
        plain = body
    # the partial bundle (scatter, bar, heatmap and the other cartesian traces) where npm could fetch it
    if build_static_once()["plotly"]["bundle"] == "partial":
        assert b"plotly.js (cartesian - minified)" in plain[:300] and len(plain) < 2_000_000
    else:
        assert b"plotly.js v" in plain[:300]

    module = re.search(rf'<script type="module" src="(/static/js/green{HASHED}js)"></script>', html)
    assert module, "the page's module is named by its hash"
    status, headers, body = get(live_stack.base_url + module.group(1), {"Accept-Encoding": "gzip"})
    assert_cached_for_good(headers)
    imports = re.findall(r'from "\./([^"]+)"', gzip.decompress(body).decode())
    assert imports and all(re.search(HASHED + "js$", name) for name in imports), imports
    status, headers, _ = get(f"{live_stack.base_url}/static/js/{imports[0]}", {"Accept-Encoding": "br"})
    assert status == 200 and headers["content-encoding"] == "br"
    assert_cached_for_good(headers)
