"""Writes for accounts."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from controlplane.accounts.models import ApiToken, Membership, Team


@transaction.atomic
def team_create(*, name: str, members: list = (), admins: list = ()) -> Team:
    team = Team.objects.create(name=name, slug=slugify(name) or secrets.token_hex(4))
    for user in admins:
        Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    for user in members:
        Membership.objects.get_or_create(team=team, user=user)
    return team


def token_issue(*, user, name: str) -> tuple[ApiToken, str]:
    """Create a named API token; returns the row and the raw token (shown once, never stored)."""
    return ApiToken.issue(user=user, name=name)


def token_revoke(*, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


@transaction.atomic
def demo_setup(*, username: str = "demo", team_name: str = "Demo team") -> tuple[object, str | None]:
    """The demo user and team of ``make run``. Returns (user, password) — password only when created."""
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    password = None
    if user is None:
        password = secrets.token_urlsafe(12)
        user = User.objects.create_user(
            username=username, password=password, email=f"{username}@example.invalid"
        )
    team = Team.objects.filter(name=team_name).first() or team_create(name=team_name, admins=[user])
    Membership.objects.get_or_create(team=team, user=user)
    return user, password
