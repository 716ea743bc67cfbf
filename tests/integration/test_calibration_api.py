"""Calibrating this machine from the app (``/api/calibration/``): a request queues the measuring on the
stack's real Celery worker, which reports its progress stage by stage, writes the cpu profile the planner
reads and gives every team's ``this-machine-cpu`` cluster the measured figures; a second request while it
runs is a 409; a bad body a 400 naming the field. The calibration files are removed afterwards: the stack's
later searches keep the shipped (uncalibrated) profile other tests expect."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import http

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_calibration_runs_on_the_worker_with_its_progress_and_updates_this_machines_clusters(
    live_stack, alice, token_for
):
    from controlplane.clusters.models import Cluster
    from workers.planner.examples import this_machine_cluster

    token = token_for(alice)
    url = f"{live_stack.base_url}/api/calibration/"
    directory = Path(live_stack.env["CANN_TRAIN_VAR_DIR"]) / "calibration"
    shutil.rmtree(directory, ignore_errors=True)
    default, _ = this_machine_cluster()  # this process reads no calibration: the shipped figures
    cluster = Cluster.objects.create(team=alice.teams.first(), name=default["name"], spec=default)
    try:
        status, before = http("GET", url, token)
        assert status == 200 and before["calibrated"] is False and before["state"] is None, before
        assert http("POST", url, token, {"quick": "sideways"})[0] == 400
        status, answer = http("POST", url, None, {"quick": True})
        assert status in (401, 403)
        status, queued = http("POST", url, token, {"quick": True, "allreduce": False})
        assert status == 202 and queued["state"] == "queued" and queued["running"], queued
        status, again = http("POST", url, token, {"quick": True, "allreduce": False})
        assert status == 409 and "calibrated already" in json.dumps(again), again
        seen, deadline = [], time.monotonic() + 180
        while time.monotonic() < deadline:
            status, now = http("GET", url, token)
            if not seen or (now["stage"], now["state"]) != (seen[-1]["stage"], seen[-1]["state"]):
                seen.append(now)
            if now["state"] in ("done", "failed"):
                break
            time.sleep(0.1)
        done = seen[-1]
        assert done["state"] == "done" and done["calibrated"] and done["fraction"] == 1.0, seen
        assert done["measured_at"] and str(directory) in done["origin"], done
        stages = [s["stage"] for s in seen if s["state"] == "running"]
        assert "gemm" in stages and "memory" in stages, stages  # its progress, stage by stage
        fractions = [s["fraction"] for s in seen if s["fraction"] is not None]
        assert fractions == sorted(fractions), fractions
        profile = json.loads((directory / "cpu.json").read_text())
        cluster.refresh_from_db()
        assert cluster.spec["device"]["peak_tflops"] == profile["peak_tflops"], cluster.spec["device"]
        assert cluster.spec["device"] != default["device"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
