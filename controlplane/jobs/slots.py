"""A green schedule's slots as times: when a scheduled job is due, its next slot, and how its messages write a
time. Pure arithmetic on the stored schedule (``GreenSchedule.slots``): the launcher (``scheduling``), the
node bookkeeping (``services.nodes``) and the job page all read slots through it."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_text(t: datetime) -> str:
    """A time as the job's messages write it: ``2026-12-04 13:30:00 UTC``."""
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def slots_of(schedule) -> list[tuple[datetime, datetime]]:
    """The schedule's slots as datetimes, ascending."""
    return [(datetime.fromisoformat(a), datetime.fromisoformat(b)) for a, b in schedule.slots]


def due_slot(slots: list[tuple[datetime, datetime]], now: datetime) -> tuple[datetime | None, bool] | None:
    """Whether a scheduled job is due at ``now``: ``(end of the open slot, False)``, ``(None, True)`` when
    every slot has ended (it is overdue: it runs to the end), or ``None`` (it waits)."""
    for start, end in slots:
        if start <= now < end:
            return end, False
    if slots and now >= slots[-1][1]:
        return None, True
    return None


def next_slot(slots: list[tuple[datetime, datetime]], after: datetime) -> tuple[datetime, datetime] | None:
    """The first slot that starts at or after ``after``."""
    return next(((a, b) for a, b in slots if a >= after), None)
