"""What every session of one gateway shares: gRPC channels to the upstream
services, the Redis session store and the capacity registry's reads."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc
import redis.asyncio as redis
from redis.exceptions import RedisError

from kame_common import store, tracing
from kame_common.store import CapacityRegistry, Replica, SessionStore
from services.gateway.config import GatewaySettings

log = logging.getLogger(__name__)

REGISTRY_TIMEOUT_S = 1.0
REGISTRY_BACKOFF_S = 30.0
T = TypeVar("T")


class RegistryReads:
    """Reads of the capacity registry, which give up together: after one failed
    (Redis down or hung), every read skips the registry for REGISTRY_BACKOFF_S, so
    a broken Redis delays one call set-up per interval by at most
    REGISTRY_TIMEOUT_S, not every call, and not once per service it asks about."""

    def __init__(self) -> None:
        self._skip_until = 0.0  # monotonic

    async def read(self, what: str, read: Coroutine[Any, Any, T]) -> T | None:
        """`read`'s result; None when it failed or the registry is being skipped."""
        if time.monotonic() < self._skip_until:
            read.close()
            return None
        try:
            return await asyncio.wait_for(read, REGISTRY_TIMEOUT_S)
        except (TimeoutError, RedisError, OSError) as exc:
            if time.monotonic() >= self._skip_until:
                log.warning(
                    "capacity registry unavailable reading %s (%s); skipping it for %g s",
                    what,
                    exc or type(exc).__name__,
                    REGISTRY_BACKOFF_S,
                )
                self._skip_until = time.monotonic() + REGISTRY_BACKOFF_S
            return None


class Connections:
    def __init__(self, settings: GatewaySettings, redis_client: redis.Redis) -> None:
        self.settings = settings
        self.store = SessionStore(redis_client, ttl_s=settings.session_ttl_s)
        # With a secret, only records the frontends signed with it are believed:
        # the gateway never dials an address someone else wrote into Redis.
        self.registry = CapacityRegistry(redis_client, "frontend", secret=settings.registry_secret)
        self._tls = settings.upstream_tls()
        if self._tls.enabled:
            self._tls.credentials()  # a missing or unreadable file fails the start, not a call
        self._channel_options = settings.connection_policy().channel_options()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.registry_reads = RegistryReads()
        self._last_choice: Replica | None = None  # the registry's latest answer

    def channel(self, address: str) -> grpc.aio.Channel:
        """One shared channel per upstream address (gRPC multiplexes the sessions),
        plaintext, TLS or mTLS as the upstream_* settings say, with keepalive and
        round-robin over every address the name resolves to (kame_common.grpc_options):
        `dns:///stt:50053` on a headless Service reaches every stt pod."""
        if address not in self._channels:
            self._channels[address] = self._tls.channel(
                address,
                interceptors=tracing.client_interceptors(),
                options=self._channel_options,
            )
        return self._channels[address]

    async def frontend_candidates(self) -> list[Replica]:
        """The registry's replica with most free slots, then the configured address.
        While the registry is skipped (RegistryReads), sessions try the replica it
        last chose first, so they keep reaching the replicas it knew."""
        replicas = await self.registry_reads.read("frontend", self.registry.replicas())
        if replicas is not None:
            self._last_choice = store.choose(replicas)
        chosen = self._last_choice
        candidates = [chosen] if chosen is not None else []
        fallback = self.settings.frontend_address
        if all(replica.address != fallback for replica in candidates):
            candidates.append(Replica(replica_id="", address=fallback, free_slots=0, total_slots=0))
        return candidates

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
