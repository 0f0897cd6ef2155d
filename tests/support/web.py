"""The one way tests start the web service."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from services.web.config import WebSettings
from services.web.server import WebServer, serve


@contextlib.asynccontextmanager
async def web_before(gateway_address: str, **settings: Any) -> AsyncIterator[WebServer]:
    """The web service on free loopback ports (its listener and its metrics), a
    client of the gateway at `gateway_address`, with `settings` over the defaults
    and checked as the service checks them at start; stopped when the block ends."""
    config = WebSettings(
        host="127.0.0.1", port=0, metrics_port=0, gateway_address=gateway_address, **settings
    )
    config.validate()
    server = await serve(config)
    try:
        yield server
    finally:
        await server.stop()
