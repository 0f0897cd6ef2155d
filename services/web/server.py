"""The web service's HTTP glue: Starlette routes served by uvicorn.

- GET /            the page (static/index.html) and GET /static/* its modules
- GET /config.json what the page may offer: modes and LLM models (the settings)
- GET /healthz     200 while serving, 503 once draining (the probes' check)
- WS  /converse    one conversation, bridged to Gateway.Converse (bridge.py)
- WS  /v1/realtime the OpenAI Realtime protocol over Gateway.Converse
                   (realtime.py, realtime_bridge.py); `?model=kame-<mode>`
- WS  /api/chat    the Moshi protocol over Gateway.Converse (moshi_chat.py)

Who may talk through the bridge:
- a request whose Host is not one of `allowed_hosts` (the loopback names and
  the bind address by default) is refused with 403, GET /healthz excepted (the
  kubelet's probes name the pod's IP): a DNS-rebinding page on evil.example that
  resolves to 127.0.0.1 still says Host: evil.example;
- a WebSocket without an Origin, or from another origin than the page's own
  (or one of `allowed_origins`), is refused with 403, so a third-party site
  cannot talk through a visitor's browser;
- /v1/realtime and /api/chat are APIs for programs, which send no Origin:
  there the caller's bearer token (`Authorization: Bearer`, the gateway's to
  check; Moshi's clients send none) is the gate, and an Origin, when a browser
  sends one, must be allowed as above;
- a conversation counts against `max_sessions` only once its start message
  came; a socket that sends none within `start_timeout_s` is closed (1008);
  a Moshi socket counts from its opening (its call opens at once) and is
  closed (1008) if it sends no audio within `start_timeout_s` of the handshake.
Every response carries a Content-Security-Policy that lets the page load only
its own files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import grpc
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from kame_client.status import CallEnd
from kame_common import tracing
from kame_common.http_server import HttpServer
from kame_common.server import ACTIVE_SESSIONS, service_main, until_signal
from services.web.bridge import Bridge, Start, StartError, error_event, parse_start, send_json
from services.web.config import WebSettings
from services.web.moshi_chat import TRY_AGAIN_LATER, Close, MoshiBridge, refuse
from services.web.realtime import lone_error
from services.web.realtime_bridge import MAX_MESSAGE_BYTES, RealtimeBridge, bearer_token

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# WebSocket close codes (RFC 6455, 7.4.1).
NORMAL_CLOSURE, POLICY_VIOLATION = 1000, 1008


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


def host_name(netloc: str | None) -> str:
    """The host of a Host header (`name:port`, `[::1]:port`): lower case, no port."""
    if not netloc:
        return ""
    try:
        return urlsplit(f"//{netloc}").hostname or ""
    except ValueError:  # an unbalanced "[" in a header anyone can write
        return ""


def origin_refusal(websocket: WebSocket, allowed: Sequence[str], api: bool = False) -> str:
    """Why the page that opened `websocket` may not use it ("" if it may): it must
    be a browser page (Origin set) of the page's own origin or one the operator listed.
    `api`: a program (no Origin) may too."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return "" if api else "no Origin: only the page may open this socket"
    if origin in allowed or urlsplit(origin).netloc == websocket.headers.get("host"):
        return ""
    return "origin not allowed"


