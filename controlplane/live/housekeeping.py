"""What the relay runs besides relaying: the apps' periodic jobs, and their hooks on stored events.

The relay is always running (one per deployment, apart from the Celery workers), so it is where the control
plane's housekeeping lives: failing jobs whose supervising worker died, requeueing searches whose worker died,
following jobs Slurm or Kubernetes runs, launching scheduled jobs when their slot opens. The live app is a
transport and knows no domain: each app registers its own jobs here from its ``AppConfig.ready`` (the jobs
app: :mod:`controlplane.jobs.apps`), and ``manage.py relay`` runs what is registered.

Why not Celery beat: these jobs must run when a worker has died (that is what the orphan reaper is for), and
while Redis is away (the pending-event publisher is what brings kept events back); a beat schedule runs its
tasks on the very workers, through the very broker, whose loss they exist to handle.
"""

from __future__ import annotations

from collections.abc import Callable

PERIODIC: list[tuple[float, Callable[[], object]]] = []
"""``(interval_s, fn)``: called between the relay's reads, at most every ``interval_s`` seconds."""
ON_STORED: list[Callable[[str, list[dict]], object]] = []
"""``fn(stream, events)``: told about every batch of events the relay stored."""


def every(interval_s: float, fn: Callable[[], object]) -> None:
    """Run ``fn`` from the relay every ``interval_s`` seconds (once per registration)."""
    if all(f is not fn for _i, f in PERIODIC):
        PERIODIC.append((float(interval_s), fn))


def on_stored(fn: Callable[[str, list[dict]], object]) -> None:
    """Tell ``fn`` about every batch of events the relay stores."""
    if fn not in ON_STORED:
        ON_STORED.append(fn)


ACTIVE_STREAMS: list[Callable[[], object]] = []
"""``fn() -> [stream, ...]``: the streams of objects still producing events (running jobs, searches): the
relay restores their counters when Redis comes back without its data (``Relay.restore_counters``)."""


def active_streams(fn: Callable[[], object]) -> None:
    """Tell the relay which streams are live now (their counters must survive a Redis that lost its data)."""
    if fn not in ACTIVE_STREAMS:
        ACTIVE_STREAMS.append(fn)
