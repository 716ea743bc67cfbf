from django.core.management.base import BaseCommand

from controlplane.live.relay import Relay


class Command(BaseCommand):
    help = "Run the live-event relay: Redis streams -> database + Channels groups."

    def handle(self, *args, **options):
        relay = Relay()
        try:
            relay.run_forever()
        except KeyboardInterrupt:
            relay.stop.set()
