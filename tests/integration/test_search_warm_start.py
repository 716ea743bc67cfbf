"""A search corrects its plans' predictions by what the team's runs of stored plans measured on the same
device: per layout family (else the device's runs of any layout), beside the model's own figures."""

from __future__ import annotations

import copy

import pytest
from django.test import Client

from workers.planner.examples import contract
from workers.planner.warmstart import layout_family

pytestmark = [pytest.mark.django_db]


def finished_search(team, device_name: str | None = None):
    """GPT-3 on the 384-node A100 cluster (a quarter of a second of planning), run here as the planning
    worker would; ``device_name`` renames the device (another hardware profile, the same figures)."""
    from controlplane.planning import services
    from controlplane.planning.models import StrategySearch

    cluster = copy.deepcopy(contract("cluster.json"))
    if device_name:
        cluster["device"]["name"] = device_name
    search = StrategySearch.objects.create(
        team=team,
        request={
            "cluster": cluster,
            "model": contract("model.json"),
            "training": contract("training.json"),
            "strategy": {},
            "top_k": 5,
            "allow_fewer_nodes": False,
        },
    )
    assert services.search_run(search_id=search.pk) == "succeeded"
    search.refresh_from_db()
    return search


def succeeded_job_of(plan, measured_step_time_s: float, state: str = "succeeded"):
    from controlplane.jobs.models import TrainingJob

    return TrainingJob.objects.create(
        team=plan.team,
        name="measured run",
        config={"steps": 10},
        plan=plan.to_contract(),
        source_plan=plan,
        state=state,
        measured={"step_time_s": measured_step_time_s, "world_size": plan.device_count},
    )


def test_a_measured_run_corrects_the_plans_of_its_family_and_the_rest_by_its_device(alice, make_member):
    team = alice.teams.first()
    first = finished_search(team)
    assert "measured_correction" not in first.stats  # nothing measured yet
    assert all("correction" not in p.predicted for p in first.plans.all())
    ran = first.best_plan
    succeeded_job_of(ran, ran.predicted["step_time_s"] * 1.5)
    succeeded_job_of(ran, ran.predicted["step_time_s"] * 9, state="failed")  # only succeeded runs count
    other_team = make_member("bob", "Team B").teams.first()
    succeeded_job_of(
        finished_search(other_team).best_plan, ran.predicted["step_time_s"] * 7
    )  # another team's run

    second = finished_search(team)
    family = layout_family(ran.strategy)
    plans = list(second.plans.all())
    same = [p for p in plans if layout_family(p.strategy) == family]
    others = [p for p in plans if layout_family(p.strategy) != family]
    assert same and others
    for p in same:
        c = p.predicted["correction"]
        assert c["runs"] == 1 and c["scope"] == "layout family" and c["family"] == family
        assert c["factor"] == pytest.approx(1.5)
        assert c["profile"] == "A100-SXM4-80GB"
        assert c["corrected_step_time_s"] == pytest.approx(p.predicted["step_time_s"] * 1.5)
        assert c["corrected_tokens_per_s"] == pytest.approx(p.predicted["tokens_per_s"] / 1.5)
        assert c["summary"].startswith("measured 1.50x slower in 1 run of this layout family on this device")
    for p in others:  # no run of their family: the device's runs of any layout, said so
        assert p.predicted["correction"]["scope"] == "profile"
    assert second.stats["measured_correction"] == {
        "profile": "A100-SXM4-80GB",
        "runs": 1,
        "plans_corrected": len([p for p in plans if p.rank]),
        "ranked_by": "corrected step time",
    }
    top = sorted((p for p in plans if p.rank), key=lambda p: p.rank)
    corrected = [p.predicted["correction"]["corrected_step_time_s"] for p in top]
    assert corrected == sorted(corrected)

    # the plan page shows it beside the model's own figures
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/planning/plans/{same[0].pk}/").content.decode()
    assert 'id="plan-correction"' in page and "1.50x slower in 1 run of this layout family" in page

    # the same scenario on another device: no factor measured on the A100 applies
    elsewhere = finished_search(team, device_name="A100-like-elsewhere")
    assert "measured_correction" not in elsewhere.stats
    assert all("correction" not in p.predicted for p in elsewhere.plans.all())
