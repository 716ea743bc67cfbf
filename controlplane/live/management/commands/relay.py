from django.core.management.base import BaseCommand

from controlplane.live.relay import Relay


class Command(BaseCommand):
    help = "Run the live-event relay: Redis streams -> database + Channels groups."

    def handle(self, *args, **options):
        from controlplane.jobs.services import reap_orphans

        # the relay is always running, so it also fails jobs whose supervising worker died
        relay = Relay(periodic=[(5.0, reap_orphans)])
        try:
            relay.run_forever()
        except KeyboardInterrupt:
            relay.stop.set()
