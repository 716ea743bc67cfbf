"""Planning tasks: load by id, call the service (``controlplane.planning.services``).

The service enqueues these after its commit; the task imports the service when it runs, so the two
modules do not import each other at import time.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=True, reject_on_worker_lost=True)
def run_search(search_id: int) -> str:
    from controlplane.planning.services import search_run

    return search_run(search_id=search_id)
