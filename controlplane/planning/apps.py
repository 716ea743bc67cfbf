from django.apps import AppConfig


class PlanningConfig(AppConfig):
    name = "controlplane.planning"
    label = "planning"

    def ready(self) -> None:
        from controlplane.live import housekeeping
        from controlplane.planning.selectors import active_search_streams
        from controlplane.planning.services import requeue_stalled_searches

        # a search whose worker died runs again
        housekeeping.every(5.0, requeue_stalled_searches)
        # a running search's stream keeps its numbering through a Redis that lost its data
        housekeeping.active_streams(active_search_streams)
