"""Reads for accounts: which teams a user may see, and the user's API tokens."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.accounts.models import ApiToken, Team


def teams_of(user) -> QuerySet[Team]:
    if not user or not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user)


def scoped(queryset: QuerySet, user) -> QuerySet:
    """Only the objects of the user's teams. Superusers are not special here: the API is team-scoped."""
    return queryset.filter(team_id__in=teams_of(user).values("id"))


def tokens_of(user) -> QuerySet[ApiToken]:
    """The user's API tokens, revoked ones included (the tokens page and API show when each was revoked)."""
    return ApiToken.objects.filter(user=user)


def token_of(user, pk: int) -> ApiToken | None:
    return tokens_of(user).filter(pk=pk).first()
