"""What every session of one gateway shares: gRPC channels to the upstream
services, the Redis session store and the capacity registry's reads."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
import redis.asyncio as redis
from redis.exceptions import RedisError

from kame_common import store, tracing
from kame_common.aio import abandon
from kame_common.store import CapacityRegistry, Replica, SessionStore
from kame_common.tls import RetiredChannels
from services.gateway.config import GatewaySettings

log = logging.getLogger(__name__)

REGISTRY_TIMEOUT_S = 1.0
REGISTRY_BACKOFF_S = 30.0
# A channel not asked for this long is retired: a frontend replica that left the
# registry (scaled down, rescheduled to another IP) is not dialled forever.
CHANNEL_IDLE_S = 600.0
# At most this many channels: the least recently asked is retired first.
MAX_CHANNELS = 256
T = TypeVar("T")


class RegistryReads:
    """Reads of the capacity registry, which give up together: after one failed
    (Redis down or hung), every read skips the registry for REGISTRY_BACKOFF_S, so
    a broken Redis delays one call set-up per interval by at most
    REGISTRY_TIMEOUT_S, not every call, and not once per service it asks about.

    A read still running at REGISTRY_TIMEOUT_S is cancelled but not waited for
    (kame_common.aio.abandon), and reads are skipped until it has ended: redis-py
    (8.1) can swallow a CancelledError that lands inside a command, so waiting for
    a cancelled read to end can wait forever, and the call set-up with it."""

    def __init__(self) -> None:
        self._skip_until = 0.0  # monotonic
        self._overdue: asyncio.Future[Any] | None = None  # a read left running

    async def read(self, what: str, read: Coroutine[Any, Any, T]) -> T | None:
        """`read`'s result; None when it failed or the registry is being skipped."""
        left_running = self._overdue is not None and not self._overdue.done()
        if left_running or time.monotonic() < self._skip_until:
            read.close()
            return None
        task = asyncio.ensure_future(read)
        try:
            await asyncio.wait([task], timeout=REGISTRY_TIMEOUT_S)
        finally:
            if not task.done():  # timed out, or the set-up itself was cancelled
                abandon(task)
                self._overdue = task
        if not task.done():
            self._skip(what, f"no answer in {REGISTRY_TIMEOUT_S:g} s")
            return None
        try:
            return task.result()
        except (RedisError, OSError) as exc:
            self._skip(what, str(exc) or type(exc).__name__)
            return None

    def _skip(self, what: str, reason: str) -> None:
        if time.monotonic() >= self._skip_until:
            log.warning(
                "capacity registry unavailable reading %s (%s); skipping it for %g s",
                what,
                reason,
                REGISTRY_BACKOFF_S,
            )
            self._skip_until = time.monotonic() + REGISTRY_BACKOFF_S


class ChannelCache:
    """One channel per address, made when first asked for. A channel not asked
    for in `idle_s`, or the least recently asked beyond `max_channels`, is
    retired: no new calls, closed when its calls end (RetiredChannels)."""

    def __init__(
        self,
        make: Callable[[str], grpc.aio.Channel],
        idle_s: float = CHANNEL_IDLE_S,
        max_channels: int = MAX_CHANNELS,
    ) -> None:
        self._make = make
        self._idle_s = idle_s
        self._max_channels = max_channels
        # address -> (channel, when last asked for, monotonic); least recently asked first
        self._channels: dict[str, tuple[grpc.aio.Channel, float]] = {}
        self.retired = RetiredChannels()

    def __len__(self) -> int:
        return len(self._channels)

    def get(self, address: str) -> grpc.aio.Channel:
        now = time.monotonic()
        entry = self._channels.pop(address, None)
        self._retire_unused(now)
        channel = entry[0] if entry is not None else self._make(address)
        self._channels[address] = (channel, now)
        return channel

    def _retire_unused(self, now: float) -> None:
        for address, (channel, asked_s) in list(self._channels.items()):
            if now - asked_s <= self._idle_s and len(self._channels) < self._max_channels:
                break  # the rest were asked for more recently
            del self._channels[address]
            log.info("channel to %s unused for %.0f s: retired", address, now - asked_s)
            self.retired.retire(channel)

    async def close(self) -> None:
        channels = [channel for channel, _ in self._channels.values()]
        self._channels.clear()
        await self.retired.close()
        for channel in channels:
            await channel.close()


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
        self.channels = ChannelCache(self._new_channel, CHANNEL_IDLE_S, MAX_CHANNELS)
        # Health checks (readiness.py) on channels of their own: on the calls' channels
        # they would take turns of the round robin, and skew where sessions land.
        self.health_channels = ChannelCache(self._new_channel, CHANNEL_IDLE_S, MAX_CHANNELS)
        self.registry_reads = RegistryReads()
        self._last_choice: Replica | None = None  # the registry's latest answer

    def channel(self, address: str) -> grpc.aio.Channel:
        """One shared channel per upstream address (gRPC multiplexes the sessions),
        plaintext, TLS or mTLS as the upstream_* settings say, with keepalive and
        round-robin over every address the name resolves to (kame_common.grpc_options):
        `dns:///stt:50053` on a headless Service reaches every stt pod. A TLS
        channel follows its certificate files (kame_common.tls.ReloadingChannel);
        channels unused for a while are retired (ChannelCache)."""
        return self.channels.get(address)

    def _new_channel(self, address: str) -> grpc.aio.Channel:
        return self._tls.reloading_channel(
            address,
            interceptors=tracing.client_interceptors(),
            options=self._channel_options,
        )

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
        await self.channels.close()
        await self.health_channels.close()
