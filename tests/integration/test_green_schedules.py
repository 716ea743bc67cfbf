"""Carbon-aware schedules through the API and the Green page: the stored result is the engine's own answer
on the same series, bad input is a 400 that says what to fix, a team sees only its own schedules, and a
site power cap is shared by the team's stored schedules (a job moves off the power they hold, or is refused
with a 409 naming them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from rest_framework.test import APIClient

from workers.green import providers
from workers.green.history import load_history
from workers.green.schedule import Reservation, schedule

pytestmark = pytest.mark.django_db

URL = "/api/green/schedules/"
NOW = datetime(2020, 6, 1, 18, tzinfo=UTC)  # GB is cleanest the next midday: a real saving
JOB = {"zone": "GB", "now": "2020-06-01T18:00:00Z", "duration_h": 4, "power_kw": 10, "deadline_h": 24}


@pytest.fixture(autouse=True)
def no_live_providers(monkeypatch):
    """The intensity comes from the shipped history here, whatever the developer's environment holds."""
    for key in (
        providers.ENV_ELECTRICITYMAPS_TOKEN,
        providers.ENV_WATTTIME_USERNAME,
        providers.ENV_WATTTIME_PASSWORD,
        providers.ENV_UK_CARBON_INTENSITY,
    ):
        monkeypatch.delenv(key, raising=False)


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def create(user, **changes) -> dict:
    r = api(user).post(URL, {**JOB, **changes}, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def gb_window(now: datetime, deadline: timedelta):
    """The series the API schedules on for GB: ``resolve_series``' history over exactly the window."""
    return providers.resolve_series("GB", now, now + deadline, env={})["series"]


def iso_slots(result) -> list[list[str]]:
    return [[a.isoformat(), b.isoformat()] for a, b in result.slots]


@pytest.mark.parametrize("interruptible", [False, True])
def test_a_schedule_on_gb_history_is_the_engines_answer(alice, interruptible):
    body = create(alice, interruptible=interruptible)
    kwargs = dict(
        now=NOW,
        duration=timedelta(hours=4),
        power_kw=10.0,
        deadline=timedelta(hours=24),
        interruptible=interruptible,
    )
    assert body["result"] == schedule(gb_window(NOW, timedelta(hours=24)), **kwargs).to_dict()
    # the same choice as the engine on the whole shipped 2020 series
    direct = schedule(load_history("GB"), **kwargs)
    assert body["result"]["slots"] == iso_slots(direct)
    assert body["result"]["kgco2e"] == pytest.approx(direct.kgco2e, rel=1e-12)
    assert body["result"]["kgco2e_now"] == pytest.approx(direct.kgco2e_now, rel=1e-12)
    assert body["result"]["saving_pct"] > 0
    # every figure keeps where it came from: measured history, standing in for a forecast
    assert body["result"]["history_used_as_forecast"] is True
    assert body["result"]["intensity"]["provider"] == "history"
    assert "stand-in" in body["result"]["intensity"]["source"]
    assert body["request"]["now_source"] == "given with the request"
    assert body["request"]["source"] == {"kind": "zone", "zone": "GB"}
    assert {s["provider"] for s in body["skipped"]} >= {"electricitymaps", "csv"}
    window = body["intensity_window"]
    assert len(window["times"]) == len(window["values"]) == 48  # 30-min steps over 24 h
    assert window["unit"] == "gCO2e/kWh"
    # the knowledge base lists it, newest first, and gives it back
    listed = api(alice).get(URL).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == body["id"]
    assert "intensity_window" not in listed["results"][0]
    assert api(alice).get(f"{URL}{body['id']}/").json() == body


def test_now_defaults_to_the_current_time_on_history_moved_there_and_labelled(alice):
    before = datetime.now(UTC)
    body = create(alice, now=None, duration_h=2, deadline_h=6)
    assert body["request"]["now_source"] == "the current time"
    now = datetime.fromisoformat(body["result"]["now"])
    assert before <= now <= datetime.now(UTC)
    if now.year == (now + timedelta(hours=6)).year:  # a window across New Year has no 2020 stand-in
        intensity = body["result"]["intensity"]
        assert intensity["kind"] == "history" and "moved to the requested dates" in intensity["source"]
        assert body["result"]["history_used_as_forecast"] is True


def test_an_uploaded_forecast_starts_at_its_first_timestamp_when_it_is_past(alice):
    values = [300.0] * 48
    values[10:12] = [50.0, 60.0]  # the cheapest two hours: 10:00 to 12:00
    csv = "time,gco2_per_kwh\n" + "".join(
        f"2021-03-01T{h:02d}:00:00Z,{v}\n" if h < 24 else f"2021-03-02T{h - 24:02d}:00:00Z,{v}\n"
        for h, v in enumerate(values)
    )
    body = create(alice, now=None, zone="FR", forecast_csv=csv, duration_h=2, deadline_h=24)
    assert body["request"]["now"] == "2021-03-01T00:00:00+00:00"
    assert "first timestamp" in body["request"]["now_source"]
    assert body["result"]["slots"] == [["2021-03-01T10:00:00+00:00", "2021-03-01T12:00:00+00:00"]]
    assert body["result"]["kgco2e"] == pytest.approx(10 * (50 + 60) / 1000)
    source = body["request"]["source"]
    assert source["kind"] == "forecast_csv" and source["rows"] == 48 and len(source["sha256"]) == 64
    # figures that all lie in the past stand in for a forecast, and say so
    assert body["result"]["intensity"]["provider"] == "csv"
    assert body["result"]["history_used_as_forecast"] is True


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"deadline_h": 2}, "deadline_h", "at least its duration_h"),
        ({"power_kw": -5}, "power_kw", "more than 0"),
        ({"duration_h": 1000}, "duration_h", "at most 168 h"),
        ({"pue": 0.5}, "pue", "at least 1"),
        ({"zone": "XX"}, "zone", "no carbon-intensity series for zone XX"),
        ({"zone": "G B!"}, "zone", "a grid zone is a code"),
        (
            {"forecast_csv": "time,gco2_per_kwh\n2020-06-01T00:00,100\n2020-06-01T00:30,lots\n"},
            "forecast_csv",
            "line 3",
        ),
        ({"forecast_csv": ""}, "forecast_csv", "empty"),
        ({"objective": "cost"}, "price_per_kwh", "needs an electricity price"),
        ({"site_cap_kw": 5}, "site_cap_kw", "more than the site cap"),
        ({"now": "1900-01-01T00:00:00Z"}, "now", "between the years 2000 and 2100"),
        ({"stpes": 3}, "stpes", "is not a field of this request"),
        # the engine's own check, as a 400: the forecast does not reach the deadline
        (
            {"forecast_csv": "time,gco2_per_kwh\n2020-06-01T00:00,100\n2020-06-01T01:00,90\n"},
            "non_field_errors",
            "supply a longer forecast",
        ),
    ],
)
def test_bad_input_is_a_400_that_says_what_to_fix(alice, changes, field, words):
    r = api(alice).post(URL, {**JOB, **changes}, format="json")
    assert r.status_code == 400, r.content
    assert words in " ".join(r.json()[field]), r.json()


