"""Shared API pieces: team-scoped viewsets, the team field, and an exception handler that never 500s
on bad input or a missing backing service."""

from __future__ import annotations

import logging

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.accounts.models import Team
from controlplane.accounts.selectors import scoped, teams_of
from controlplane.common.middleware import UNAVAILABLE_ERRORS, describe_unavailable

log = logging.getLogger(__name__)


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            getattr(exc, "message_dict", None) or {"non_field_errors": exc.messages}
        )
    elif isinstance(exc, IntegrityError):
        log.info("integrity error turned into 409: %s", exc)
        return Response(
            {"detail": "This conflicts with an existing object (a name must be unique within a team)."},
            status=status.HTTP_409_CONFLICT,
        )
    elif isinstance(exc, UNAVAILABLE_ERRORS):
        service, detail = describe_unavailable(exc)
        return Response({"detail": f"{service} is unavailable: {detail}", "service": service}, status=503)
    return drf_exception_handler(exc, context)


def only_team_of(user) -> Team:
    """The team an object goes to when the request names none: the user's only team, else a 400."""
    teams = list(teams_of(user)[:2])
    if len(teams) != 1:
        raise serializers.ValidationError(
            {"team": ["You belong to several teams (or none): say which team owns this object."]}
        )
    return teams[0]


class TeamField(serializers.SlugRelatedField):
    """The owning team, by slug. Optional when the user belongs to exactly one team."""

    def __init__(self, **kwargs):
        kwargs.setdefault("slug_field", "slug")
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "help_text", "Slug of the owning team; may be omitted when you belong to exactly one team."
        )
        super().__init__(**kwargs)

    def get_queryset(self):
        request = self.context.get("request")
        return teams_of(request.user if request else None)


class TeamOwnedSerializer(serializers.ModelSerializer):
    team = TeamField()

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if self.instance is None and "team" not in attrs:
            attrs["team"] = only_team_of(self.context["request"].user)
        return attrs


class TeamScopedViewSet(viewsets.ModelViewSet):
    """CRUD over the objects of the user's teams only; another team's object is a 404, not a 403."""

    def get_queryset(self):
        return scoped(super().get_queryset(), self.request.user)
