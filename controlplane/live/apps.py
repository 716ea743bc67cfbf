from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "controlplane.live"
    label = "live"

    def ready(self) -> None:
        from controlplane.live import housekeeping
        from controlplane.live.services import publish_pending_events, send_pending_tasks

        # the events kept in the database while Redis was away go out when it is back
        housekeeping.every(2.0, publish_pending_events)
        # and so do the tasks whose sending after their commit found the broker away (the task outbox)
        housekeeping.every(3.0, send_pending_tasks)
