"""uvicorn for the stack's HTTP services (web, telephony): on a socket we bind
(port 0 works), TLS from the service's settings, /metrics beside it, no
signal handling of its own (the process's main handles signals, and a server
started inside a test leaves the test's alone), and access log lines without
query values (kame_common/redact.py: they carry what callers type)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

from kame_common.config import ServiceSettings
from kame_common.metrics import describe_service, start_metrics_server
from kame_common.redact import QueryValuesOut

log = logging.getLogger(__name__)
# uvicorn's loggers of requests ("uvicorn.access") and WebSocket handshakes ("uvicorn.error").
ACCESS_LOGGERS = ("uvicorn.access", "uvicorn.error")
QUERY_VALUES_OUT = QueryValuesOut()  # one instance: adding it again changes nothing


class HttpServer(uvicorn.Server):
    def __init__(self, app: ASGIApp, settings: ServiceSettings, name: str) -> None:
        super().__init__(
            uvicorn.Config(
                app,
                ssl_certfile=settings.tls_cert_file or None,
                ssl_keyfile=settings.tls_key_file or None,
                log_level="info",
                ws_max_size=1 << 20,
                lifespan="off",
                # Who the client is stays the socket's peer: uvicorn's rewrite would
                # believe any X-Forwarded-For from 127.0.0.1, a local client's too. The
                # web service reads it only from its trusted_proxies (admission.py).
                proxy_headers=False,
            )
        )
        self.name = name
        self.settings = settings
        for logger in ACCESS_LOGGERS:  # after Config, which configures uvicorn's logging
            logging.getLogger(logger).addFilter(QUERY_VALUES_OUT)
        self.socket = socket.create_server((settings.host, settings.port))
        self.port: int = self.socket.getsockname()[1]
        self._task: asyncio.Task[None] | None = None
        self._metrics = start_metrics_server(settings.metrics_port)
        describe_service(name, settings.max_sessions)

    @property
    def url(self) -> str:
        scheme = "https" if self.settings.tls_cert_file else "http"
        return f"{scheme}://{self.settings.host}:{self.port}/"

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self.serve(sockets=[self.socket]))
        while not self.started:
            if self._task.done():
                await self._task  # it failed to start: raise why
                raise RuntimeError(f"{self.name}: the HTTP server stopped before it started")
            await asyncio.sleep(0.02)
        log.info("%s listening on %s", self.name, self.url)

    async def shut_down(self) -> None:
        """Stop serving HTTP and /metrics."""
        self.should_exit = True
        if self._task is not None:
            await self._task
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.shutdown)