def test_another_teams_schedule_is_a_404_like_no_schedule(alice, bob):
    mine = create(alice)
    theirs, missing = api(bob).get(f"{URL}{mine['id']}/"), api(bob).get(f"{URL}987654321/")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json() == missing.json()
    assert api(bob).delete(f"{URL}{mine['id']}/").status_code == 404
    assert api(bob).get(URL).json()["count"] == 0
    assert api(alice).delete(f"{URL}{mine['id']}/").status_code == 204
    assert api(alice).get(f"{URL}{mine['id']}/").status_code == 404
    for call in (APIClient().get(URL), APIClient().post(URL, JOB, format="json")):
        assert call.status_code in (401, 403)


def test_a_site_cap_moves_a_job_off_the_window_a_stored_schedule_holds(alice, bob):
    free = schedule(
        gb_window(NOW, timedelta(hours=24)),
        now=NOW,
        duration=timedelta(hours=4),
        power_kw=10.0,
        deadline=timedelta(hours=24),
    )
    best_start, best_end = free.slots[0]
    # another job already holds 10 kW over the best window (a deadline equal to its duration pins it there)
    held = create(alice, name="pinned", now=best_start.isoformat(), deadline_h=4)
    assert held["result"]["slots"] == iso_slots(free)
    # bob's schedules are another team's: they hold none of alice's site's power
    create(bob, name="bob's", now=best_start.isoformat(), deadline_h=4)

    body = create(alice, site_cap_kw=15)
    assert body["reservations"] == [
        {
            "schedule": held["id"],
            "name": "pinned",
            "start": best_start.isoformat(),
            "end": best_end.isoformat(),
            "kw": 10.0,
        }
    ]
    expected = schedule(
        gb_window(NOW, timedelta(hours=24)),
        now=NOW,
        duration=timedelta(hours=4),
        power_kw=10.0,
        deadline=timedelta(hours=24),
        power_cap_kw=15.0,
        reservations=[Reservation(best_start, best_end, 10.0)],
    )
    assert body["result"] == expected.to_dict()
    start, end = (datetime.fromisoformat(t) for t in body["result"]["slots"][0])
    assert end <= best_start or start >= best_end  # moved off the held window
    assert body["result"]["kgco2e"] > free.kgco2e
    # a cap with room for both leaves the job where it was best
    assert create(alice, site_cap_kw=20)["result"]["slots"] == iso_slots(free)


def test_a_site_cap_without_room_is_a_409_naming_what_holds_the_power(alice):
    held = create(alice, name="pinned", deadline_h=4)  # 10 kW from now for 4 h
    r = api(alice).post(URL, {**JOB, "deadline_h": 4, "site_cap_kw": 15}, format="json")
    assert r.status_code == 409, r.content
    detail = r.json()["detail"]
    assert "leaves no room" in detail and f"#{held['id']} 'pinned'" in detail
    assert api(alice).get(URL).json()["count"] == 1  # nothing stored
    # in another zone the stored GB schedule holds no power (another site)
    assert create(alice, zone="DE", deadline_h=4, site_cap_kw=15)["reservations"] == []


def test_the_green_page_shows_the_knowledge_base_to_members_only(alice, bob):
    create(alice, name="alice's night run")
    anonymous = Client().get("/green/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    browser = Client()
    browser.force_login(alice)
    page = browser.get("/green/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "alice&#x27;s night run" in html or "alice's night run" in html
    assert "history used as a forecast" in html
    assert 'id="certificate-list"' in html and 'id="schedule-form"' in html
    assert "/static/plotly/plotly.min." in html  # plotly.min.<hash>.js once the static files are built
    browser.force_login(bob)
    assert "night run" not in browser.get("/green/").content.decode()
