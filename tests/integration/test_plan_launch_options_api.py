"""The plan page's launch options (``controlplane.jobs.plan_launch``): the form offers every option of a job
request but those the plan fixes, with the server's choices (node counts, hooks, zones, the team's usable
green schedules); the scaled-down launch (``POST /api/plans/<id>/scale-down/``) takes the same options, checked
as ``POST /api/jobs/`` checks them. The browser side is tests/browser/test_plan_launch_options.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import import_tiny_cpu_plan
from tests.integration.test_job_schedules import stored_schedule
from tests.integration.test_jobs import job_payload


def offered(form: dict) -> dict[str, dict]:
    fields = {}
    for section in form["sections"]:
        for f in section["fields"]:
            fields[f["name"]] = f
            fields.update({g["name"]: g for g in f.get("fields", [])})
    return fields


@pytest.mark.django_db
def test_the_launch_form_offers_every_option_of_a_job_request_but_those_the_plan_fixes():
    from controlplane.jobs.apis import CarbonAwareSerializer, JobCreateSerializer
    from controlplane.jobs.plan_launch import NOT_OFFERED, launch_form
    from workers.green.job import SETTINGS

    plan = SimpleNamespace(strategy={"tp": 2, "pp": 2, "dp": 3, "cp": 1, "zero_stage": 1}, team=None)
    fields = offered(launch_form(user=None, plan=plan))
    top = {name.split(".")[0] for name in fields if "-" not in name}
    assert top | set(NOT_OFFERED) == set(JobCreateSerializer().fields) and not top & set(NOT_OFFERED)
    assert {n for n in fields if n.startswith("energy.")} == {f"energy.{k}" for k in SETTINGS}
    assert {n for n in fields if n.startswith("carbon_aware.")} == {
        f"carbon_aware.{k}" for k in CarbonAwareSerializer().fields
    }
    # the server's choices: node counts dividing the 12 ranks, the hooks (those FSDP cannot run disabled
    # under ZeRO), the API's own choice lists, each select's first option the default it says
    nodes = fields["nnodes"]["choices"]
    assert [c["value"] for c in nodes] == ["", "2", "3", "4", "6", "12"] and "1 node × 12 ranks" in nodes[0][
        "label"
    ]
    hooks = {c["value"]: c for c in fields["comm_hook"]["choices"]}
    assert hooks["powerSGD"].get("disabled") and not hooks["topk_ef"].get("disabled")
    assert [c["value"] for c in fields["risk_policy"]["choices"]] == ["", "act", "observe"]
    assert fields["risk_policy"]["choices"][0]["label"] == "default (act)"
    assert {"min": 5.0, "max": 3600.0, "default": "60", "kind": "float"}.items() <= fields[
        "hang_timeout_s"
    ].items()
    assert fields["energy.zone"]["choices"][0]["label"].startswith("default (GB")
    assert fields["energy.pue"]["min"] == 1 and fields["energy.enabled"]["checked"] is True
    assert fields["carbon_aware.deadline_h"]["required"] and fields["carbon_aware"]["widget"] == "group"


@pytest.mark.django_db(transaction=True)
def test_the_plan_page_lists_the_teams_schedules_a_job_may_still_take(live_stack, make_member):
    alice, bob = make_member("alice", "Team A"), make_member("bob", "Team B")
    api, bob_api = APIClient(), APIClient()
    api.force_authenticate(alice)
    bob_api.force_authenticate(bob)
    plan_id = import_tiny_cpu_plan(api)["id"]
    free = stored_schedule(api, values=[400, 100, 100, 400], duration_h=1, deadline_h=2, interruptible=False)
    taken = stored_schedule(api, values=[400, 100, 100, 400], duration_h=1, deadline_h=2, interruptible=False)
    assert api.post("/api/jobs/", job_payload(green_schedule=taken["id"]), format="json").status_code == 201
    others = stored_schedule(
        bob_api, values=[400, 100, 100, 400], duration_h=1, deadline_h=2, interruptible=False
    )

    page = Client()
    page.force_login(alice)
    html = page.get(f"/planning/plans/{plan_id}/").content.decode()
    assert 'id="launch-options"' in html and 'name="hang_timeout_s"' in html
    assert f'<option value="{free["id"]}">#{free["id"]} ' in html
    for hidden in (taken, others):  # a job holds it; another team's
        assert f'<option value="{hidden["id"]}">#{hidden["id"]} ' not in html


@pytest.mark.django_db(transaction=True)
def test_a_scaled_down_launch_takes_the_run_options_as_the_job_api_checks_them(live_stack, make_member):
    from controlplane.jobs.models import TrainingJob
    from controlplane.planning.models import StoredPlan

    api = APIClient()
    api.force_authenticate(make_member("alice", "Team A"))
    plan_id = import_tiny_cpu_plan(api)["id"]
    url = f"/api/plans/{plan_id}/scale-down/"
    plans = StoredPlan.objects.count()

    refused = [
        ({"nnodes": 2}, "nnodes", "not an option of a scaled-down launch"),
        ({"device": "cuda"}, "device", "not an option of a scaled-down launch"),
        ({"hang_timeout_s": 0}, "hang_timeout_s", "greater than or equal to 5"),
        ({"energy": {"pue": 0.5, "pue_source": "a guess"}}, "energy", "energy.pue must be a number >= 1"),
        ({"risk_policy": "panic"}, "risk_policy", "not a valid choice"),
        ({"colour": "green"}, "colour", "is not a field of this request"),
    ]
    for extra, field, text in refused:
        r = api.post(url, {"steps": 4, **extra}, format="json")
        assert r.status_code == 400, (extra, r.content)
        assert text in str(r.json().get(field)), (extra, r.json())
    assert StoredPlan.objects.count() == plans and not TrainingJob.objects.exists()  # nothing stored

    r = api.post(
        url,
        {
            "steps": 4,
            "risk_policy": "observe",
            "hang_timeout_s": 30,
            "comm_hook": "fp16",
            "energy": {"zone": "DE", "price_per_kwh": 0.3, "currency": "EUR"},
            "carbon_aware": {"deadline_h": 24, "duration_h": 0.5, "power_kw": 0.2},
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    job = TrainingJob.objects.get(pk=r.json()["job"]["id"])
    assert (
        job.hang_timeout_s == 30
        and job.config["risk_policy"] == "observe"
        and job.config["comm_hook"] == "fp16"
    )
    assert job.config["energy"]["zone"] == "DE" and job.config["energy"]["currency"] == "EUR"
    assert (
        job.config["device"] == "cpu" and job.config["profile_every"] == 5 and job.green_schedule is not None
    )
