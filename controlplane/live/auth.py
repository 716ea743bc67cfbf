"""Websocket authentication: ``Authorization: Token …`` for API clients, the session cookie for the
browser. A session-authenticated socket must also come from an allowed Origin (cross-site websocket
hijacking); a token-authenticated one carries its own credential, so Origin is not required."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator

from controlplane.accounts.authentication import user_for_raw_token


def _token_from_headers(scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0].lower() == "token":
                return parts[1]
            return ""  # present but malformed: refuse, don't fall back to the cookie
    return None


class TokenOrSessionAuth:
    def __init__(self, inner):
        self.session_app = AllowedHostsOriginValidator(AuthMiddlewareStack(inner))
        self.inner = inner

    async def __call__(self, scope, receive, send):
        raw = _token_from_headers(scope)
        if raw is None:
            return await self.session_app(scope, receive, send)
        from django.contrib.auth.models import AnonymousUser

        user = await database_sync_to_async(user_for_raw_token)(raw) if raw else None
        scope = dict(scope, user=user or AnonymousUser())
        return await self.inner(scope, receive, send)