class WebApp:
    """The routes, the bridge and the count of open conversations."""

    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings
        self.bridge = Bridge(settings)
        self.realtime_bridge = RealtimeBridge(settings)
        self.moshi_bridge = MoshiBridge(settings)
        self.active_sessions = 0
        self.idle = asyncio.Event()  # set while no conversation is open
        self.idle.set()
        self.draining = False
        self.hosts = settings.hosts
        self._gauge = ACTIVE_SESSIONS.labels(service="web")
        self.app = Starlette(
            routes=[
                Route("/", self.index),
                Route("/config.json", self.page_config),
                Route("/healthz", self.healthz),
                Route("/favicon.ico", no_icon),
                WebSocketRoute("/converse", self.converse),
                WebSocketRoute("/v1/realtime", self.realtime),
                WebSocketRoute("/api/chat", self.moshi_chat),
                Mount("/static", StaticFiles(directory=STATIC), name="static"),
            ],
            middleware=[Middleware(BaseHTTPMiddleware, dispatch=self.guard_http)],
        )

    def host_allowed(self, host_header: str | None) -> bool:
        return host_name(host_header) in self.hosts

    async def guard_http(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """Requests by an allowed host name only (probes excepted), with the security headers."""
        if request.url.path == "/healthz" or self.host_allowed(request.headers.get("host")):
            response = await call_next(request)
        else:
            response = PlainTextResponse("host not allowed", status_code=403)
        response.headers.update(SECURITY_HEADERS)
        return response

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
        refusal = self.socket_refusal(websocket)
        if refusal:  # closed before it is accepted: the browser gets 403
            log.info("websocket refused: %s", refusal)
            await websocket.close(code=POLICY_VIOLATION, reason=refusal)
            return
        await websocket.accept()
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the page went away
            code, reason = await self._conversation(StarletteSocket(websocket))
            await websocket.close(code=code, reason=reason)

    def socket_refusal(self, websocket: WebSocket, api: bool = False) -> str:
        """Why `websocket` may not be opened ("" if it may)."""
        if not self.host_allowed(websocket.headers.get("host")):
            return "host not allowed"
        return origin_refusal(websocket, self.settings.origins, api)

    async def realtime(self, websocket: WebSocket) -> None:
        """An OpenAI Realtime session (realtime_bridge.py)."""
        refusal = self.socket_refusal(websocket, api=True)
        if refusal:
            log.info("realtime websocket refused: %s", refusal)
            await websocket.close(code=POLICY_VIOLATION, reason=refusal)
            return
        await websocket.accept()
        socket = StarletteSocket(websocket)
        model = websocket.query_params.get("model", "")
        token = bearer_token(websocket.headers.get("authorization")) or self.settings.relayed_token
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client went away
            if refusal := self.session_refusal():
                await send_json(socket, lone_error("server_busy", refusal, "server_error"))
            else:
                async with self.counted():
                    await self.realtime_bridge.run(socket, model, token)
            await websocket.close(code=NORMAL_CLOSURE)

    async def moshi_chat(self, websocket: WebSocket) -> None:
        """A Moshi-protocol chat (moshi_chat.py)."""
        refusal = self.socket_refusal(websocket, api=True)
        if refusal:
            log.info("moshi websocket refused: %s", refusal)
            await websocket.close(code=POLICY_VIOLATION, reason=refusal)
            return
        await websocket.accept()
        socket = StarletteSocket(websocket)
        token = bearer_token(websocket.headers.get("authorization")) or self.settings.relayed_token
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client went away
            if refusal := self.session_refusal():
                close = await refuse(socket, Close(TRY_AGAIN_LATER, refusal))
            else:
                async with self.counted():
                    close = await self.moshi_bridge.run(socket, websocket.query_params, token)
            await websocket.close(code=close.code, reason=close.short_reason)

    async def _conversation(self, page: StarletteSocket) -> tuple[int, str]:
        """The page's start message, then its conversation; the code and reason to
        close its socket with. A socket that never starts holds no session."""
        timeout = self.settings.start_timeout_s
        try:
            raw = await asyncio.wait_for(page.receive(), timeout)
        except TimeoutError:
            return POLICY_VIOLATION, f"no start message within {timeout:g} s"
        try:
            start = parse_start(raw, self.settings)
        except StartError as exc:
            await send_json(page, error_event(CallEnd(grpc.StatusCode.INVALID_ARGUMENT, str(exc))))
            return NORMAL_CLOSURE, ""
        if refusal := self.session_refusal():
            await send_json(page, error_event(CallEnd(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)))
        else:
            await self._bridged(page, start)
        return NORMAL_CLOSURE, ""

    def session_refusal(self) -> str:
        """Why a new conversation may not begin now ("" if it may)."""
        limit = self.settings.max_sessions
        if self.draining:
            return "the web service is draining"
        if limit and self.active_sessions >= limit:
            return f"the web service is at its limit of {limit} conversations"
        return ""

    async def _bridged(self, page: StarletteSocket, start: Start) -> None:
        async with self.counted():
            await self.bridge.run(page, start)

    @contextlib.asynccontextmanager
    async def counted(self) -> AsyncIterator[None]:
        """One open conversation, against `max_sessions`, while inside."""
        self.active_sessions += 1
        self._gauge.set(self.active_sessions)
        self.idle.clear()
        try:
            yield
        finally:
            self.active_sessions -= 1
            self._gauge.set(self.active_sessions)
            if not self.active_sessions:
                self.idle.set()


async def no_icon(_request: Request) -> Response:
    """The page has no icon: an empty answer instead of a 404 in the browser's console."""
    return Response(status_code=204)


class WebServer(HttpServer):
    def __init__(self, web: WebApp) -> None:
        super().__init__(web.app, web.settings, "web")
        # Realtime clients may send what OpenAI takes (an append of up to 15 MiB):
        # one too long for us is then the protocol's error, not a closed socket.
        self.config.ws_max_size = MAX_MESSAGE_BYTES
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
