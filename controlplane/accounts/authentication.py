"""``Authorization: Token ct_…`` authentication for the API, the CLI and websockets."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import authentication, exceptions

from controlplane.accounts.models import ApiToken, hash_token


def user_for_raw_token(raw: str):
    """The active user behind a raw token, or None."""
    token = (
        ApiToken.objects.select_related("user")
        .filter(key_hash=hash_token(raw), revoked_at__isnull=True)
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Token <token>'.")
        try:
            raw = header[1].decode()
        except UnicodeError as exc:
            raise exceptions.AuthenticationFailed("Token contains invalid characters.") from exc
        user = user_for_raw_token(raw)
        if user is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token. Create one under /tokens/.")
        return (user, raw)

    def authenticate_header(self, request):
        return self.keyword
