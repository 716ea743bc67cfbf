"""A Celery worker's Prometheus endpoint: tasks started, finished (by outcome) and their durations, by task
name. Off unless ``CELERY_METRICS_PORT`` is set; then ``serve`` (``controlplane.celery``'s ``worker_init``,
in the worker's main process before its pool starts) opens ``http://CELERY_METRICS_ADDR:PORT/metrics``
(``CELERY_METRICS_ADDR`` defaults to 127.0.0.1: open it to the network on purpose).

Tasks run in the pool's processes (prefork) or threads, so the figures use prometheus_client's multiprocess
mode: each process writes its own files under ``PROMETHEUS_MULTIPROC_DIR`` (a fresh temporary directory
unless set) and the endpoint adds them up. Only this module's metrics go that way: the mode is switched on
here, in the worker, after everything else in the process created its metrics.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time

log = logging.getLogger(__name__)

# seconds: a ping takes milliseconds, a search seconds to minutes, run_node as long as its training
TASK_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 4 * 3600.0)
WORKER_METRICS = {
    "cann_train_celery_tasks_started": "Tasks this worker started, by task name.",
    "cann_train_celery_tasks_finished": "Tasks this worker finished, by task name and state (Celery's).",
    "cann_train_celery_tasks_failed": "Tasks this worker saw raise, by task name and exception type.",
    "cann_train_celery_task_duration_seconds": "Run time of this worker's tasks, by task name.",
}

_metrics: dict = {}
_started: dict[str, float] = {}  # task id -> perf_counter at prerun (the process that runs it)


def serve(port: int, addr: str = "127.0.0.1") -> str:
    """Switch this process' new metrics to multiprocess mode, create the task metrics and start the HTTP
    endpoint; returns the multiprocess directory."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server, values
    from prometheus_client.multiprocess import MultiProcessCollector

    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="cann-celery-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # the pool's processes (forked or spawned) write there
    values.ValueClass = values.MultiProcessValue()
    _metrics.update(
        started=Counter(
            "cann_train_celery_tasks_started", WORKER_METRICS["cann_train_celery_tasks_started"], ["task"]
        ),
        finished=Counter(
            "cann_train_celery_tasks_finished",
            WORKER_METRICS["cann_train_celery_tasks_finished"],
            ["task", "state"],
        ),
        failed=Counter(
            "cann_train_celery_tasks_failed",
            WORKER_METRICS["cann_train_celery_tasks_failed"],
            ["task", "exception"],
        ),
        duration=Histogram(
            "cann_train_celery_task_duration_seconds",
            WORKER_METRICS["cann_train_celery_task_duration_seconds"],
            ["task"],
            buckets=TASK_BUCKETS_S,
        ),
    )
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    start_http_server(port, addr=addr, registry=registry)
    log.info("worker metrics on http://%s:%s/metrics (%s)", addr, port, directory)
    return directory


def task_started(task_id: str, task_name: str) -> None:
    if _metrics:
        _started[task_id] = time.perf_counter()
        _metrics["started"].labels(task_name).inc()


def task_finished(task_id: str, task_name: str, state: str | None) -> None:
    if _metrics:
        began = _started.pop(task_id, None)
        _metrics["finished"].labels(task_name, state or "UNKNOWN").inc()
        if began is not None:
            _metrics["duration"].labels(task_name).observe(time.perf_counter() - began)


def task_failed(task_name: str, exception: BaseException | None) -> None:
    if _metrics:
        _metrics["failed"].labels(task_name, type(exception).__name__ if exception else "unknown").inc()
