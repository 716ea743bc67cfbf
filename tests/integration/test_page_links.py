"""The pages' links to a job, a search and a plan open the app's pages, not the REST API: the API's URL
names live in their own namespace (``api:job-detail``), so a page's ``{% url 'job-detail' %}`` cannot
resolve to ``/api/jobs/<id>/``. The browser crawl (tests/browser/test_crawl.py) walks every link; this is
the same rule without a browser."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from tests.conftest import import_tiny_cpu_plan
from workers.planner.examples import contract

pytestmark = pytest.mark.django_db

HREF = re.compile(r'href="([^"]+)"')
API_OBJECT = re.compile(r"^/api/[\w-]+/\d+/$")


def test_page_url_names_are_the_pages_and_the_apis_are_namespaced():
    assert reverse("job-detail", args=[7]) == "/jobs/7/"
    assert reverse("search-detail", args=[7]) == "/planning/searches/7/"
    assert reverse("plan-detail", args=[7]) == "/planning/plans/7/"
    assert reverse("job-list") == "/jobs/" and reverse("search-list") == "/planning/"
    assert reverse("api:job-detail", args=[7]) == "/api/jobs/7/"
    assert reverse("api:plan-detail", args=[7]) == "/api/plans/7/"
    assert reverse("api:docs") == "/api/docs/"


def test_list_pages_link_to_the_pages_of_jobs_searches_and_plans(make_member):
    from controlplane.accounts.selectors import teams_of
    from controlplane.jobs.services import job_submit
    from controlplane.planning.seed import seed_knowledge_base
    from controlplane.planning.services import search_create

    alice = make_member("alice", "Team A")
    team = teams_of(alice).get()
    api = APIClient()
    api.force_authenticate(alice)
    seed_knowledge_base(team=team)  # measured plans, listed on the planner page
    plan = import_tiny_cpu_plan(api)
    job = job_submit(user=alice, name="linked", plan_id=plan["id"], steps=3, device="cpu")
    search = search_create(
        team=team,
        created_by=alice,
        cluster_doc=contract("cluster.json"),
        model_doc=contract("model.json"),
        training=contract("training.json"),
    )
    browser = Client()
    browser.force_login(alice)
    links = {}
    for page in ("/", "/jobs/", "/planning/"):
        response = browser.get(page)
        assert response.status_code == 200, page
        links[page] = set(HREF.findall(response.content.decode()))
        assert not {h for h in links[page] if API_OBJECT.match(h)}, f"{page} links into the API"
    assert f"/jobs/{job.pk}/" in links["/jobs/"]
    assert f"/planning/searches/{search.pk}/" in links["/planning/"]
    assert any(re.fullmatch(r"/planning/plans/\d+/", h) for h in links["/planning/"])
    for nav in ("/planning/", "/jobs/", "/api/docs/", "/tokens/"):
        assert nav in links["/"], nav
