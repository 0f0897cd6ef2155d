"""Whether the gateway can serve a call end to end, and what it says while it cannot.

A gateway that listens is not yet ready: right after `kame up` (or a rollout)
stt may still be loading Whisper and the oracle warming its LLM's prompt, and a
call admitted then loses the caller's first words and gets no answer. So the
gateway watches its upstreams' own gRPC health (each reports SERVING only once
warmed up: kame_common.server) and is ready only while stt, the oracle and at
least one frontend candidate answer SERVING.

While it is not ready, its health service says NOT_SERVING (probes, load
balancers and `kame up` wait), and a call that arrives anyway is refused with
UNAVAILABLE, a message naming what is not ready, and the `retry-after-s`
trailing metadata that the ingresses turn into their own protocol's retry
hint (SIP 503 Retry-After, a message on the web page).

The watch goes on after the first success: an upstream that stops serving
makes new calls wait for it again, while calls already open ride it out
(side streams reopen and replay: sidestream.py, session.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import Gauge

from services.gateway.connections import Connections
from services.gateway.plan import SessionError

log = logging.getLogger(__name__)

UPSTREAM_READY = Gauge(
    "kame_gateway_upstream_ready",
    "1 while the upstream answers its health check SERVING (frontend: any candidate)",
    ["service"],
)

UPSTREAMS = ("frontend", "stt", "oracle")
SERVING = health_pb2.HealthCheckResponse.SERVING


class Readiness:
    """Polls the upstreams' health every `interval_s` until stopped."""

    def __init__(
        self,
        connections: Connections,
        interval_s: float,
        on_change: Callable[[bool], Awaitable[None]],
    ) -> None:
        self.connections = connections
        self.interval_s = interval_s
        self._on_change = on_change
        self.serving: dict[str, bool] = dict.fromkeys(UPSTREAMS, False)
        self._task: asyncio.Task[None] | None = None
        self._checked_once = False
        self._ever_ready = False  # until then the stack is starting, not failing

    @property
    def ready(self) -> bool:
        return all(self.serving.values())

    def not_ready(self, services: Iterable[str] = UPSTREAMS) -> list[str]:
        """Which of `services` do not answer SERVING now."""
        return [name for name in services if not self.serving[name]]

    def refusal(self, services: Iterable[str]) -> SessionError | None:
        """The error a new call needing `services` gets now; None when they all serve."""
        missing = self.not_ready(services)
        if not missing:
            return None
        what = "the stack is not ready" if self._ever_ready else "the stack is starting"
        retry_after_s = max(1, math.ceil(self.interval_s * 2))
        return SessionError(
            grpc.StatusCode.UNAVAILABLE,
            f"{what}: {', '.join(missing)} not serving yet; try again in {retry_after_s} s",
            retry_after_s=retry_after_s,
        )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._watch_forever(), name="upstream-readiness"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def check(self) -> bool:
        """One round of health checks; returns whether the gateway is ready."""
        was_ready = self.ready
        frontends = [r.address for r in await self.connections.frontend_candidates()]
        results = await asyncio.gather(
            self._any_serving(frontends),
            self._serving(self.connections.settings.stt_address),
            self._serving(self.connections.settings.oracle_address),
        )
        for name, serving in zip(UPSTREAMS, results, strict=True):
            if serving != self.serving[name] or not self._checked_once:
                UPSTREAM_READY.labels(name).set(1 if serving else 0)
                if serving != self.serving[name]:
                    log.info("gateway: %s %s", name, "serving" if serving else "NOT serving")
            self.serving[name] = serving
        self._ever_ready = self._ever_ready or self.ready
        if self.ready != was_ready or not self._checked_once:
            self._checked_once = True
            await self._on_change(self.ready)
        return self.ready

    async def _watch_forever(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:  # a bug here must not stop the watch (or the gateway)
                log.exception("gateway: readiness check failed")
            await asyncio.sleep(self.interval_s)

    async def _any_serving(self, addresses: list[str]) -> bool:
        results = await asyncio.gather(*(self._serving(a) for a in addresses))
        return any(results)

    async def _serving(self, address: str) -> bool:
        stub = health_pb2_grpc.HealthStub(self.connections.health_channels.get(address))
        # As long as a connection may take: a check shorter than that fails on a
        # busy host while the upstream serves, and refuses calls it could take.
        timeout_s = max(self.interval_s, self.connections.settings.connect_timeout_s)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == SERVING)
