"""The Celery app (Django's convention: ``<project>/celery.py``, loaded by ``controlplane/__init__.py``).

Configured from Django settings (``CELERY_*``). Each app keeps its tasks beside its services in
``controlplane/<app>/tasks.py`` (a task is one more interface to the app's core logic: it loads by id and
calls a service); ``autodiscover_tasks`` finds them. The engines under ``workers/`` know nothing of Celery.

Queues: ``default`` (short tasks, the health ping), ``planning`` (strategy searches), ``training`` (launch
and supervise torchrun, communication comparisons), and ``node.<name>`` per multi-node worker. Long tasks
set ``acks_late`` + ``reject_on_worker_lost`` so a worker that dies mid-task does not silently lose it.
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

QUEUES = ("default", "planning", "training")

app = Celery("cann_train")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [Queue(name) for name in QUEUES]
app.autodiscover_tasks()
