"""Every route has a row in the authorization matrix (tests/integration/test_authorization_matrix.py): a new API
operation, page or websocket route fails here until the matrix says who may use it. (Its own file: the matrix
had grown past the 800 lines a file may hold.)"""

from __future__ import annotations

import re

from tests.integration.test_authorization_matrix import API, BY_CODE, DOCS, PAGES, PUBLIC


def api_operations() -> set[tuple[str, str]]:
    """(method, path) of every API endpoint the URL resolver holds, as /api/schema/ names them."""
    from drf_spectacular.generators import EndpointEnumerator

    return {
        (method, re.sub(r"\{pk\}", "{id}", path))
        for path, _regex, method, _callback in EndpointEnumerator().get_api_endpoints()
    }


def page_routes() -> dict[str, str]:
    """name -> route of every URL pattern outside /api/ and /admin/."""
    from django.urls import URLPattern, URLResolver, get_resolver

    routes = {}

    def walk(patterns, prefix: str) -> None:
        for p in patterns:
            route = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                if not route.startswith(("api/", "admin/")):
                    walk(p.url_patterns, route)
            elif isinstance(p, URLPattern):
                routes[p.name or route] = route

    walk(get_resolver().url_patterns, "")
    return routes


def test_every_route_is_classified():
    """A new API operation, page or websocket route fails here until this matrix says who may use it."""
    from controlplane.live.routing import websocket_urlpatterns

    operations = api_operations()
    unclassified = sorted(operations - set(API) - DOCS - set(BY_CODE))
    stale = sorted((set(API) | DOCS | set(BY_CODE)) - operations)
    assert not unclassified, f"API operations without a row in API (or DOCS, BY_CODE): {unclassified}"
    assert not stale, f"rows for operations that no longer exist: {stale}"
    pages = page_routes()
    assert not sorted(set(pages) - set(PAGES) - PUBLIC), "pages without a row in PAGES"
    assert not sorted((set(PAGES) | PUBLIC) - set(pages)), "rows for pages that no longer exist"
    assert [str(p.pattern) for p in websocket_urlpatterns] == ["ws/live/"], "a new websocket route"
    # every API view the URL resolver routes to is one the enumerator (and so /api/schema/ and API) knows
    from drf_spectacular.generators import EndpointEnumerator
    from rest_framework.routers import APIRootView

    known = {callback.cls for _p, _r, _m, callback in EndpointEnumerator().get_api_endpoints()}
    routed = {view for view in api_views() if not issubclass(view, APIRootView)}
    assert routed <= known, f"API views missing from the schema: {routed - known}"


def api_views() -> set[type]:
    """The APIView classes of every URL pattern under /api/."""
    from django.urls import URLPattern, URLResolver, get_resolver

    views = set()

    def walk(patterns, prefix: str) -> None:
        for p in patterns:
            route = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, route)
            elif isinstance(p, URLPattern) and route.startswith("api/") and hasattr(p.callback, "cls"):
                views.add(p.callback.cls)

    walk(get_resolver().url_patterns, "")
    return views
