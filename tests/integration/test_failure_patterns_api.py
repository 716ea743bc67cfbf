"""The failure-pattern knowledge base through the API and its pages: the published kinds with their sources,
one pattern by key (or kind as written), a clear 404, an incident list imported (as JSON text or an
uploaded file) extends the counts and adds the kinds the taxonomy lacks, a bad list is a 400 naming the line
and stores nothing, and another team sees none of it."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils.html import escape
from rest_framework.test import APIClient

from workers.reliability.risk.simulator import KINDS, LLAMA3_TABLE5_SOURCE

pytestmark = pytest.mark.django_db

INCIDENTS = """# node,time,kind from the ticket system
node,time,kind,ticket
gpu-node-01,2026-01-01T00:28:00Z,gpu_hbm3,T-1
gpu-node-02,2026-01-02T10:00:00+08:00,GPU HBM3 Memory,T-2
gpu-node-02,1767400000,Kernel panic,T-3
"""


@pytest.fixture
def bob(make_member):
    client = APIClient()
    client.force_authenticate(make_member("bob", "Team B"))
    return client


def patterns(client) -> dict[str, dict]:
    r = client.get("/api/failure-patterns/")
    assert r.status_code == 200, r.content
    return {p["key"]: p for p in r.json()["results"]}


def test_the_published_kinds_are_listed_with_their_sources(alice_api):
    listed = patterns(alice_api)
    assert list(listed) == list(KINDS)
    hbm = listed["gpu_hbm3"]
    assert hbm["published"]["count"] == 72 and hbm["published"]["source"] == LLAMA3_TABLE5_SOURCE
    assert hbm["precursor"]["assumed"] is True and hbm["precursor"]["signals"][0]["key"] == "sbe"
    assert hbm["prevention"]["action"] == "snapshot-then-drain" and hbm["observed"] is None


def test_one_pattern_by_its_key_or_its_kind_as_written(alice_api):
    r = alice_api.get("/api/failure-patterns/gpu_thermal/")
    assert r.status_code == 200 and r.json()["component"] == "GPU Thermal Interface + Sensor"
    r = alice_api.get("/api/failure-patterns/GPU HBM3 Memory/")
    assert r.status_code == 200 and r.json()["key"] == "gpu_hbm3"


def test_an_unknown_pattern_is_a_404_that_says_so(alice_api):
    r = alice_api.get("/api/failure-patterns/flux_capacitor/")
    assert r.status_code == 404
    assert "No failure pattern 'flux_capacitor'" in r.json()["detail"]


def test_an_imported_incident_list_extends_the_counts_and_adds_new_kinds(alice_api):
    r = alice_api.post(
        "/api/failure-patterns/incidents/", {"csv": INCIDENTS, "source_name": "tickets.csv"}, format="json"
    )
    assert r.status_code == 201, r.content
    assert r.json() == {
        "team": "team-a",
        "source": "tickets.csv",
        "rows": 3,
        "imported": 3,
        "duplicates": 0,
        "patterns": {"gpu_hbm3": 2, "kernel_panic": 1},
    }
    listed = patterns(alice_api)
    hbm = listed["gpu_hbm3"]["observed"]
    assert (hbm["count"], hbm["node_count"], hbm["nodes"]) == (2, 2, ["gpu-node-01", "gpu-node-02"])
    assert hbm["share"] == pytest.approx(2 / 3) and hbm["sources"] == [{"name": "tickets.csv", "count": 2}]
    assert (hbm["first_seen"], hbm["last_seen"]) == ("2026-01-01T00:28:00Z", "2026-01-02T02:00:00Z")
    panic = listed["kernel_panic"]
    assert list(listed)[-1] == "kernel_panic"
    assert (panic["origin"], panic["published"], panic["note"]) == (
        "imported",
        None,
        "imported, no published rate",
    )
    assert alice_api.get("/api/failure-patterns/kernel_panic/").json()["observed"]["count"] == 1

    # the same list again (uploaded as a file this time) adds nothing: each incident is counted once
    upload = SimpleUploadedFile("tickets-again.csv", INCIDENTS.encode(), content_type="text/csv")
    r = alice_api.post("/api/failure-patterns/incidents/", {"file": upload}, format="multipart")
    assert r.status_code == 201, r.content
    assert (r.json()["source"], r.json()["imported"], r.json()["duplicates"]) == ("tickets-again.csv", 0, 3)
    assert patterns(alice_api)["gpu_hbm3"]["observed"]["count"] == 2
    r = alice_api.get("/api/failure-patterns/incidents/")
    assert r.json()["count"] == 3
    assert {i["pattern"] for i in r.json()["results"]} == {"gpu_hbm3", "kernel_panic"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("node,when\nx,2026-01-01T00:00:00Z\n", "line 1: the header must name node, time, kind"),
        (
            "node,time,kind\nn1,2026-01-01T00:00:00Z,nic\nn2,yesterday,nic\n",
            "line 3: time 'yesterday' is neither",
        ),
        (
            "node,time,kind\nn1,2026-01-01T00:00:00,nic\n",
            "line 2: time '2026-01-01T00:00:00' has no time zone",
        ),
        ("node,time,kind\nn1,1767225600\n", "line 2: 2 fields, the header has 3"),
        ("node,time,kind\n\nn1,1767225600,\n", "line 3: node and kind must not be empty"),
        ("node,time,kind\nn1,1e12,nic\n", "line 2: time 1e+12 (Unix seconds) is not between 1970 and 2100"),
        ("node,time,kind\nn1,1767225600,---\n", "line 2: kind '---' has no letter or digit"),
        ("node,time,kind\nn\x01,1767225600,nic\n", "line 2: node must not contain control"),
        ("node,time,kind\n", "a header but no incident"),
    ],
)
def test_a_bad_incident_list_is_a_400_naming_the_line_and_stores_nothing(alice_api, text, problem):
    from controlplane.failures.models import FailureIncident

    r = alice_api.post("/api/failure-patterns/incidents/", {"csv": text}, format="json")
    assert r.status_code == 400, r.content
    assert any(problem in line for line in r.json()["csv"]), r.json()
    assert not FailureIncident.objects.exists()


def test_an_upload_that_is_not_utf8_text_is_a_400(alice_api):
    upload = SimpleUploadedFile(
        "tickets.csv", b"node,time,kind\n\xff\xfe,1767225600,nic\n", content_type="text/csv"
    )
    r = alice_api.post("/api/failure-patterns/incidents/", {"file": upload}, format="multipart")
    assert r.status_code == 400 and "not UTF-8 text" in r.json()["file"][0], r.content


def test_another_team_sees_none_of_the_incidents(alice_api, bob):
    r = alice_api.post("/api/failure-patterns/incidents/", {"csv": INCIDENTS}, format="json")
    assert r.status_code == 201, r.content

    theirs = patterns(bob)
    assert list(theirs) == list(KINDS) and theirs["gpu_hbm3"]["observed"] is None
    r = bob.get("/api/failure-patterns/kernel_panic/")
    assert r.status_code == 404 and "kernel_panic" in r.json()["detail"]
    assert bob.get("/api/failure-patterns/incidents/").json()["count"] == 0
    # nor can it import into alice_api's team
    r = bob.post("/api/failure-patterns/incidents/", {"csv": INCIDENTS, "team": "team-a"}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["team"]


def test_the_pages_list_every_pattern_and_cite_their_sources(alice_api):
    r = alice_api.post(
        "/api/failure-patterns/incidents/", {"csv": INCIDENTS, "source_name": "tickets.csv"}, format="json"
    )
    assert r.status_code == 201
    browser = Client()
    browser.force_login(alice_api.user)
    html = browser.get("/failure-patterns/").content.decode()
    for key in (*KINDS, "kernel_panic"):
        assert f'href="/failure-patterns/{key}/"' in html, key
    assert escape(LLAMA3_TABLE5_SOURCE) in html and "tickets.csv: 3 of Team A" in html
    assert 'href="/api/failure-patterns' not in html  # no link into the raw API
    page = browser.get("/failure-patterns/gpu_hbm3/")
    assert page.status_code == 200 and "tickets.csv (2)" in page.content.decode()
    # a kind as written goes to its pattern's own page; an unknown one is the app's 404 page
    assert browser.get("/failure-patterns/GPU HBM3 Memory/")["Location"] == "/failure-patterns/gpu_hbm3/"
    missing = browser.get("/failure-patterns/flux_capacitor/")
    assert missing.status_code == 404 and "Back to the failure patterns" in missing.content.decode()
