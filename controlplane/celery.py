"""The Celery app (Django's convention: ``<project>/celery.py``, loaded by ``controlplane/__init__.py``).

Configured from Django settings (``CELERY_*``). Each app keeps its tasks beside its services in
``controlplane/<app>/tasks.py`` (a task is one more interface to the app's core logic: it loads by id and
calls a service); ``autodiscover_tasks`` finds them. The engines under ``workers/`` know nothing of Celery.

Queues: ``default`` (short tasks, the health ping), ``planning`` (strategy searches), ``training`` (launch
and supervise torchrun, communication comparisons), and ``node.<name>`` per multi-node worker. Long tasks
set ``acks_late`` + ``reject_on_worker_lost`` so a worker that dies mid-task does not silently lose it.

Observability (README "Observability"): a task published while a request is answered carries its request
id in a message header, restored into the log context of the run with the task's ``job_id`` / ``search_id``;
``LOG_FORMAT=json`` makes the worker's log lines JSON; ``CELERY_METRICS_PORT`` opens the worker's Prometheus
endpoint (``controlplane.common.worker_metrics``); ``SIGUSR2`` dumps every thread's stack into its log.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    before_task_publish,
    task_failure,
    task_postrun,
    task_prerun,
    worker_init,
    worker_ready,
)
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

QUEUES = ("default", "planning", "training")

app = Celery("cann_train")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [Queue(name) for name in QUEUES]
app.autodiscover_tasks()


# --- observability: the request id across the broker, structured worker logs, the worker's /metrics -----
# a task's arguments named so go into the log context of the run (every log line of it says the object)
LOGGED_ARGUMENTS = ("job_id", "search_id", "comparison_id")
_task_log_context: dict[str, object] = {}  # task id -> the context token its prerun set


@before_task_publish.connect
def carry_request_id(headers=None, **kwargs) -> None:
    """A task enqueued while a request is answered (or by a task that carries one) carries its request id."""
    from controlplane.common.logs import TASK_HEADER, current_request_id

    request_id = current_request_id()
    if headers is not None and request_id and TASK_HEADER not in headers:
        headers[TASK_HEADER] = request_id


@task_prerun.connect
def restore_log_context(task_id=None, task=None, args=None, kwargs=None, **_) -> None:
    import inspect

    from controlplane.common import logs, worker_metrics

    # a worker's request has the message's own headers as attributes; an eager call's keeps them in .headers
    headers = task.request.get("headers") or {}
    context = {"request_id": task.request.get(logs.TASK_HEADER) or headers.get(logs.TASK_HEADER)}
    try:
        bound = inspect.signature(task.run).bind_partial(*(args or ()), **(kwargs or {})).arguments
        context |= {name: bound.get(name) for name in LOGGED_ARGUMENTS}
    except TypeError:  # arguments that do not fit: the task itself will say so
        pass
    _task_log_context[task_id] = logs.bind(**context)
    worker_metrics.task_started(task_id, task.name)


@task_postrun.connect
def clear_log_context(task_id=None, task=None, state=None, **_) -> None:
    from controlplane.common import logs, worker_metrics

    worker_metrics.task_finished(task_id, task.name, state)
    if (token := _task_log_context.pop(task_id, None)) is not None:
        try:
            logs.log_context.reset(token)
        except ValueError:  # set in another context (an eager call nested in a task): drop it instead
            logs.log_context.set({})


@task_failure.connect
def count_failure(sender=None, exception=None, **_) -> None:
    from controlplane.common import worker_metrics

    worker_metrics.task_failed(getattr(sender, "name", str(sender)), exception)


@worker_init.connect
def dump_stacks_on_sigusr2(**_) -> None:
    """``kill -USR2 <worker pid>`` writes every thread's Python stack to the worker's log (stderr) even while
    a thread holds the GIL: what a worker whose supervisors stopped beating is doing. Celery's own SIGUSR1
    dump is Python code, which such a worker never runs; faulthandler's handler is C. Prefork children
    inherit it. (Celery takes SIGUSR2 only for its remote debugger, with ``CELERY_RDBSIG`` set.)"""
    import faulthandler
    import signal
    import sys

    if not os.environ.get("CELERY_RDBSIG"):
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)


# what a node's supervision imports on its first job (the elastic watch's snapshot storage is torch: 0.7 s on
# a quiet machine, 4-13 s measured under the test suite's load)
NODE_SUPERVISION_MODULES = (
    "workers.training.checkpoint.storage",
    "workers.reliability.elastic",
    "workers.reliability.risk_watch",
)


@worker_init.connect
def warm_node_supervision(sender=None, **_) -> None:
    """A worker that supervises nodes (it consumes ``training`` or a ``node.<name>`` queue) imports what a
    node's watches need before it takes a task: otherwise a fresh worker's first node imports torch while
    its heartbeats, telemetry and polls run, each waiting on that import's module locks or on the CPU it
    takes, and the reaper may give a live node up. Prefork children inherit the modules."""
    import importlib
    import logging
    import time

    queues = set(sender.app.amqp.queues.consume_from) if sender is not None else set()
    if "training" not in queues and not any(q.startswith("node.") for q in queues):
        return
    started = time.monotonic()
    for name in NODE_SUPERVISION_MODULES:
        importlib.import_module(name)
    logging.getLogger(__name__).info("node supervision imported in %.1f s", time.monotonic() - started)


@worker_init.connect
def serve_worker_metrics(**_) -> None:
    """``CELERY_METRICS_PORT`` set: this worker answers Prometheus on that port (``CELERY_METRICS_ADDR``)."""
    if port := os.environ.get("CELERY_METRICS_PORT"):
        from controlplane.common import worker_metrics

        worker_metrics.serve(int(port), os.environ.get("CELERY_METRICS_ADDR", "127.0.0.1"))


@after_setup_logger.connect
@after_setup_task_logger.connect
def structured_worker_logs(logger=None, **_) -> None:
    """Celery sets up the worker's own log handlers; with ``LOG_FORMAT=json`` they write JSON lines too, and
    in either format every record knows the log context."""
    from django.conf import settings

    from controlplane.common.logs import JsonFormatter, LogContextFilter

    for handler in logger.handlers if logger is not None else []:
        handler.addFilter(LogContextFilter())
        if getattr(settings, "LOG_FORMAT", "plain") == "json":
            handler.setFormatter(JsonFormatter())


# --- liveness: a worker says it is alive from a thread of its main process ------------------------------
@worker_ready.connect
def beat_while_alive(sender=None, **_) -> None:
    """Every ``WORKER_BEAT_S`` the worker's main process writes ``cann:worker-beat:<name>`` (its queues and the
    time; it expires after ``WORKER_BEAT_TTL_S``): ``/readyz`` judges workers by it. A ping task would wait
    behind the tasks a busy worker runs (every slot training: "dead" to a probe that would restart it)."""
    from controlplane.common.health import start_worker_beat

    queues = sorted(sender.app.amqp.queues.consume_from) if sender is not None else []
    start_worker_beat(getattr(sender, "hostname", None) or "worker", queues)
