"""The largest WebSocket message each route of the web service takes, enforced
by the WebSocket parser itself, before a byte of a larger one is buffered.

uvicorn has one `ws_max_size` for the whole server; a Realtime append of 60 s
of audio needs megabytes, the page's and Moshi's messages a few kilobytes. A
message over its route's limit closes the socket (1009) as the frame header
announces it, so sixteen sockets sending 15 MiB each cost the process nothing.

This is the one module that reaches into uvicorn's and websockets' internals:
the ASGI `receive` of uvicorn's websockets-sansio protocol is a method of the
connection's protocol object, whose `conn` (websockets' ServerProtocol) reads
its `max_message_size` at each frame it parses. GUARDED lists what this
relies on; `check_private_names` refuses to start the web service on
versions without it (kame_common/private_names.py), rather than serve every
route at the server's largest limit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import uvicorn
import uvicorn.protocols.websockets.websockets_sansio_impl as sansio
import websockets
import websockets.server
from starlette.types import ASGIApp, Receive, Scope, Send

from kame_common import private_names
from kame_common.private_names import Guarded

# The websocket protocol this module fits, named in the server's config.
WS_PROTOCOL = "websockets-sansio"
PINNED = {"uvicorn": "0.54.0", "websockets": "17.4"}  # as constraints.txt has them


def sample_protocol(owner: type) -> object:
    """One of uvicorn's connections, unconnected (inside a running event loop)."""
    config = uvicorn.Config(app=lambda scope, receive, send: None, ws=WS_PROTOCOL)
    config.load()
    return owner(config=config, server_state=uvicorn.server.ServerState(), app_state={})


def sample_server_protocol(owner: type) -> object:
    return owner()


GUARDED = [
    Guarded(
        "uvicorn.protocols.websockets.websockets_sansio_impl.WebSocketsSansIOProtocol",
        "conn",
        sample=sample_protocol,
    ),
    Guarded(
        "uvicorn.protocols.websockets.websockets_sansio_impl.WebSocketsSansIOProtocol",
        "receive",
        params=(),
    ),
    Guarded("websockets.server.ServerProtocol", "max_message_size", sample=sample_server_protocol),
]
log = logging.getLogger(__name__)


def missing_private_names(packages: Mapping[str, object] | None = None) -> list[str]:
    """What of GUARDED the installed uvicorn and websockets (or `packages`) lack."""
    return private_names.missing(
        GUARDED, packages or {"uvicorn": uvicorn, "websockets": websockets}
    )


def check_private_names() -> None:
    private_names.check("services/web/socket_limits.py", PINNED, missing_private_names())


def limit_message_size(receive: Receive, max_bytes: int) -> None:
    """The connection behind `receive` takes messages of at most `max_bytes` from now."""
    connection = getattr(receive, "__self__", None)
    if not isinstance(connection, sansio.WebSocketsSansIOProtocol):
        raise TypeError(f"not a {WS_PROTOCOL} connection's receive: {receive!r}")
    server_protocol: websockets.server.ServerProtocol = connection.conn
    server_protocol.max_message_size = max_bytes


class MessageLimits:
    """ASGI middleware: each WebSocket route's largest message (`limits` by path;
    a path not listed keeps the server's ws_max_size)."""

    def __init__(self, app: ASGIApp, limits: Mapping[str, int]) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limits.get(scope.get("path", "")) if scope["type"] == "websocket" else None
        if limit is not None:
            limit_message_size(receive, limit)
        await self.app(scope, receive, send)
