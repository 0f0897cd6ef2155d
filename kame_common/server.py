"""The one start-up and shutdown path of every service.

`ServiceRuntime` owns the aio server (TLS or mTLS when the settings give a
certificate; keepalive and connection age from kame_common.grpc_options),
the standard health service (also on a plaintext health-only port for probes,
when `health_port` is set), reflection (unless switched off), the /metrics
endpoint, tracing, session admission (max sessions ->
RESOURCE_EXHAUSTED, draining -> UNAVAILABLE) and graceful drain: on
SIGTERM/SIGINT every health status turns NOT_SERVING, new sessions are
refused, and open sessions get up to `grace_s` seconds to finish before the
server stops.

A service's `serve(settings)` builds what it needs, registers how to undo it
(`on_drain`: before the server stops taking sessions, e.g. leave the capacity
registry; `on_close`: after the server stopped, last registered first, e.g.
release the models and the Redis client), starts the runtime and returns it.
`service_main(Settings, serve)` is every service's process entry point.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Gauge

from kame_common import tls, tracing
from kame_common.config import ConfigError, ServiceSettings, load_settings
from kame_common.metrics import describe_service, start_metrics_server

log = logging.getLogger(__name__)
SettingsT = TypeVar("SettingsT", bound=ServiceSettings)
Hook = Callable[[], Awaitable[None]]

ACTIVE_SESSIONS = Gauge("kame_active_sessions", "Open sessions on this replica", ["service"])

# The health service name for liveness probes: SERVING while the process works,
# whether or not it is ready for calls (a gateway whose upstreams are down is
# alive, and restarting it would only drop its calls).
LIVENESS = "liveness"

# Large enough for a few seconds of raw audio in one message; anything bigger
# is refused by gRPC with RESOURCE_EXHAUSTED before it reaches our code. (The
# gateway's client port takes less: see services/gateway/pacing.py.)
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# A close hook that has not finished in this long is left behind (its threads'
# stacks are written to stderr) so that the rest of the shutdown still runs.
CLOSE_HOOK_TIMEOUT_S = 15.0


class ServiceRuntime:
    def __init__(
        self,
        settings: ServiceSettings,
        grpc_services: Iterable[str],
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.settings = settings
        self.service_name = settings.SERVICE
        self.grpc_services = list(grpc_services)
        self.host = settings.host
        self.port = settings.port
        self.metrics_port = 0
        self.health_port = 0
        self._health_server: grpc.aio.Server | None = None
        self.active_sessions = 0
        self.draining = False
        self._sessions_idle = asyncio.Event()
        self._sessions_idle.set()
        self._stopped = asyncio.Event()
        self._drain_hooks: list[Hook] = []
        self._session_hooks: list[Callable[[int], None]] = []
        self._close_hooks = contextlib.AsyncExitStack()
        self._shutdown: asyncio.Future[None] | None = None
        self.health = health.aio.HealthServicer()
        self._connection_options = settings.connection_policy().server_options()
        self.server = grpc.aio.server(
            interceptors=tracing.server_interceptors(),
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
                *self._connection_options,
            ],
        )
        self._gauge = ACTIVE_SESSIONS.labels(service=self.service_name)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def on_drain(self, hook: Hook) -> None:
        """Run `hook` first when the service drains or stops (in registration order)."""
        self._drain_hooks.append(hook)

    def on_close(self, hook: Hook) -> None:
        """Run `hook` after the server stopped; hooks run last registered first,
        each for at most CLOSE_HOOK_TIMEOUT_S."""
        self._close_hooks.push_async_callback(self._close_within_bound, hook)

    async def _close_within_bound(self, hook: Hook) -> None:
        try:
            await asyncio.wait_for(hook(), CLOSE_HOOK_TIMEOUT_S)
        except TimeoutError:
            name = getattr(hook, "__qualname__", repr(hook))
            log.error(
                "%s: close hook %s did not finish in %g s; shutting down without it "
                "(every thread's stack follows on stderr)",
                self.service_name,
                name,
                CLOSE_HOOK_TIMEOUT_S,
            )
            with contextlib.suppress(OSError, ValueError):  # a stderr without a file descriptor
                faulthandler.dump_traceback(all_threads=True)

    def on_sessions_changed(self, hook: Callable[[int], None]) -> None:
        """Call `hook(open sessions)` whenever a session is admitted or ends."""
        self._session_hooks.append(hook)

    def _sessions_changed(self) -> None:
        self._gauge.set(self.active_sessions)
        for hook in self._session_hooks:
            hook(self.active_sessions)

    async def start(
        self, add_servicers: Callable[[grpc.aio.Server], None], serving: bool = True
    ) -> None:
        """Tracing, /metrics, servicers; bind the port (0 picks a free one) and serve.
        With `serving` False, health says NOT_SERVING until `set_serving(True)`: for a
        service that is ready only once others are (the gateway: readiness.py)."""
        settings = self.settings
        tracing.setup_tracing(self.service_name, settings.otlp_endpoint, settings.otlp_ca_file)
        metrics_server = start_metrics_server(settings.metrics_port)
        describe_service(self.service_name, settings.max_sessions)
        if metrics_server is not None:
            self.metrics_port = metrics_server.server_port
            self.on_close(lambda: asyncio.to_thread(metrics_server.shutdown))
        add_servicers(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        # The servicer starts out SERVING: nothing may say so before we do.
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        if settings.reflection:
            reflection.enable_server_reflection(
                [*self.grpc_services, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
            )
        self.port = self._bind(self.server, self.port, secure=True)
        if settings.health_port:
            self._health_server = grpc.aio.server(options=self._connection_options)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
            self.health_port = self._bind(self._health_server, settings.health_port, secure=False)
            await self._health_server.start()
        await self.server.start()
        await self.set_ready(serving)
        log.info("%s listening on %s (%s)", self.service_name, self.address, self.transport)

    @property
    def transport(self) -> str:
        """What the gRPC port speaks: plaintext, TLS or mTLS."""
        if self.settings.tls_client_ca_file:
            return "mTLS"
        return "TLS" if self.settings.tls_cert_file else "plaintext"

    def _bind(self, server: grpc.aio.Server, port: int, secure: bool) -> int:
        """Bind `server` to host:port, with the settings' TLS if `secure` and configured."""
        settings, address = self.settings, f"{self.host}:{port}"
        if secure and settings.tls_cert_file:
            credentials = tls.server_credentials(
                settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
            )
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
        if bound == 0:
            raise RuntimeError(f"{self.service_name}: could not bind {address}")
        return bound

    async def set_serving(self, serving: bool) -> None:
        """Whether the service works at all (the frontend's watchdog: a stalled engine
        is NOT_SERVING, for readiness and liveness alike; a draining service stays
        NOT_SERVING for readiness)."""
        status = health_pb2.HealthCheckResponse
        await self.health.set(LIVENESS, status.SERVING if serving else status.NOT_SERVING)
        await self.set_ready(serving)

    async def set_ready(self, ready: bool) -> None:
        """Whether the service takes calls now, for readiness probes and clients
        (a draining service stays NOT_SERVING); liveness is left as it is."""
        if ready and self.draining:
            return
        status = health_pb2.HealthCheckResponse
        await self._set_all(status.SERVING if ready else status.NOT_SERVING)

    async def _set_all(self, status: int) -> None:
        for name in ["", *self.grpc_services]:
            await self.health.set(name, status)

    @contextlib.asynccontextmanager
    async def session(self, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
        """Admit one session for the duration of the block, or abort the RPC."""
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.service_name} is draining")
        max_sessions = self.settings.max_sessions
        if max_sessions and self.active_sessions >= max_sessions:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.service_name} is at its limit of {max_sessions} sessions",
            )
        self.active_sessions += 1
        self._sessions_changed()
        self._sessions_idle.clear()
        try:
            yield
        finally:
            self.active_sessions -= 1
            self._sessions_changed()
            if self.active_sessions == 0:
                self._sessions_idle.set()

    async def drain(self) -> None:
        """NOT_SERVING, refuse new sessions, wait for open ones (up to grace_s), stop."""
        await self._shut_down(self.settings.grace_s)

    async def stop(self) -> None:
        """Stop at once (tests and error paths)."""
        await self._shut_down(None)

    async def _shut_down(self, grace_s: float | None) -> None:
        """The first caller decides how; later callers wait for the same shutdown."""
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._run_shutdown(grace_s))
        await asyncio.shield(self._shutdown)

    async def _run_shutdown(self, grace_s: float | None) -> None:
        self.draining = True
        for hook in self._drain_hooks:
            await hook()
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        if grace_s is not None:
            log.info("%s draining: %d open sessions", self.service_name, self.active_sessions)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._sessions_idle.wait(), grace_s)
        await self.server.stop(grace=1.0 if grace_s is not None else 0)
        if self._health_server is not None:  # probes saw NOT_SERVING until now
            await self._health_server.stop(0)
        await self._close_hooks.aclose()
        self._stopped.set()

    async def serve_until_stopped(self) -> None:
        """The main loop of a service process: serve until SIGTERM/SIGINT has drained it."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.drain()))
        await self._stopped.wait()


class Servable(Protocol):
    """A started service: a gRPC ServiceRuntime, or an HTTP service (web, telephony)."""

    async def serve_until_stopped(self) -> None: ...


async def until_signal() -> None:
    """Wait for SIGTERM or SIGINT (the process's main loop)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()


def service_main(
    settings_class: type[SettingsT],
    serve: Callable[[SettingsT], Awaitable[Servable]],
    argv: Sequence[str] | None = None,
) -> int:
    """The process entry point of a service: logging, then its settings from flags
    and environment (a bad setting exits 2 with a message naming it), then
    `serve` until SIGTERM/SIGINT has drained it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings(settings_class, sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"{settings_class.SERVICE}: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        runtime = await serve(settings)
        await runtime.serve_until_stopped()

    try:
        asyncio.run(run())
    except ConfigError as exc:  # found at start: an unreadable certificate, say
        print(f"{settings_class.SERVICE}: {exc}", file=sys.stderr)
        return 2
    return 0
