import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane.live.relay import Relay


class Command(BaseCommand):
    help = "Run the live-event relay: Redis streams -> database + Channels groups."

    def handle(self, *args, **options):
        from controlplane.jobs import scheduling
        from controlplane.jobs.comparisons import reap_stalled_comparisons
        from controlplane.jobs.external import follow_external_jobs
        from controlplane.jobs.services import job_progress_from_events, reap_orphans
        from controlplane.live.services import publish_pending_events
        from controlplane.planning.services import requeue_stalled_searches

        # the relay is always running, so it also fails jobs whose supervising worker died, runs again the
        # searches whose worker died, publishes the events kept while Redis was away, and keeps each
        # running job's progress from its train events, and launches (and pauses) the jobs that run under a
        # carbon-aware schedule when their slots open (and end)
        relay = Relay(
            periodic=[
                (5.0, reap_orphans),
                # jobs Slurm / Kubernetes runs follow their scheduler's state
                (settings.EXTERNAL_FOLLOW_EVERY_S, follow_external_jobs),
                (5.0, requeue_stalled_searches),
                (5.0, reap_stalled_comparisons),
                (2.0, publish_pending_events),
                (5.0, scheduling.tick),
            ],
            on_stored=[job_progress_from_events],
        )
        # stopped (SIGTERM): finish the round, then store and acknowledge what the store thread holds
        signal.signal(signal.SIGTERM, lambda *_: relay.stop.set())
        try:
            relay.run_forever()
        except KeyboardInterrupt:
            relay.stop.set()
