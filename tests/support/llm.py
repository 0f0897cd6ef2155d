"""The one fake LLM of the tests: an HTTP/1.1 server on loopback that plays
scripted handlers per route (OpenAI's and Anthropic's wire formats, stalls,
dropped connections, rejected keys: what the real llama.cpp server cannot be
made to show), and records every request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


class Responder:
    """Writes one HTTP/1.1 response; the connection closes after it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await self.writer.drain()

    async def start_sse(self) -> None:
        self.writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n"
        )
        await self.writer.drain()

    async def sse(self, data: dict | str, event: str = "") -> None:
        payload = data if isinstance(data, str) else json.dumps(data)
        self.writer.write(
            (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()
        )
        await self.writer.drain()

    async def openai_chat(self, chunks: list[str]) -> None:
        """A well-formed OpenAI chat-completions stream of `chunks`."""
        await self.start_sse()
        for chunk in chunks:
            await self.sse(
                {
                    "id": "chatcmpl-stub",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "stub-model",
                    "choices": [{"index": 0, "delta": {"content": chunk}, "finish_reason": None}],
                }
            )
        await self.sse("[DONE]")


Handler = Callable[[HttpRequest, Responder], Awaitable[None]]


async def _models(_request: HttpRequest, respond: Responder) -> None:
    await respond.json(
        200,
        {
            "object": "list",
            "data": [{"id": "stub-model", "object": "model", "created": 0, "owned_by": "test"}],
        },
    )


async def _not_found(_request: HttpRequest, respond: Responder) -> None:
    await respond.json(404, {"error": {"message": "not found", "type": "not_found_error"}})


@dataclass
class StubHttpServer:
    """HTTP/1.1 on loopback: each request goes to routes[(method, path)] (404 otherwise;
    GET /v1/models lists one model unless routed); `requests` records what arrived."""

    routes: dict[tuple[str, str], Handler]
    requests: list[HttpRequest] = field(default_factory=list)
    url: str = ""
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task] = field(default_factory=set)

    async def start(self, port: int = 0) -> str:
        self.routes = {("GET", "/v1/models"): _models, **self.routes}
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.url

    def posts(self) -> list[HttpRequest]:
        return [r for r in self.requests if r.method == "POST"]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path, _version = head[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip()
                for k, v in (line.split(":", 1) for line in head[1:] if line)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            request = HttpRequest(method, path.split("?")[0], headers, body)
            self.requests.append(request)
            await self.routes.get((method, request.path), _not_found)(request, Responder(writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._handlers.discard(task)

    async def close(self) -> None:
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
