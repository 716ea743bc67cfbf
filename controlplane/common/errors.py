"""The app's own error pages: 404, 403 and 500 with the navigation and a way back to the section the user
came from; under ``/api/`` the same errors stay JSON, as DRF answers them (``{"detail": ...}``).

Mounted as ``handler404``/``handler403``/``handler500`` in ``controlplane/urls.py``; with ``DEBUG`` on,
``middleware.AppNotFoundPageMiddleware`` sends a page view's ``Http404`` here too."""

from __future__ import annotations

from django.http import HttpResponseServerError, JsonResponse
from django.shortcuts import render
from django.template import loader
from django.urls import reverse

# where a path under each prefix goes back to: (prefix, url name, label)
SECTIONS = (
    ("/jobs/", "job-list", "the job list"),
    ("/planning/", "search-list", "the planner"),
    ("/failure-patterns/", "failure-pattern-list", "the failure patterns"),
    ("/tokens/", "tokens", "your API tokens"),
)


def is_api(request) -> bool:
    return request.path.startswith("/api/")


def way_back(path: str) -> list[dict[str, str]]:
    """Links back: the list of the section ``path`` is in, then the dashboard."""
    links = [
        {"url": reverse(name), "label": f"Back to {label}"}
        for prefix, name, label in SECTIONS
        if path.startswith(prefix)
    ]
    links.append({"url": reverse("dashboard"), "label": "Go to the dashboard"})
    return links


def _message(exception) -> str:
    """What a view said when it raised (``Http404("No such job among your teams' jobs.")``); a resolver's
    404 carries a dict of the patterns it tried instead, which is not for users."""
    message = exception.args[0] if exception is not None and exception.args else ""
    return message if isinstance(message, str) else ""


def page_not_found(request, exception=None):
    if is_api(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    context = {"path": request.path, "message": _message(exception), "way_back": way_back(request.path)}
    return render(request, "404.html", context, status=404)


def permission_denied(request, exception=None):
    if is_api(request):
        return JsonResponse({"detail": "You do not have permission to perform this action."}, status=403)
    context = {"path": request.path, "message": _message(exception), "way_back": way_back(request.path)}
    return render(request, "403.html", context, status=403)


def server_error(request):
    """Rendered without the request: no context processor runs, so neither the session, the user, the
    database nor Redis is touched (any of them may be why we are here)."""
    if is_api(request):
        return JsonResponse({"detail": "Server error: the failure was logged."}, status=500)
    html = loader.get_template("500.html").render({"static_nav": True, "way_back": way_back(request.path)})
    return HttpResponseServerError(html)
