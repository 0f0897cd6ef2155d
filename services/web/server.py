"""The web service's HTTP glue: Starlette routes served by uvicorn.

- GET /            the page (static/index.html) and GET /static/* its modules
- GET /config.json what the page may offer: modes and LLM models (the settings)
- GET /healthz     200 while serving, 503 once draining (the probes' check)
- WS  /converse    one conversation, bridged to Gateway.Converse (bridge.py)

A WebSocket from another origin than the page's own (or one of
`allowed_origins`) is refused, so a third-party site cannot talk through a
visitor's browser. Every response carries a Content-Security-Policy that lets
the page load only its own files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from kame_common import tracing
from kame_common.http_server import HttpServer
from kame_common.server import ACTIVE_SESSIONS, service_main, until_signal
from services.web.bridge import Bridge, error_event, send_json
from services.web.config import WebSettings

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class StarletteSocket:
    """A Starlette WebSocket as the bridge's PageSocket."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket

    async def receive(self) -> str | bytes | None:
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            return None
        data: str | bytes | None = message.get("bytes")
        return data if data is not None else message.get("text")

    async def send_text(self, text: str) -> None:
        await self.websocket.send_text(text)

    async def send_bytes(self, data: bytes) -> None:
        await self.websocket.send_bytes(data)


def same_origin(websocket: WebSocket, allowed: Sequence[str]) -> bool:
    """Whether the page that opened `websocket` may use it: no Origin (not a
    browser), the page's own host, or an origin the operator listed."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == websocket.headers.get("host") or origin in allowed


class WebApp:
    """The routes, the bridge and the count of open conversations."""

    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings
        self.bridge = Bridge(settings)
        self.active_sessions = 0
        self.idle = asyncio.Event()  # set while no conversation is open
        self.idle.set()
        self.draining = False
        self._gauge = ACTIVE_SESSIONS.labels(service="web")
        self.app = Starlette(
            routes=[
                Route("/", self.index),
                Route("/config.json", self.page_config),
                Route("/healthz", self.healthz),
                Route("/favicon.ico", no_icon),
                WebSocketRoute("/converse", self.converse),
                Mount("/static", StaticFiles(directory=STATIC), name="static"),
            ],
            middleware=[Middleware(BaseHTTPMiddleware, dispatch=add_security_headers)],
        )

    async def index(self, _request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def page_config(self, _request: Request) -> Response:
        return JSONResponse(
            {"modes": self.settings.mode_choices, "llm_models": self.settings.llm_choices}
        )

    async def healthz(self, _request: Request) -> Response:
        if self.draining:
            return PlainTextResponse("draining", status_code=503)
        return PlainTextResponse("ok")

    async def converse(self, websocket: WebSocket) -> None:
        if not same_origin(websocket, self.settings.origins):
            await websocket.close(code=1008, reason="origin not allowed")
            return
        await websocket.accept()
        page = StarletteSocket(websocket)
        limit = self.settings.max_sessions
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the page went away
            if self.draining or (limit and self.active_sessions >= limit):
                why = "draining" if self.draining else f"at its limit of {limit} conversations"
                await send_json(
                    page, error_event("RESOURCE_EXHAUSTED", f"the web service is {why}")
                )
            else:
                await self._bridged(page)
            await websocket.close()

    async def _bridged(self, page: StarletteSocket) -> None:
        self.active_sessions += 1
        self._gauge.set(self.active_sessions)
        self.idle.clear()
        try:
            await self.bridge.run(page)
        finally:
            self.active_sessions -= 1
            self._gauge.set(self.active_sessions)
            if not self.active_sessions:
                self.idle.set()


async def no_icon(_request: Request) -> Response:
    """The page has no icon: an empty answer instead of a 404 in the browser's console."""
    return Response(status_code=204)


async def add_security_headers(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    response = await call_next(request)
    response.headers.update(SECURITY_HEADERS)
    return response


class WebServer(HttpServer):
    def __init__(self, web: WebApp) -> None:
        super().__init__(web.app, web.settings, "web")
        self.web = web

    async def stop(self, grace_s: float = 0.0) -> None:
        """Health 503 and no new conversations; open ones get up to `grace_s` to end."""
        self.web.draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.web.idle.wait(), grace_s)
        await self.shut_down()

    async def serve_until_stopped(self) -> None:
        await until_signal()
        await self.stop(self.web.settings.grace_s)


async def serve(settings: WebSettings) -> WebServer:
    """Start the web service; stop it with `await server.stop()`."""
    tracing.setup_tracing("web", settings.otlp_endpoint, settings.otlp_ca_file)
    settings.check_gateway_ca()
    server = WebServer(WebApp(settings))
    await server.start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(WebSettings, serve, argv)
