"""Reliability engines: fault injection, elastic recovery (restart from snapshots, hot swap), goodput.

Pure engines: no Django, no Celery.
"""
