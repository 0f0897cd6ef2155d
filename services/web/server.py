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
- one admission rule for every route (admission.py, applied by the bridge):
  at most `max_waiting_per_address` sockets without a call per client address
  (more are refused before the handshake, 403); a socket without a call is
  closed (1008) `start_timeout_s` after its handshake (the page's start
  message, GPT-Live's session.start, Realtime's first event that needs a
  call must come by then); a socket counts against `max_sessions` only once
  its call opens, so sockets without a token lock nobody out; a Moshi
  socket's call opens at once, and it is closed (1008) if it sends no audio
  within `start_timeout_s` of the handshake.
Every response carries a Content-Security-Policy that lets the page load only
its own files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
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
from services.web import socket_limits
from services.web.admission import Admission, Ticket, client_address
from services.web.bridge import Bridge, ClientSocket
from services.web.config import WebSettings
from services.web.protocols.adapter import Close
from services.web.protocols.live import LiveSession
from services.web.protocols.live_adapter import LiveAdapter
from services.web.protocols.moshi import MoshiSession
from services.web.protocols.moshi import refusal as refusal_message
from services.web.protocols.page import PageSession, StartError, error_event, parse_start
from services.web.protocols.realtime import RealtimeSession, lone_error
from services.web.protocols.realtime_adapter import RealtimeAdapter
from services.web.protocols.realtime_config import ClientError
from services.web.socket_limits import MessageLimits

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# The largest WebSocket message each route takes (socket_limits.py; more closes
# the socket, 1009, before it is read). A Realtime or GPT-Live append of 60 s
# (realtime.MAX_APPEND_S) of PCM16 at 24 kHz is 3.84 MB of base64: 5 MiB lets
# a somewhat longer one reach the session and get the protocol's error
# (audio_too_long), the socket open. The page sends its microphone in small
# binary chunks and a start message; Moshi's limit lets its own refusal of an
# audio message over moshi.MAX_AUDIO_MESSAGE_BYTES (64 KiB) be told.
APPEND_MESSAGE_BYTES = 5 << 20
ROUTE_MESSAGE_BYTES = {
    "/v1/realtime": APPEND_MESSAGE_BYTES,
    "/v1/live/sessions": APPEND_MESSAGE_BYTES,
    "/converse": 256 << 10,
    "/api/chat": 128 << 10,
}
MAX_MESSAGE_BYTES = max(ROUTE_MESSAGE_BYTES.values())
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
        gauge = ACTIVE_SESSIONS.labels(service="web")
        self.admission = Admission(
            settings.max_sessions, settings.max_waiting_per_address, gauge.set
        )
        self.bridge = Bridge(settings, self.admission)
        self.hosts = settings.hosts
        self.proxies = settings.proxies
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
        if self.admission.draining:
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
        begin: Callable[[WebSocket, StarletteSocket, Ticket], Awaitable[Close]],
        api: bool = False,
    ) -> None:
        """A socket of `protocol` if it may be opened (else closed before it is
        accepted: a browser gets 403), its session begun, and closed as it ends."""
        refusal = self.socket_refusal(websocket, api)
        ticket = None if refusal else self.admission.arrive(self.client_address(websocket))
        if ticket is None:
            refusal = refusal or "too many sockets without a call from this address"
            log.info("%s websocket refused: %s", protocol, refusal)
            await websocket.close(code=POLICY_VIOLATION, reason=refusal)
            return
        try:
            await websocket.accept()
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client went away
                close = await begin(websocket, StarletteSocket(websocket), ticket)
                await websocket.close(code=close.code, reason=close.short_reason)
        finally:
            self.admission.leave(ticket)

    def client_address(self, websocket: WebSocket) -> str:
        """The client's address: the peer's, or X-Forwarded-For's behind a trusted proxy."""
        peer = websocket.client.host if websocket.client else ""
        return client_address(peer, websocket.headers.get("x-forwarded-for"), self.proxies)

    def start_left_s(self, ticket: Ticket) -> float:
        """What remains of `start_timeout_s` for the socket of `ticket`."""
        elapsed = asyncio.get_running_loop().time() - ticket.opened_at
        return max(0.0, self.settings.start_timeout_s - elapsed)

    def _token(self, websocket: WebSocket) -> str:
        """The caller's bearer token, or the one the web service relays."""
        token = bearer_token(websocket.headers.get("authorization"))
        return token or self.settings.relayed_token

    async def _page(self, _websocket: WebSocket, page: StarletteSocket, ticket: Ticket) -> Close:
        """The page's start message, then its conversation. A socket that never
        starts holds no session."""
        timeout = self.settings.start_timeout_s
        try:
            raw = await asyncio.wait_for(page.receive(), self.start_left_s(ticket))
        except TimeoutError:
            return Close(POLICY_VIOLATION, f"no start message within {timeout:g} s")
        try:
            start = parse_start(raw, self.settings)
        except StartError as exc:
            refused = CallEnd(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            await page.send_text(json.dumps(error_event(refused)))
            return Close()
        return await self.bridge.run(
            page, PageSession(start, self.settings.realtime_idle_timeout_s), start.token, ticket
        )

    async def _realtime(
        self, websocket: WebSocket, socket: StarletteSocket, ticket: Ticket
    ) -> Close:
        """A Realtime session with the model the query names (an error, and no
        session, for a model the web service does not offer)."""
        settings = self.settings
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
        return await self.bridge.run(socket, adapter, self._token(websocket), ticket)

    async def _live(self, websocket: WebSocket, socket: StarletteSocket, ticket: Ticket) -> Close:
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
            async with asyncio.timeout(self.start_left_s(ticket)):
                while (first := await socket.receive()) is not None and not is_live_start(first):
                    for message in adapter.on_client(first).send:
                        await socket.send_text(str(message))
        except TimeoutError:
            reason = f"no session.start within {settings.start_timeout_s:g} s"
            await socket.send_text(json.dumps(lone_error("session_start_timeout", reason)))
            return Close(POLICY_VIOLATION, reason)
        if first is None:
            return Close()  # the client went away
        token = self._token(websocket)
        return await self.bridge.run(Replayed(socket, first), adapter, token, ticket)

    async def _moshi(self, websocket: WebSocket, socket: StarletteSocket, ticket: Ticket) -> Close:
        """A Moshi chat in the mode the query names (closed at once, the client
        told why, for a mode the web service does not offer)."""
        try:
            chat = MoshiSession.for_query(websocket.query_params, self.settings)
        except ClientError as exc:
            close = Close(POLICY_VIOLATION, exc.message)
            await socket.send_bytes(refusal_message(close))
            return close
        return await self.bridge.run(socket, chat, self._token(websocket), ticket)


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
        super().__init__(MessageLimits(web.app, ROUTE_MESSAGE_BYTES), web.settings, "web")
        self.config.ws = socket_limits.WS_PROTOCOL  # the one whose limits it sets
        self.config.ws_max_size = MAX_MESSAGE_BYTES
        # No permessage-deflate: a message's size is then its frame header's, refused
        # before a byte is buffered; inflating one costs up to its limit first (16
        # sockets of compressed 15 MiB took the process past the chart's 256 Mi), and
        # the audio these routes carry hardly compresses anyway.
        self.config.ws_per_message_deflate = False
        self.web = web

    async def stop(self, grace_s: float = 0.0) -> None:
        """Health 503 and no new conversations; open ones get up to `grace_s` to end."""
        self.web.admission.draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.web.admission.idle.wait(), grace_s)
        await self.shut_down()

    async def serve_until_stopped(self) -> None:
        await until_signal()
        await self.stop(self.web.settings.grace_s)


async def serve(settings: WebSettings) -> WebServer:
    """Start the web service; stop it with `await server.stop()`."""
    tracing.setup_tracing("web", settings.otlp_endpoint, settings.otlp_ca_file)
    settings.check_gateway_ca()
    socket_limits.check_private_names()
    server = WebServer(WebApp(settings))
    await server.start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(WebSettings, serve, argv)
