"""A killed torchrun agent is one fault: the rank faults its watch saw in the moments the agent was dying (its
ranks die with it: the rendezvous store it held is gone) are its consequence, dropped before the job resumes
(``controlplane.jobs.services.node_run.drop_faults_of_the_lost_agent``); older or recovered ones stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db


def test_only_the_rank_faults_seen_as_the_agent_died_are_dropped(alice):
    from controlplane.jobs.models import JobFault, TrainingJob
    from controlplane.jobs.services.node_run import AGENT_LOSS_WINDOW_S, drop_faults_of_the_lost_agent

    job = TrainingJob.objects.create(
        team=alice.teams.first(), name="j", config={}, attempts=2, state="running"
    )
    now = timezone.now()

    def fault(kind, *, ago_s, attempt=2, recovered=False):
        return JobFault.objects.create(
            job=job, attempt=attempt, kind=kind, detected_at=now - timedelta(seconds=ago_s),
            recovered_at=now if recovered else None,
        )  # fmt: skip

    dying = fault("rank-failed", ago_s=1)
    killed = fault("rank-killed", ago_s=2)
    kept = [
        fault("rank-failed", ago_s=AGENT_LOSS_WINDOW_S + 30),  # long before: a fault of its own
        fault("rank-failed", ago_s=1, recovered=True),  # recovered: training went on after it
        fault("rank-failed", ago_s=1, attempt=1),  # another attempt's
        fault("rank-hung", ago_s=1),  # a hang is the ranks', not the agent's death
    ]
    assert drop_faults_of_the_lost_agent(job, 2) == 2
    left = set(JobFault.objects.filter(job=job).values_list("pk", flat=True))
    assert left == {f.pk for f in kept} and not ({dying.pk, killed.pk} & left)
