"""`make run`'s demo setup (``manage.py demo_setup``) loads the example that runs here into the demo team
— the this-machine-cpu cluster and the tiny-gpt model — also into a demo team seeded before it shipped,
and tells the new user the way from a search to a job."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.django_db]


def test_demo_setup_loads_the_small_example_into_the_demo_team(settings, tmp_path, monkeypatch):
    from controlplane.accounts.models import Team
    from controlplane.clusters.models import Cluster
    from controlplane.planning.models import StoredModelSpec

    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("CANN_TRAIN_VAR", str(tmp_path))  # this machine uncalibrated, none requested yet
    out = io.StringIO()
    call_command("demo_setup", stdout=out)
    team = Team.objects.get(name="Demo team")
    cluster = Cluster.objects.get(team=team, name="this-machine-cpu")
    assert cluster.spec["num_nodes"] == 1 and cluster.spec["device"]["name"] == "cpu"
    assert StoredModelSpec.objects.filter(team=team, name="tiny-gpt").exists()
    assert "Use the example that runs here" in out.getvalue()
    # the first start queues this machine's calibration (with the demo job: it waits for it), once
    from controlplane.clusters.calibration import calibration_status
    from controlplane.live.models import PendingTask

    assert "calibrating this machine" in out.getvalue()
    assert calibration_status()["state"] == "queued" and calibration_status()["running"]
    assert PendingTask.objects.filter(task="controlplane.clusters.tasks.calibrate_machine").count() == 1
    # the demo job is metered in the deployment's grid zone, as any launched job is
    from controlplane.jobs.models import TrainingJob

    [job] = TrainingJob.objects.filter(team=team)
    assert job.config["energy"]["zone"] == settings.GREEN_DEFAULT_ZONE

    # a demo team seeded before the small example shipped gets it on the next `make run`
    StoredModelSpec.objects.filter(team=team, name="tiny-gpt").delete()
    Cluster.objects.filter(team=team, name="this-machine-cpu").delete()
    again = io.StringIO()
    call_command("demo_setup", stdout=again)
    assert "calibrating this machine" not in again.getvalue()
    assert PendingTask.objects.filter(task="controlplane.clusters.tasks.calibrate_machine").count() == 1
    assert StoredModelSpec.objects.filter(team=team, name="tiny-gpt").count() == 1
    assert Cluster.objects.filter(team=team, name="this-machine-cpu").count() == 1
