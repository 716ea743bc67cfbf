# Load the Celery app with Django so that @shared_task uses its configuration (broker, result backend).
from controlplane.celery import app as celery_app

__all__ = ("celery_app",)
