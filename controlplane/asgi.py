"""ASGI entry point (served by daphne): HTTP through Django, websockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from controlplane.common.body_limit import install as bound_request_bodies  # noqa: E402

bound_request_bodies()  # daphne reads a body whole before the app sees it: bound it where it arrives (413)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from controlplane.live.auth import TokenOrSessionAuth  # noqa: E402
from controlplane.live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": TokenOrSessionAuth(URLRouter(websocket_urlpatterns)),
    }
)
