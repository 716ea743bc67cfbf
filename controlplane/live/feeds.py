"""Team feeds: a short notice to every open page of a team when one of its jobs changes state, is
created or is annotated, so lists (the jobs page, the dashboard) can refresh the row and show new jobs.

A notice says only *which* object changed (``{"feed": "jobs", "id": 42, "state": "running"}``); the page
then reads the rows through the API, which scopes them to the user's teams. Notices are not kept and
have no ``seq``: a page that reconnects re-reads its rows instead of replaying them. The figures of a
running job (tokens/s, step time) still come from its own stream, ``job/<id>``.

Producers call :func:`notify_after_commit` (a page that reacts to the notice reads committed rows); the
websocket consumer joins the feed groups of the user's teams when a page sends
``{"action": "watch", "feed": "jobs"}``.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

FEEDS = frozenset({"jobs"})


def feed_group(feed: str, team_id: int) -> str:
    """Channels group of a team's feed (group names allow only [a-zA-Z0-9-_.])."""
    return f"feed.{feed}.team.{team_id}"


def notify(feed: str, team_id: int, notice: dict) -> None:
    """Send a notice to the pages watching this team's feed now. Best effort: a list that misses one
    catches up on its next refresh, so a channel-layer failure is logged, never raised into the write."""
    try:
        async_to_sync(get_channel_layer().group_send)(
            feed_group(feed, team_id), {"type": "feed.notice", "feed": feed, "notice": notice}
        )
    except Exception:  # noqa: BLE001 - a notice must not fail the write it follows
        log.warning("feed %s of team %s: notice not sent", feed, team_id, exc_info=True)


def notify_after_commit(feed: str, team_id: int, notice: dict) -> None:
    """Send once the surrounding transaction commits (at once outside one)."""
    transaction.on_commit(lambda: notify(feed, team_id, notice))
