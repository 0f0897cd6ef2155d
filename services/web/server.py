"""The web service's HTTP glue: Starlette routes served by uvicorn.

- GET /            the page (static/index.html) and GET /static/* its modules
- GET /config.json what the page may offer: modes and LLM models (the settings)
- GET /healthz     200 while serving, 503 once draining (the probes' check)
- WS  /converse    the page's conversation (protocols/page.py)
- WS  /v1/realtime the OpenAI Realtime protocol (protocols/realtime*.py);
                   `?model=kame-<mode>`
- WS  /api/chat    the Moshi protocol (protocols/moshi.py)
- WS  /v1/live/sessions OpenAI's GPT-Live protocol (protocols/live*.py); the
                   model is session.start's
Each is a protocol adapter carried over Gateway.Converse by the one bridge
(bridge.py).

Who may talk through the bridge:
- a request whose Host is not one of `allowed_hosts` (the loopback names and
  the bind address by default) is refused with 403, GET /healthz excepted (the
  kubelet's probes name the pod's IP): a DNS-rebinding page on evil.example that
  resolves to 127.0.0.1 still says Host: evil.example;
- a WebSocket without an Origin, or from another origin than the page's own
  (or one of `allowed_origins`), is refused with 403, so a third-party site
  cannot talk through a visitor's browser;
- /v1/realtime, /v1/live/sessions and /api/chat are APIs for programs, which
  send no Origin:
  there the caller's bearer token (`Authorization: Bearer`, the gateway's to
  check; Moshi's clients send none) is the gate, and an Origin, when a browser
  sends one, must be allowed as above;
- a conversation counts against `max_sessions` only once its start message
  came; a socket that sends none within `start_timeout_s` is closed (1008);
  a Moshi socket counts from its opening (its call opens at once) and is
  closed (1008) if it sends no audio within `start_timeout_s` of the handshake;
  a GPT-Live socket counts from its session.start (events before it are the
  protocol's errors), which must come within `start_timeout_s`.
Every response carries a Content-Security-Policy that lets the page load only
its own files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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

from kame_client.status import CallEnd, CloseCode
from kame_common import tracing
from kame_common.http_server import HttpServer
from kame_common.server import ACTIVE_SESSIONS, service_main, until_signal
from kame_common.words import parse_phrases
from services.web.bridge import Bridge, ClientSocket
from services.web.config import WebSettings
from services.web.protocols.adapter import Adapter, Close
from services.web.protocols.live import LiveSession
from services.web.protocols.live_adapter import LiveAdapter
from services.web.protocols.moshi import MoshiSession
from services.web.protocols.moshi import refusal as refusal_message
from services.web.protocols.page import PageSession, StartError, error_event, parse_start
from services.web.protocols.realtime import RealtimeSession, lone_error
from services.web.protocols.realtime_adapter import RealtimeAdapter
from services.web.protocols.realtime_config import ClientError

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# The largest WebSocket message the web service takes: OpenAI takes 15 MiB, so a
# Realtime client's oversize append reaches the session and is refused there
# with the protocol's error, the socket open; beyond this the socket closes (1009).
MAX_MESSAGE_BYTES = 16 << 20
POLICY_VIOLATION = CloseCode.POLICY_VIOLATION


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header ("" if none)."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class Replayed:
    """A socket whose first message was read already: it is received again first."""

    def __init__(self, socket: ClientSocket, first: str | bytes) -> None:
        self.socket = socket
        self.first: str | bytes | None = first

    async def receive(self) -> str | bytes | None:
        first, self.first = self.first, None
        return first if first is not None else await self.socket.receive()

    async def send_text(self, text: str) -> None:
        await self.socket.send_text(text)

    async def send_bytes(self, data: bytes) -> None:
        await self.socket.send_bytes(data)


class StarletteSocket:
    """A Starlette WebSocket as the bridge's ClientSocket."""

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
                WebSocketRoute("/v1/live/sessions", self.live),
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
        """The page's conversation (protocols/page.py)."""
        await self._serve(websocket, "page", self._page)

    async def realtime(self, websocket: WebSocket) -> None:
        """An OpenAI Realtime session (protocols/realtime_adapter.py)."""
        await self._serve(websocket, "realtime", self._realtime, api=True)

    async def live(self, websocket: WebSocket) -> None:
        """An OpenAI GPT-Live session (protocols/live_adapter.py)."""
        await self._serve(websocket, "live", self._live, api=True)

    async def moshi_chat(self, websocket: WebSocket) -> None:
        """A Moshi-protocol chat (protocols/moshi.py)."""
        await self._serve(websocket, "moshi", self._moshi, api=True)

    def socket_refusal(self, websocket: WebSocket, api: bool = False) -> str:
        """Why `websocket` may not be opened ("" if it may)."""
        if not self.host_allowed(websocket.headers.get("host")):
            return "host not allowed"
        return origin_refusal(websocket, self.settings.origins, api)

    async def _serve(
        self,
        websocket: WebSocket,
        protocol: str,
        begin: Callable[[WebSocket, StarletteSocket], Awaitable[Close]],
        api: bool = False,
    ) -> None:
        """A socket of `protocol` if it may be opened (else closed before it is
        accepted: a browser gets 403), its session begun, and closed as it ends."""
        refusal = self.socket_refusal(websocket, api)
        if refusal:
            log.info("%s websocket refused: %s", protocol, refusal)
            await websocket.close(code=POLICY_VIOLATION, reason=refusal)
            return
        await websocket.accept()
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client went away
            close = await begin(websocket, StarletteSocket(websocket))
            await websocket.close(code=close.code, reason=close.short_reason)

    def _token(self, websocket: WebSocket) -> str:
        """The caller's bearer token, or the one the web service relays."""
        token = bearer_token(websocket.headers.get("authorization"))
        return token or self.settings.relayed_token

    async def _page(self, _websocket: WebSocket, page: StarletteSocket) -> Close:
        """The page's start message, then its conversation. A socket that never
        starts holds no session."""
        timeout = self.settings.start_timeout_s
        try:
            raw = await asyncio.wait_for(page.receive(), timeout)
        except TimeoutError:
            return Close(POLICY_VIOLATION, f"no start message within {timeout:g} s")
        try:
            start = parse_start(raw, self.settings)
        except StartError as exc:
            refused = CallEnd(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            await page.send_text(json.dumps(error_event(refused)))
            return Close()
        if refusal := self.session_refusal():
            busy = CallEnd(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
            await page.send_text(json.dumps(error_event(busy)))
            return Close()
        return await self._session(page, PageSession(start), start.token)

    async def _realtime(self, websocket: WebSocket, socket: StarletteSocket) -> Close:
        """A Realtime session with the model the query names (an error, and no
        session, for a model the web service does not offer)."""
        settings = self.settings
        if refusal := self.session_refusal():
            await socket.send_text(json.dumps(lone_error("server_busy", refusal, "server_error")))
            return Close()
        try:
            session = RealtimeSession(
                websocket.query_params.get("model", ""),
                settings.mode_choices,
                settings.realtime_relay_instructions,
                parse_phrases(settings.backchannel_phrases),
            )
        except ClientError as exc:
            await socket.send_text(json.dumps(lone_error(exc.code, exc.message)))
            return Close()
        adapter = RealtimeAdapter(session, settings.realtime_idle_timeout_s)
        return await self._session(socket, adapter, self._token(websocket))

    async def _live(self, websocket: WebSocket, socket: StarletteSocket) -> Close:
        """A GPT-Live session, counted from its session.start: what comes before
        it gets the protocol's error; none within start_timeout_s closes the socket."""
        settings = self.settings
        session = LiveSession(
            settings.mode_choices,
            settings.llm_choices,
            delegation_timeout_s=settings.live_delegation_timeout_s,
        )
        adapter = LiveAdapter(session, settings.realtime_idle_timeout_s)
        try:
            async with asyncio.timeout(settings.start_timeout_s):
                while (first := await socket.receive()) is not None and not is_live_start(first):
                    for message in adapter.on_client(first).send:
                        await socket.send_text(str(message))
        except TimeoutError:
            reason = f"no session.start within {settings.start_timeout_s:g} s"
            await socket.send_text(json.dumps(lone_error("session_start_timeout", reason)))
            return Close(POLICY_VIOLATION, reason)
        if first is None:
            return Close()  # the client went away
        if refusal := self.session_refusal():
            await socket.send_text(json.dumps(lone_error("server_busy", refusal, "server_error")))
            return Close(CloseCode.TRY_AGAIN_LATER, refusal)
        return await self._session(Replayed(socket, first), adapter, self._token(websocket))

    async def _moshi(self, websocket: WebSocket, socket: StarletteSocket) -> Close:
        """A Moshi chat in the mode the query names (closed at once, the client
        told why, for a mode the web service does not offer or a full service)."""
        if refusal := self.session_refusal():
            close = Close(CloseCode.TRY_AGAIN_LATER, refusal)
        else:
            try:
                chat = MoshiSession.for_query(websocket.query_params, self.settings)
            except ClientError as exc:
                close = Close(POLICY_VIOLATION, exc.message)
            else:
                return await self._session(socket, chat, self._token(websocket))
        await socket.send_bytes(refusal_message(close))
        return close

    def session_refusal(self) -> str:
        """Why a new conversation may not begin now ("" if it may)."""
        limit = self.settings.max_sessions
        if self.draining:
            return "the web service is draining"
        if limit and self.active_sessions >= limit:
            return f"the web service is at its limit of {limit} conversations"
        return ""

    async def _session(self, socket: ClientSocket, adapter: Adapter, token: str) -> Close:
        """One session, counted against `max_sessions` while it lasts."""
        async with self.counted():
            return await self.bridge.run(socket, adapter, token)

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


def is_live_start(message: str | bytes) -> bool:
    """Whether a GPT-Live client's message is its session.start."""
    try:
        event = json.loads(message)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(event, dict) and event.get("type") == "session.start"


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
