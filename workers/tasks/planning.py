"""Planning tasks: thin wrappers that load by id and call ``controlplane.planning.services``."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.tasks.planning.run_search", acks_late=True, reject_on_worker_lost=True)
def run_search(search_id: int) -> str:
    from controlplane.planning.services import search_run

    return search_run(search_id)
