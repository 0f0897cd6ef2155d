"""gRPC server bootstrap shared by every service.

`ServiceRuntime` owns the aio server, the standard health service, reflection,
session admission (max sessions -> RESOURCE_EXHAUSTED, draining ->
UNAVAILABLE) and graceful drain: on SIGTERM/SIGINT every health status turns
NOT_SERVING, new sessions are refused, and open sessions get up to
`grace_s` seconds to finish before the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Gauge

from kame_common import tracing
from kame_common.config import ConfigError

log = logging.getLogger(__name__)
ConfigT = TypeVar("ConfigT")

ACTIVE_SESSIONS = Gauge("kame_active_sessions", "Open sessions on this replica", ["service"])

# Large enough for a few seconds of raw audio in one message; anything bigger
# is refused by gRPC with RESOURCE_EXHAUSTED before it reaches our code.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class ServiceRuntime:
    def __init__(
        self,
        service_name: str,
        full_service_names: Iterable[str],
        host: str = "127.0.0.1",
        port: int = 0,
        max_sessions: int = 0,
        grace_s: float = 30.0,
    ) -> None:
        self.service_name = service_name
        self.full_service_names = list(full_service_names)
        self.host = host
        self.port = port
        self.max_sessions = max_sessions
        self.grace_s = grace_s
        self.active_sessions = 0
        self.draining = False
        self._sessions_idle = asyncio.Event()
        self._sessions_idle.set()
        self._stopped = asyncio.Event()
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(
            interceptors=tracing.server_interceptors(),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._gauge = ACTIVE_SESSIONS.labels(service=service_name)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self, add_servicers: Callable[[grpc.aio.Server], None]) -> None:
        """Register servicers, bind the port (0 picks a free one) and start serving."""
        add_servicers(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.full_service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self.port = self.server.add_insecure_port(f"{self.host}:{self.port}")
        if self.port == 0:
            raise RuntimeError(f"{self.service_name}: could not bind {self.host}")
        await self.server.start()
        await self._set_all(health_pb2.HealthCheckResponse.SERVING)
        log.info("%s listening on %s", self.service_name, self.address)

    async def _set_all(self, status: int) -> None:
        for name in ["", *self.full_service_names]:
            await self.health.set(name, status)

    @contextlib.asynccontextmanager
    async def session(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Admit one session for the duration of the block, or abort the RPC."""
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.service_name} is draining")
        if self.max_sessions and self.active_sessions >= self.max_sessions:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.service_name} is at its limit of {self.max_sessions} sessions",
            )
        self.active_sessions += 1
        self._gauge.set(self.active_sessions)
        self._sessions_idle.clear()
        try:
            yield
        finally:
            self.active_sessions -= 1
            self._gauge.set(self.active_sessions)
            if self.active_sessions == 0:
                self._sessions_idle.set()

    async def drain(self) -> None:
        """NOT_SERVING, refuse new sessions, wait for open ones (up to grace_s), stop."""
        if self.draining:
            return
        self.draining = True
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        log.info("%s draining: %d open sessions", self.service_name, self.active_sessions)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._sessions_idle.wait(), self.grace_s)
        await self.server.stop(grace=1.0)
        self._stopped.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.drain()))

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """Stop at once (tests and error paths)."""
        self.draining = True
        await self.server.stop(grace=0)
        self._stopped.set()


async def run_until_stopped(runtime: ServiceRuntime) -> None:
    """The main loop of a service process: serve until SIGTERM/SIGINT has drained it."""
    runtime.install_signal_handlers()
    await runtime.wait_stopped()


def service_main(
    name: str,
    load: Callable[[Sequence[str]], ConfigT],
    run: Callable[[ConfigT], Awaitable[None]],
    argv: Sequence[str] | None = None,
) -> int:
    """The process entry point of a service: logging, then its config from flags
    and environment (a bad setting exits 2 with a message naming it), then `run`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = load(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    asyncio.run(run(config))
    return 0
