"""The job's Elastic Training Index and maturity level, from what the job stored (API and page).

No worker runs: the jobs' measured figures and goodput are written as a finished run leaves them."""

from __future__ import annotations

import pytest

from workers.training.examples import example

pytestmark = pytest.mark.django_db


def _job(team, *, world: int, tokens_per_s: float, tflops: float = 0.002, **config_extra):
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.services import job_config_of, validated_config

    config = validated_config(
        {
            **job_config_of(
                model=example("tiny-dense.json"),
                strategy={"dp": world},
                training={"global_batch_size": 8},
                steps=10,
                device="cpu",
            ),  # fmt: skip
            **config_extra,
        }
    )
    return TrainingJob.objects.create(
        team=team, name=f"{world}-rank", config=config, nproc_per_node=world, attempts=1, state="succeeded",
        measured={"tokens_per_s": tokens_per_s, "tflops_per_device": tflops},
        goodput={"goodput": 0.8, "wall_s": 10.0, "productive_s": 8.0, "badput": {"startup_s": 2.0}},
    )  # fmt: skip


def test_eti_uses_the_teams_one_device_run_as_the_baseline_and_names_what_is_missing(alice_api, make_member):
    two = _job(alice_api.team, world=2, tokens_per_s=1500.0, peak_tflops=0.01, snapshot_every=5,
               snapshot_dir="/tmp/x")  # fmt: skip
    r = alice_api.get(f"/api/jobs/{two.pk}/")
    idx = r.json()["elastic_index"]
    scaling = idx["eti"]["factors"][0]
    assert scaling["value"] is None and "no one-device run of tiny-dense" in scaling["source"]
    assert idx["eti"]["eti"] is None
    one = _job(alice_api.team, world=1, tokens_per_s=1000.0)
    other_team = make_member("bob", "Team B").teams.first()
    _job(other_team, world=1, tokens_per_s=10.0)  # another team's run is never a baseline
    idx = alice_api.get(f"/api/jobs/{two.pk}/").json()["elastic_index"]
    factors = {f["name"]: f for f in idx["eti"]["factors"]}
    assert (
        factors["scaling_efficiency"]["value"] == 0.75
        and f"job {one.pk}" in factors["scaling_efficiency"]["source"]
    )
    assert factors["device_utilisation"]["value"] == 0.2 and factors["goodput"]["value"] == 0.8
    assert idx["eti"]["eti"] == round(0.75 * 0.8 * 0.2, 5)
    # not launched from a plan: L1, and the first unmet criterion says how to get further
    assert idx["maturity"]["level"] == 1
    assert not next(c for c in idx["maturity"]["criteria"] if c["level"] == 2)["met"]


def test_the_job_page_shows_the_index_and_the_level(alice_api, client, make_member):
    job = _job(
        alice_api.team,
        world=2,
        tokens_per_s=1500.0,
        comm_hook="fp16",
        snapshot_every=5,
        snapshot_dir="/tmp/x",
    )
    client.force_login(alice_api.handler._force_user)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="eti-panel"' in html and 'id="maturity-level">L1<' in html
    assert "run it on 1 rank to measure the baseline" in html


def test_a_job_that_ran_and_failed_or_was_restored_is_l1_and_l5_is_available(alice_api):
    """Issue 35: a dp2 job with snapshots and automatic recovery showed "L0 … L1 ✗ trains data-parallel" (its
    measured run is stored only when an attempt ends well), and L5 said green scheduling and risk prevention
    were "not available in this version" although both exist."""
    from django.utils import timezone

    from controlplane.jobs.models import TrainingJob

    job = _job(alice_api.team, world=2, tokens_per_s=1500.0, snapshot_every=5, snapshot_dir="/tmp/x")
    TrainingJob.objects.filter(pk=job.pk).update(
        state="failed", measured=None, goodput=None, started_at=timezone.now(), attempts=2
    )
    level = alice_api.get(f"/api/jobs/{job.pk}/").json()["elastic_index"]["maturity"]
    criteria = {c["name"]: c for c in level["criteria"]}
    assert criteria["trains data-parallel on the cluster"]["met"] and level["level"] == 1
    assert criteria["fault-risk prediction and prevention"]["met"]  # risk_policy act (default), snapshots on
    green = criteria["carbon-aware (green) scheduling"]
    assert not green["met"] and green["available"] and "carbon_aware" in green["how"]
    assert all(c["available"] for c in level["criteria"])
    TrainingJob.objects.filter(pk=job.pk).update(state="queued", started_at=None, attempts=1)  # never started
    assert alice_api.get(f"/api/jobs/{job.pk}/").json()["elastic_index"]["maturity"]["level"] == 0
