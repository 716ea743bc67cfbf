"""The search page's data: the page's HTML carries its header's JSON only (the scenario, the state, the
URLs), and ``GET /api/searches/<id>/page-data/``, which the page fetches once it has painted (issue 35),
answers the same header plus the views' data (one selector builds both), for the search's own team only."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

from workers.planner.examples import contract

pytestmark = [pytest.mark.django_db(transaction=True)]

EMBEDDED = re.compile(r'<script id="viz-data" type="application/json">(.*?)</script>', re.S)


def queued_search(team):
    """A search of GPT-3 on the 384-node A100 cluster (a quarter of a second of planning), queued but not
    sent to any worker: the test runs it with ``run_search`` when it wants it to end."""
    from controlplane.planning.models import StrategySearch

    return StrategySearch.objects.create(
        team=team,
        request={
            "cluster": contract("cluster.json"),
            "model": contract("model.json"),
            "training": contract("training.json"),
            "strategy": {},
            "top_k": 5,
            "allow_fewer_nodes": False,
        },
    )


def run_search(search):
    """Run the search here, in the test process, as the planning worker would (events go to Redis)."""
    from controlplane.planning import services

    assert services.search_run(search_id=search.pk) == "succeeded"
    search.refresh_from_db()
    return search


def embedded_data(client: Client, search_id: int) -> dict:
    r = client.get(f"/planning/searches/{search_id}/")
    assert r.status_code == 200
    (found,) = EMBEDDED.findall(r.content.decode())
    return json.loads(found)


@pytest.fixture
def browser_session(alice):
    """What the page's own scripts use: the session cookie of a logged-in person."""
    c = Client()
    c.force_login(alice)
    return c


@pytest.mark.parametrize("finished", [False, True], ids=["queued", "succeeded"])
def test_page_data_is_the_header_the_search_page_embeds_and_the_views_data(alice, browser_session, finished):
    search = queued_search(alice.teams.first())
    if finished:
        run_search(search)
    embedded = embedded_data(browser_session, search.pk)
    r = browser_session.get(f"/api/searches/{search.pk}/page-data/", HTTP_ACCEPT="application/json")
    assert r.status_code == 200
    data = r.json()
    assert {key: data[key] for key in embedded} == embedded
    assert embedded["search"]["state"] == search.state
    assert embedded["urls"]["page_data"] == f"/api/searches/{search.pk}/page-data/"
    # the HTML carries none of the views' data: the page fetches it from page-data
    assert not {"candidates", "plans", "visuals", "similar_plans"} & set(embedded)
    if finished:  # the whole page: plans, the best plan's visuals, the candidates of the Pareto plot
        assert len(data["plans"]) >= 5 and embedded["best_plan_id"] is not None
        assert data["visuals"]["schedule"]["blocks"] and len(data["candidates"]) > 100
    else:
        assert data["plans"] == [] and data["visuals"] is None and embedded["best_plan_id"] is None


def test_page_data_with_an_api_token(alice, token_for):
    search = queued_search(alice.teams.first())
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {token_for(alice)}")
    r = c.get(f"/api/searches/{search.pk}/page-data/")
    assert r.status_code == 200 and r.json()["search"]["id"] == search.pk


def test_page_data_needs_a_signed_in_user(alice):
    search = queued_search(alice.teams.first())
    r = APIClient().get(f"/api/searches/{search.pk}/page-data/")
    assert r.status_code in (401, 403)
    assert "search" not in r.json()


def test_another_teams_search_is_not_found(alice, make_member):
    search = queued_search(alice.teams.first())
    bob = Client()
    bob.force_login(make_member("bob", "Team B"))
    assert bob.get(f"/api/searches/{search.pk}/page-data/").status_code == 404
    assert bob.get(f"/planning/searches/{search.pk}/").status_code == 404
    assert bob.get("/api/searches/999999/page-data/").status_code == 404
