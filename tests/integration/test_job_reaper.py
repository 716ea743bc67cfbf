"""Jobs whose supervisor is gone are failed (relaunchable), and `make run` settles its own at once.

The session's live stack may be up, and its relay reaps jobs silent for ``HEARTBEAT_TIMEOUT`` (20 s) in this
same database: every heartbeat here is younger than that, so only the reaping under test can touch them."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)


def running_job(team, node: str, heartbeat_age_s: float):
    from controlplane.common.models import JobState
    from controlplane.jobs.models import JobNode, TrainingJob

    beat = timezone.now() - timedelta(seconds=heartbeat_age_s)
    job = TrainingJob.objects.create(
        team=team, name=f"on {node}", state=JobState.RUNNING, attempts=2, heartbeat_at=beat, started_at=beat
    )
    JobNode.objects.create(job=job, attempt=1, node_rank=0, node_name="old-host", state=JobState.FAILED)
    JobNode.objects.create(
        job=job, attempt=2, node_rank=0, node_name=node, state=JobState.RUNNING, heartbeat_at=beat
    )
    return job


def test_a_job_waiting_for_a_worker_slot_is_queued_not_dead(make_member):
    """Fan-out happened long ago, but no supervisor has picked the node task up yet (every worker slot is
    busy): no heartbeat is expected, and the job must not be failed as dead."""
    from controlplane.common.models import JobState
    from controlplane.jobs.models import JobNode, TrainingJob
    from controlplane.jobs.services import reap_orphans

    team = make_member("carol", "Team C").teams.first()
    long_ago = timezone.now() - timedelta(minutes=5)
    waiting = TrainingJob.objects.create(
        team=team, name="waits", state=JobState.LAUNCHING, attempts=1, heartbeat_at=long_ago
    )
    JobNode.objects.create(job=waiting, attempt=1, node_rank=0, state=JobState.QUEUED)
    assert reap_orphans(stale_after=timedelta(seconds=4)) == []
    waiting.refresh_from_db()
    assert waiting.state == JobState.LAUNCHING


def test_stopping_a_node_fails_only_the_jobs_it_supervised(make_member):
    from controlplane.jobs.models import TrainingJob

    team = make_member("alice", "Team A").teams.first()
    gone = running_job(team, "here", heartbeat_age_s=6)
    last_beat_just_now = running_job(team, "here", heartbeat_age_s=1)
    elsewhere = running_job(team, "elsewhere", heartbeat_age_s=6)

    t0 = time.monotonic()
    call_command("reap_orphans", node="here", stale_after=2.0, reason="make run was stopped; relaunch it.")
    waited = time.monotonic() - t0

    states = {j.pk: (j.state, j.human_readable_error) for j in TrainingJob.objects.all()}
    assert states[gone.pk] == ("failed", "make run was stopped; relaunch it.")
    # its supervisor had beaten 1 s before: the command waited for that beat to age, then failed it too
    assert states[last_beat_just_now.pk][0] == "failed" and 0.5 < waited < 10
    # a job supervised on another node is not this node's to settle
    assert states[elsewhere.pk] == ("running", "")
    assert gone.nodes.get(attempt=2).state == "failed" and gone.nodes.get(attempt=1).state == "failed"


def test_the_reaper_fails_any_silent_job_whatever_its_node(make_member):
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.services import reap_orphans

    team = make_member("bob", "Team B").teams.first()
    silent = running_job(team, "anywhere", heartbeat_age_s=6)
    alive = running_job(team, "anywhere", heartbeat_age_s=1)
    assert reap_orphans(stale_after=timedelta(seconds=4)) == [silent.pk]
    silent = TrainingJob.objects.get(pk=silent.pk)
    assert silent.state == "failed" and "stopped answering" in silent.human_readable_error
    assert TrainingJob.objects.get(pk=alive.pk).state == "running"


def test_a_comparison_whose_worker_died_is_failed_with_its_rows_kept(make_member):
    from controlplane.common.models import JobState
    from controlplane.jobs.comparisons import reap_stalled_comparisons
    from controlplane.jobs.models import CommComparison, TrainingJob

    team = make_member("dave", "Team D").teams.first()
    job = TrainingJob.objects.create(team=team, name="j", config={})
    rows = {"methods": {"dense": {"step_s": 1.0}}, "partial": True}
    stalled = CommComparison.objects.create(
        team=team, job=job, request={}, state=JobState.RUNNING, result=rows
    )
    alive = CommComparison.objects.create(team=team, job=job, request={}, state=JobState.RUNNING)
    CommComparison.objects.filter(pk=stalled.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    assert reap_stalled_comparisons() == [stalled.pk]
    stalled.refresh_from_db()
    alive.refresh_from_db()
    assert stalled.state == JobState.FAILED and "Start the comparison again" in stalled.human_readable_error
    assert stalled.result == rows and alive.state == JobState.RUNNING
