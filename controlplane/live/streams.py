"""Which object a live stream belongs to, and who may read it."""

from __future__ import annotations

from django.apps import apps

from workers.events import STREAM_NAME

# stream kind -> "app_label.Model" of the LongRunningJob it reports on
STREAM_OWNERS = {"job": "jobs.TrainingJob", "search": "planning.StrategySearch"}


def group_name(stream: str) -> str:
    """Channels group of a stream (group names allow only [a-zA-Z0-9-_.])."""
    return "stream." + stream.replace("/", ".")


def owner_object(stream: str):
    """The job/search row of a stream, or None when the stream name or the object does not exist."""
    if not isinstance(stream, str) or not STREAM_NAME.match(stream):
        return None
    kind, pk = stream.split("/")
    model = apps.get_model(STREAM_OWNERS[kind])
    return model.objects.filter(pk=int(pk)).first()


def user_may_read(user, stream: str) -> bool:
    """True when the stream's object belongs to one of the user's teams."""
    if not user or not user.is_authenticated:
        return False
    obj = owner_object(stream)
    return obj is not None and obj.team.memberships.filter(user=user).exists()
