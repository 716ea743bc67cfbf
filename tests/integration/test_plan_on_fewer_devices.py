"""Through the API: a one-rank plan imported for this machine's two-device cpu cluster is stored (201),
costed on the device it takes, and says it uses 1 of the 2 devices; the plan page says so too. A plan
stored without its scaling baseline (the seeded, measured reference runs) says "not computed" for its
scaling efficiency instead of claiming 1.0."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.django_db(transaction=True)]

TRAINING = {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"}


def import_plan(client, strategy: dict, cluster: dict):
    from workers.training.examples import example

    body = {
        "name": "one rank here",
        "model": example("tiny-dense.json"),
        "cluster": cluster,
        "training": TRAINING,
        "strategy": strategy,
    }
    return client.post("/api/plans/", body, format="json")


def test_a_one_rank_plan_on_the_two_device_cluster_is_stored_saying_it_uses_one(alice_api, alice):
    from controlplane.planning.models import StoredPlan
    from controlplane.planning.seed import local_cpu_cluster
    from controlplane.planning.selectors import runs_here
    from workers.training.examples import example

    cpu, _ = local_cpu_cluster()
    r = import_plan(alice_api, example("single.json"), cpu)
    assert r.status_code == 201, r.content
    plan = r.json()
    assert plan["feasible"] is True and plan["device_count"] == 1
    assert plan["cluster"]["devices_per_node"] == 2  # the cluster stays the one given
    p = plan["predicted"]
    assert p["devices_used"] == 1 and p["devices_idle"] == 1
    assert "uses 1 of the cluster's 2 devices" in p["idle_note"] and "stays idle" in p["idle_note"]
    assert runs_here(StoredPlan.objects.get(pk=plan["id"])) == (True, "")
    alice_api.force_login(alice)
    html = alice_api.get(f"/planning/plans/{plan['id']}/").content.decode()
    assert 'id="plan-devices"' in html and "1 of 2 (1 idle)" in html and 'id="plan-idle-note"' in html

    too_many = import_plan(alice_api, {**example("single.json"), "dp": 4, "micro_batch_size": 2}, cpu)
    assert too_many.status_code == 400
    assert "needs 4 devices; the cluster has 2" in too_many.json()["strategy.dp"][0]


def test_seeded_plans_say_their_scaling_efficiency_was_not_computed(alice_api, alice):
    from controlplane.planning.models import StoredPlan
    from controlplane.planning.seed import seed_reference_run
    from workers.planner.examples import reference_runs

    team = alice.teams.get()
    stored = next(run for run in reference_runs() if seed_reference_run(team, run))
    plan = StoredPlan.objects.get(team=team, name=stored["id"])
    assert plan.predicted["scaling_efficiency"] is None
    assert plan.predicted["scaling_efficiency_note"].startswith("not computed")
    alice_api.force_login(alice)
    html = alice_api.get(f"/planning/plans/{plan.pk}/").content.decode()
    scaling = html.split('id="plan-scaling">')[1].split("</dd>")[0]
    assert "not computed" in scaling and "1.000" not in scaling
