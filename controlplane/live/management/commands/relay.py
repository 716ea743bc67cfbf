import signal

from django.core.management.base import BaseCommand

from controlplane.live import housekeeping
from controlplane.live.relay import Relay


class Command(BaseCommand):
    help = (
        "Run the live-event relay: Redis streams -> database + Channels groups, and the apps' housekeeping."
    )

    def handle(self, *args, **options):
        # the apps' periodic jobs and hooks (each registers its own in AppConfig.ready: live/housekeeping.py)
        relay = Relay(
            periodic=list(housekeeping.PERIODIC),
            on_stored=list(housekeeping.ON_STORED),
            active_streams=list(housekeeping.ACTIVE_STREAMS),
        )
        # stopped (SIGTERM): finish the round, then store and acknowledge what the store thread holds
        signal.signal(signal.SIGTERM, lambda *_: relay.stop.set())
        try:
            relay.run_forever()
        except KeyboardInterrupt:
            relay.stop.set()
