"""Writes for training jobs, one module per job, on floors (each imports only those below it; ``.importlinter``'s
jobs contract):

- ``events`` (a job's live events, the retried database write), ``outcomes`` (a job failed; what a cancelled
  one says);
- ``faults`` (what the recovery engine reports, kept; what the next attempt resumes from), ``launchers``
  (Slurm / Kubernetes: launch and cancel an attempt);
- ``lifecycle`` (launch, fan out to the nodes, cancel);
- ``nodes`` (what the nodes report, an attempt settled);
- ``recovery`` (a lost worker resumed, an elastic job's node range, a restore), ``follow`` (the jobs a
  scheduler runs);
- ``watches`` (a node's recovery and risk watches), ``orphans`` (jobs whose worker died), ``submit``
  (check, store, launch or schedule; ``user_code``: a job of a user's own code), ``annotations`` (tags, notes), ``export``;
- ``node_run`` (one node of one attempt: the Celery task's body).

The process supervision itself is the engine's (``workers.training.supervision.supervisor``); these modules
record what it reports. Carbon-aware launching is ``controlplane.jobs.services.scheduling`` (its slot arithmetic
``controlplane.jobs.slots``), comparisons ``controlplane.jobs.comparisons``.

Callers above the app's services (APIs, views, tasks, other apps, tests) take the names from here; a module
of the app takes them from the module that defines them (this package imports every one of them)."""

from __future__ import annotations

from controlplane.jobs.paths import job_dir
from controlplane.jobs.services.annotations import (
    MAX_TAGS,
    NOTES_MAX_CHARS,
    TAG_MAX_CHARS,
    clean_notes,
    clean_tags,
    job_annotate,
)
from controlplane.jobs.services.events import DATABASE_RETRY_S, job_event, until_the_database_answers
from controlplane.jobs.services.lifecycle import (
    MAX_ACTIVE_JOBS_PER_TEAM,
    job_cancel,
    job_fan_out,
    job_launch,
    scheduled_message,
)
from controlplane.jobs.services.node_run import node_run
from controlplane.jobs.services.nodes import (
    HEARTBEAT_TIMEOUT,
    MEASURED_KEYS,
    heartbeat,
    job_progress_from_events,
    node_alive,
    node_finished,
    node_started,
    record_measurement,
    settle_attempt,
)
from controlplane.jobs.services.orphans import keep_job_credentials, reap_orphans, running_on_node
from controlplane.jobs.services.outcomes import cancelled_message, job_fail
from controlplane.jobs.services.submit import (
    MAX_CPU_STEPS,
    MAX_DEVICES_PER_NODE,
    RUN_OPTIONS,
    check_elastic_layout,
    check_elastic_policy,
    check_fits_this_machine,
    check_injectable,
    check_node_range,
    check_restart_policy,
    job_config_of,
    job_create,
    job_submit,
    snapshot_dir_of,
    validated_config,
)
from controlplane.jobs.services.user_code import check_user_run_request

__all__ = [
    "keep_job_credentials",
    "check_user_run_request",
    "job_event",
    "DATABASE_RETRY_S",
    "until_the_database_answers",
    "MAX_DEVICES_PER_NODE",
    "MAX_CPU_STEPS",
    "validated_config",
    "check_fits_this_machine",
    "RUN_OPTIONS",
    "job_config_of",
    "job_submit",
    "snapshot_dir_of",
    "check_restart_policy",
    "check_node_range",
    "check_elastic_policy",
    "check_elastic_layout",
    "check_injectable",
    "job_create",
    "MAX_ACTIVE_JOBS_PER_TEAM",
    "scheduled_message",
    "job_launch",
    "cancelled_message",
    "job_cancel",
    "job_fail",
    "job_fan_out",
    "job_dir",
    "MAX_TAGS",
    "TAG_MAX_CHARS",
    "NOTES_MAX_CHARS",
    "clean_tags",
    "clean_notes",
    "job_annotate",
    "HEARTBEAT_TIMEOUT",
    "node_started",
    "heartbeat",
    "node_finished",
    "node_alive",
    "settle_attempt",
    "MEASURED_KEYS",
    "record_measurement",
    "job_progress_from_events",
    "node_run",
    "reap_orphans",
    "running_on_node",
]
