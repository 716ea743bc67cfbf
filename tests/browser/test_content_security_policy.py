"""The Content-Security-Policy in a real Chromium against the real stack: every main page (dashboard, job
list, a job, a strategy search, a plan, the green page, the API docs) is served with the policy, draws its
charts and tables, and the browser reports no violation (no inline script, style or handler left)."""

from __future__ import annotations

import pytest

from tests.browser.test_crawl import log_in, seed_objects

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

# every violation the page reports, kept on window before any page script runs (Playwright's init scripts
# are injected by the browser itself, so the policy does not apply to this one)
RECORD_VIOLATIONS = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.cspViolations.push(`${e.effectiveDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`));
"""
PLOTS = "[...document.querySelectorAll('.js-plotly-plot')].filter((d) => d.data && d.data.length).length"


def open_page(page, base_url: str, path: str, console: list[str]) -> str:
    """Open ``path``; its Content-Security-Policy header (the page must have one)."""
    console.clear()
    response = page.goto(base_url + path)
    assert response.status == 200, f"{path}: {response.status}"
    policy = response.headers.get("content-security-policy", "")
    assert "script-src 'self'" in policy, f"{path}: no policy ({policy!r})"
    return policy


# Redoc's sidebar shows Redocly's logo from their CDN, with no option to hide it: refused, as every
# third-party request is (nothing is loaded from a CDN), and the page is whole without it
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def assert_no_violations(page, path: str, console: list[str], allowed: str = "\0") -> None:
    try:
        page.wait_for_load_state("networkidle", timeout=3000)
    except Exception:  # noqa: BLE001 - a page that keeps polling never goes idle
        pass
    violations = page.evaluate("window.cspViolations") + [
        m for m in console if "Content Security Policy" in m
    ]
    violations = [v for v in violations if allowed not in v]
    assert not violations, f"{path}: {violations}"
    assert not page.js_errors, f"{path}: {page.js_errors}"


def test_main_pages_render_their_charts_under_the_policy_with_no_violation(live_stack, page, make_member):
    user = make_member("csp", "Team CSP")
    ids = seed_objects(user)
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text))
    page.add_init_script(RECORD_VIOLATIONS)
    base = live_stack.base_url
    log_in(page, base, "csp")

    policy = open_page(page, base, "/", console)
    for directive in (
        "default-src 'self'",
        "style-src 'self' 'unsafe-inline'",  # plotly.js's own <style> elements (settings.SECURE_CSP)
        "img-src 'self' data: blob:",
        "object-src 'none'",
        "frame-ancestors 'none'",
        "base-uri 'self'",
        "form-action 'self'",
    ):
        assert directive in policy, policy
    host = base.split("://", 1)[1]
    assert f"connect-src 'self' ws://{host}" in policy, policy
    assert "unsafe" not in policy.replace("style-src 'self' 'unsafe-inline'", ""), policy
    page.wait_for_selector("#dashboard-lists", state="attached")
    assert_no_violations(page, "/", console)

    open_page(page, base, "/jobs/", console)
    page.wait_for_selector(f"#job-table tr[data-job='{ids['job']}'], #job-table tbody tr td")
    assert_no_violations(page, "/jobs/", console)

    job = f"/jobs/{ids['job']}/"
    open_page(page, base, job, console)
    page.wait_for_function(
        "() => { const d = document.getElementById('chart-loss'); return d && d.data && d.data[0].x.length > 0; }"
    )
    assert_no_violations(page, job, console)

    search = f"/planning/searches/{ids['search']}/"
    open_page(page, base, search, console)
    page.wait_for_function(f"() => {PLOTS} >= 3")
    assert_no_violations(page, search, console)

    plan = f"/planning/plans/{ids['plan']}/"
    open_page(page, base, plan, console)
    page.wait_for_function(f"() => {PLOTS} >= 2")
    assert_no_violations(page, plan, console)

    # the green page draws its chart once a schedule is asked for (GB's shipped 2020 history)
    open_page(page, base, "/green/", console)
    page.fill("#schedule-form input[name=now]", "2020-06-01T00:00")
    page.click("#schedule-submit")
    page.wait_for_function(
        "() => { const d = document.getElementById('schedule-chart'); return d && d.data && d.data.length; }"
    )
    assert_no_violations(page, "/green/", console)

    # Swagger UI and Redoc: their scripts from 'self' too
    for path, ready in (("/api/docs/", ".swagger-ui .info .title"), ("/api/redoc/", "h1")):
        policy = open_page(page, base, path, console)
        assert "script-src 'self';" in policy, policy
        page.wait_for_selector(ready, timeout=30000)
        assert "cann-train API" in page.inner_text(ready)
        assert_no_violations(page, path, console, allowed=REDOC_LOGO)
