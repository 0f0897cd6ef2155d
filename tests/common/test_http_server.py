"""The HTTP services' uvicorn (kame_common/http_server.py, which web and telephony
serve on): its access log lines keep a query parameter's name and drop its
value, for requests and for WebSocket handshakes, since clients put what
callers type there (a Moshi client's `?text_prompt=`, an `?email=`). A real
uvicorn on loopback, a real HTTP request and a real WebSocket client."""

from __future__ import annotations

import asyncio
import logging
import urllib.request

import websockets
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from kame_common.http_server import ACCESS_LOGGERS, HttpServer
from kame_common.redact import redact_query
from services.telephony.config import TelephonySettings

PRIVATE = {"email": "alice@example.com", "text_prompt": "my PIN is 4711"}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def hello(_request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def client_host(request) -> PlainTextResponse:
    return PlainTextResponse(request.client.host if request.client else "")


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text("hi")
    await websocket.close()


async def test_access_log_lines_keep_query_names_not_values():
    app = Starlette(routes=[Route("/hello", hello), WebSocketRoute("/chat", echo)])
    server = HttpServer(app, TelephonySettings(host="127.0.0.1", port=0, metrics_port=0), "test")
    lines = Lines()
    for name in ACCESS_LOGGERS:
        logging.getLogger(name).addHandler(lines)
    await server.start()
    try:
        query = "email=alice%40example.com&text_prompt=my+PIN+is+4711"
        url = f"http://127.0.0.1:{server.port}"
        with await asyncio.to_thread(urllib.request.urlopen, f"{url}/hello?{query}") as answer:
            assert answer.read() == b"hello"
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/chat?{query}") as socket:
            assert await socket.recv() == "hi"
    finally:
        await server.shut_down()
        for name in ACCESS_LOGGERS:
            logging.getLogger(name).removeHandler(lines)
    logged = "\n".join(lines.lines)
    assert '"GET /hello?email=<redacted>&text_prompt=<redacted> HTTP/1.1" 200' in logged, logged
    assert '"WebSocket /chat?email=<redacted>&text_prompt=<redacted>" [accepted]' in logged
    for value in ("alice", "4711", "PIN"):
        assert value not in logged


def test_what_does_not_look_like_a_name_goes_too():
    assert redact_query("/x?4711&model=kame-tandem") == "/x?<redacted>=<redacted>&model=<redacted>"
    assert redact_query("/x?") == "/x?<redacted>=<redacted>"
    assert redact_query("/x") == "/x"


async def test_a_forwarded_for_header_does_not_change_who_the_client_is():
    """uvicorn believes X-Forwarded-For from 127.0.0.1 by default, so any local
    client could name itself another address in the logs and to admission. The
    web service reads it only from its `trusted_proxies` (services/web/admission.py);
    every other HTTP ingress (telephony's webhooks) sees the socket's peer."""
    app = Starlette(routes=[Route("/whoami", client_host)])
    server = HttpServer(app, TelephonySettings(host="127.0.0.1", port=0, metrics_port=0), "test")
    await server.start()
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/whoami", headers={"X-Forwarded-For": "203.0.113.9"}
        )
        with await asyncio.to_thread(urllib.request.urlopen, request) as answer:
            assert answer.read() == b"127.0.0.1"
    finally:
        await server.shut_down()
