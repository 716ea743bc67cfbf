"""Per-rank system figures of a real 2-rank CPU job (torchrun on gloo, through the API and a Celery
worker): rank 0 gathers every rank's memory and CPU use every few steps into its train events."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from tests.integration.test_jobs import job_payload, wait_for_state
from workers.training.system_metrics import RANK_METRICS_EVERY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_train_events_carry_every_ranks_memory_and_cpu(live_stack, make_member):
    from controlplane.live.models import StreamEvent

    client = APIClient()
    client.force_authenticate(make_member("alice", "Team A"))
    steps = 2 * RANK_METRICS_EVERY
    r = client.post("/api/jobs/", job_payload(steps=steps, profile_every=0), format="json")
    assert r.status_code == 201, r.content
    job = wait_for_state(r.json()["id"], {"succeeded", "failed"})
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    deadline = time.monotonic() + 20  # the relay stores the last events a moment after the job ends
    while len(events := list(StreamEvent.objects.filter(stream=job.stream, kind="train"))) < steps:
        assert time.monotonic() < deadline, f"{len(events)} of {steps} train events stored"
        time.sleep(0.3)
    sampled = {e.step: e.values["ranks"] for e in events if "ranks" in e.values}
    assert sorted(sampled) == [RANK_METRICS_EVERY, 2 * RANK_METRICS_EVERY]
    for ranks in sampled.values():
        assert [r["rank"] for r in ranks] == [0, 1]  # both processes, in rank order
        for r in ranks:
            assert 0.05 < r["rss_GiB"] < 64  # a real process with torch loaded
            assert r["mem_peak_GiB"] >= 0.99 * r["rss_GiB"]  # peak RSS on cpu
            assert r["cpu_pct"] is None or 0 < r["cpu_pct"] < 100 * 64
    # the second sample covers steps both ranks spent training: each used CPU
    assert all(r["cpu_pct"] and r["cpu_pct"] > 1 for r in sampled[2 * RANK_METRICS_EVERY])
    # two separate processes: their figures are not one copied twice
    assert sampled[2 * RANK_METRICS_EVERY][0] != sampled[2 * RANK_METRICS_EVERY][1]
