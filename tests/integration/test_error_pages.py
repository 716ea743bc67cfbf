"""The app's own 404, 403 and 500 pages, with the navigation and a way back, in production (DEBUG=0) and
under `make run` (DEBUG=1), while the API keeps answering JSON; the 500 page renders without a database."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client, override_settings
from django.urls import path

from controlplane import urls as app_urls


def boom(request):
    raise RuntimeError("a bug")


def forbidden(request):
    raise PermissionDenied("Only the owning team may see this run.")


# the app's URLs and error handlers, plus two views that fail on purpose
urlpatterns = [path("jobs/boom/", boom), path("jobs/forbidden/", forbidden), *app_urls.urlpatterns]
handler404, handler403, handler500 = app_urls.handler404, app_urls.handler403, app_urls.handler500

MISSING = {
    "/jobs/999999/": ("No such job among your teams' jobs.", "/jobs/"),
    "/planning/plans/999999/": ("No such plan among your teams' plans.", "/planning/"),
    "/planning/searches/999999/": ("No such search among your teams' searches.", "/planning/"),
}
DEBUG_PAGE = "seeing this error because you have"


@pytest.fixture
def alice_browser(make_member):
    client = Client()
    client.force_login(make_member("alice", "Team A"))
    return client


def assert_app_page(response, status: int, heading: str, back_to: str) -> str:
    html = response.content.decode()
    assert response.status_code == status
    assert response["Content-Type"].startswith("text/html")
    assert DEBUG_PAGE not in html
    assert f"<h1>{heading}</h1>" in html
    assert '<a href="/jobs/">Jobs</a>' in html and '<a href="/planning/">Planner</a>' in html  # the nav
    assert f'class="way-back" href="{back_to}"' in html
    return html


@pytest.mark.django_db
@pytest.mark.parametrize("debug", [False, True], ids=["DEBUG=0", "DEBUG=1"])
def test_a_missing_object_is_the_apps_404_page(alice_browser, debug):
    with override_settings(DEBUG=debug):
        for url, (message, back_to) in MISSING.items():
            html = assert_app_page(alice_browser.get(url), 404, "Page not found", back_to)
            assert message.replace("'", "&#x27;") in html
        # a URL that matches nothing: the app's page in production
        if not debug:
            html = assert_app_page(alice_browser.get("/no/such/page/"), 404, "Page not found", "/")
            assert "There is no page at <code>/no/such/page/</code>" in html


@pytest.mark.django_db
@pytest.mark.parametrize("debug", [False, True], ids=["DEBUG=0", "DEBUG=1"])
def test_the_api_keeps_answering_json(alice_browser, debug):
    with override_settings(DEBUG=debug):
        for url in ("/api/jobs/999999/", "/api/plans/999999/", "/api/searches/999999/"):
            r = alice_browser.get(url)
            assert r.status_code == 404 and r["Content-Type"].startswith("application/json"), url
            assert set(r.json()) == {"detail"}, url
    r = alice_browser.get("/api/no-such-endpoint/")
    assert r.status_code == 404 and r.json() == {"detail": "Not found."}


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__)
def test_a_forbidden_page_is_the_apps_403_page(alice_browser):
    html = assert_app_page(alice_browser.get("/jobs/forbidden/"), 403, "Not allowed", "/jobs/")
    assert "Only the owning team may see this run." in html


@override_settings(ROOT_URLCONF=__name__)
def test_a_server_error_is_the_apps_500_page_without_touching_the_database():
    """No ``django_db`` mark: any query (the session, the user) would fail this test."""
    client = Client(raise_request_exception=False)
    html = assert_app_page(client.get("/jobs/boom/"), 500, "Something went wrong on our side", "/jobs/")
    assert "Log out" not in html  # nobody is looked up
