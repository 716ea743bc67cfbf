"""Persisted live events: the history behind every stream, written by the relay in batches."""

from __future__ import annotations

from django.db import models


class StreamEvent(models.Model):
    """One event of a live stream (``job/42``, ``search/7``), exactly as it was published.

    Redis keeps only the newest events of a stream; this table keeps all of them, so a page opened
    mid-run shows the whole history and a client that reconnects after a long gap misses nothing.
    """

    stream = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    time = models.DateTimeField()
    kind = models.CharField(max_length=16)
    step = models.BigIntegerField(null=True, blank=True)
    values = models.JSONField(default=dict)

    class Meta:
        ordering = ["stream", "seq"]
        constraints = [models.UniqueConstraint(fields=["stream", "seq"], name="unique_stream_seq")]
        indexes = [models.Index(fields=["stream", "step"], name="streamevent_stream_step")]

    def as_event(self) -> dict:
        return {
            "stream": self.stream,
            "seq": self.seq,
            "time": self.time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "kind": self.kind,
            "step": self.step,
            "values": self.values,
        }


class PendingEvent(models.Model):
    """An event that could not be published when its transaction committed (Redis was away): kept here
    and published by the relay once Redis answers, so a job's final ``succeeded`` is never lost."""

    stream = models.CharField(max_length=64)
    kind = models.CharField(max_length=16)
    step = models.BigIntegerField(null=True, blank=True)
    values = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]


class PendingTask(models.Model):
    """A Celery task to send once its transaction commits (a transactional outbox): written in the same
    transaction as the row it acts on (a queued job, a search), sent right after the commit and removed; while
    the broker (Redis) is away the row stays and the relay sends it when Redis is back. So a request that
    stored a queued job never leaves it queued forever, and never answers 503 for a job that exists."""

    task = models.CharField(max_length=200)
    args = models.JSONField(default=list)
    queue = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task}{tuple(self.args)} -> {self.queue}"
