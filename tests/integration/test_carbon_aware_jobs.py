"""A carbon-aware job request (``carbon_aware``) is checked by the runtime before it is scheduled, before the job
(and the snapshot directory the control plane gives it) exists: a job that snapshots is checked with the
stand-in directory a launched job is checked with, not refused for naming none."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.integration.test_jobs import job_payload


@pytest.mark.django_db(transaction=True)
def test_a_carbon_aware_job_that_snapshots_is_scheduled(live_stack, make_member):
    """The runtime requires a snapshot directory with snapshot_every; a carbon-aware request is checked before
    the job (and its directory) exists, so it is checked with the stand-in a launched job gets."""
    api = APIClient()
    api.force_authenticate(make_member("alice", "Team A"))
    r = api.post(
        "/api/jobs/",
        job_payload(
            snapshot_every=2,
            carbon_aware={"deadline_h": 24, "duration_h": 0.5, "power_kw": 0.2, "interruptible": True},
        ),
        format="json",
    )
    assert r.status_code == 201, r.content
    job = r.json()
    assert job["schedule"] is not None and f"/jobs/{job['id']}/snapshots-" in job["config"]["snapshot_dir"]
