from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "controlplane.jobs"
    label = "jobs"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.clusters import calibration
        from controlplane.jobs.comparisons import reap_stalled_comparisons
        from controlplane.jobs.plan_launch import launch_form, scaled_down_launch
        from controlplane.jobs.selectors import (
            active_job_streams,
            jobs_training_count,
            plan_measured_expert_load,
            plan_measured_runs,
        )
        from controlplane.jobs.services import (
            job_progress_from_events,
            keep_job_credentials,
            reap_orphans,
            scheduling,
        )
        from controlplane.jobs.services.delivery import audit_event_delivery
        from controlplane.jobs.services.follow import follow_external_jobs
        from controlplane.live import housekeeping
        from controlplane.planning import ports

        # run by the relay (controlplane/live/housekeeping.py): jobs whose supervising worker died fail,
        # jobs Slurm / Kubernetes runs follow their scheduler's state, stalled comparisons end, the jobs of
        # a carbon-aware schedule launch (and pause) when their slots open (and end); a running job's
        # progress is kept from its train events as they are stored
        housekeeping.every(5.0, reap_orphans)
        housekeeping.every(settings.EXTERNAL_FOLLOW_EVERY_S, follow_external_jobs)
        housekeeping.every(5.0, reap_stalled_comparisons)
        housekeeping.every(5.0, scheduling.tick)
        # the Redis credentials a job's ranks publish with: made again after a Redis restart lost them, removed
        # once the job has ended
        housekeeping.every(3.0, keep_job_credentials)
        # the train events a job's rank 0 published, counted against those stored once it ended: a Redis that
        # lost its data before the relay read them is an events-lost fault, not a silent gap
        housekeeping.every(10.0, audit_event_delivery)
        housekeeping.on_stored(job_progress_from_events)
        # a job's stream keeps its numbering through a Redis that lost its data (the relay restores it)
        housekeeping.active_streams(active_job_streams)

        # the knowledge base learns from the runs of its plans, and launches them with the options its page
        # offers (planning sits below jobs)
        ports.plug(
            measured_runs=plan_measured_runs,
            measured_expert_load=plan_measured_expert_load,
            launch=scaled_down_launch,
            launch_form=launch_form,
        )
        # a calibration of this machine waits for the jobs training here (clusters sits below jobs)
        calibration.plug(busy=jobs_training_count)
