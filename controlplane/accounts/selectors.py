"""Reads for accounts: which teams a user may see."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.accounts.models import ApiToken, Team


def teams_of(user) -> QuerySet[Team]:
    if not user or not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user)


def team_ids_of(user) -> list[int]:
    return list(teams_of(user).values_list("id", flat=True))


def scoped(queryset: QuerySet, user) -> QuerySet:
    """Only the objects of the user's teams. Superusers are not special here: the API is team-scoped."""
    return queryset.filter(team_id__in=teams_of(user).values("id"))


def active_tokens_of(user) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True)
