"""The Celery app. Configured from Django settings (``CELERY_*``); tasks live in ``workers.tasks``.

Queues: ``default`` (short tasks, the health ping), ``planning`` (strategy searches), ``training``
(launch and supervise torchrun). Long tasks set ``acks_late`` + ``reject_on_worker_lost`` so a worker
that dies mid-task does not silently lose it.
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

# every module that defines tasks; a worker imports them at start
TASK_MODULES = ["workers.tasks.health", "workers.tasks.planning", "workers.tasks.training"]

app = Celery("cann_train", include=TASK_MODULES)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [Queue(name) for name in ("default", "planning", "training")]
