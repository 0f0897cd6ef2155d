"""Admission by capacity: refuse a new call that stt or the oracle cannot serve in time.

stt and oracle replicas publish the sessions they can still take in the Redis
capacity registry (kame_common.capacity, with `publish_capacity` on). Before
a new call opens any upstream stream, `CapacityGate.admit` adds up the free
sessions of each side service the call's mode uses, less the calls this
gateway admitted since the newest of those records was written (a replica
republishes as soon as a session opens, so that gap is a moment long), and
refuses the call with RESOURCE_EXHAUSTED and a retry hint when nothing is
left. A caller waiting 10 s for every answer is worse off than one told to
retry.

Calls set up at the same moment each reserve their place before the registry
is read (a read awaits Redis: checked first and counted after, ten
simultaneous calls all saw the same two free sessions and all went in); a
call is admitted if the free sessions cover its place among this gateway's
reservations not yet counted by a record, and a refused one gives its
place back.

The gate fails open: a service none of whose replicas publishes (a hosted
or older deployment) or a registry that cannot be read (Redis down or hung:
then every registry read skips it for a while, see
connections.RegistryReads) never refuses a call. A resumed
call is never refused: it is a caller already in a conversation.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
import redis.asyncio as redis
from prometheus_client import Counter

from kame_common.store import CapacityRegistry
from services.gateway.connections import RegistryReads
from services.gateway.plan import SessionError

SIDE_SERVICES = ("stt", "oracle")
# What a refused caller is told to wait without a better estimate: about one
# heartbeat of the registry (kame_common.store.CapacityRegistry: a third of its 10 s TTL).
RETRY_AFTER_S = 3.0

REFUSALS = Counter(
    "kame_gateway_capacity_refusals",
    "New calls refused because a side service had no free capacity (service: stt, oracle)",
    ["service"],
)


@dataclass(frozen=True)
class _Place:
    """A call's place among this gateway's admissions: when, and in which order."""

    at: float  # wall time
    number: int


class CapacityGate:
    def __init__(
        self,
        redis_client: redis.Redis,
        reads: RegistryReads,
        secret: str = "",
        clock: Callable[[], float] = time.time,
        retry_after_s: Callable[[], float] | None = None,
    ) -> None:
        self._reads = reads
        # When a slot is expected to free (the gateway's calls' lengths, AnswerTimes).
        self._retry_after_s = retry_after_s or (lambda: RETRY_AFTER_S)
        self._registries = {
            service: CapacityRegistry(redis_client, service, secret=secret)
            for service in SIDE_SERVICES
        }
        self._clock = clock
        # This gateway's admissions (and reservations) the registry may not have counted.
        self._admitted: dict[str, collections.deque[_Place]] = {
            service: collections.deque() for service in SIDE_SERVICES
        }
        self._places = itertools.count()

    async def admit(self, services: Iterable[str]) -> None:
        """Count a new call on `services`, or raise SessionError(RESOURCE_EXHAUSTED)."""
        services = list(services)
        # Reserved before any await: a call set up meanwhile queues behind this one.
        places = {service: self._reserve(service) for service in services}
        left = await asyncio.gather(
            *(self._left_after(service, places[service]) for service in services)
        )
        for service, left_after in zip(services, left, strict=True):
            if left_after is not None and left_after < 0:
                for reserved, place in places.items():
                    with contextlib.suppress(ValueError):  # counted by a record meanwhile
                        self._admitted[reserved].remove(place)
                REFUSALS.labels(service=service).inc()
                retry_after_s = self._retry_after_s()
                raise SessionError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{service} is at capacity: it cannot serve another call in time; "
                    f"retry in {retry_after_s:g} s",
                    retry_after_s=retry_after_s,
                )

    def _reserve(self, service: str) -> _Place:
        place = _Place(self._clock(), next(self._places))
        self._admitted[service].append(place)
        return place

    async def _left_after(self, service: str, place: _Place) -> int | None:
        """Free sessions across `service`'s replicas once this gateway's calls not
        counted by a record yet, up to and including `place`, have theirs; None
        when nobody publishes or the registry failed."""
        replicas = await self._reads.read(service, self._registries[service].replicas())
        if not replicas:
            return None
        newest = max(replica.published_at for replica in replicas)
        admitted = self._admitted[service]
        while admitted and admitted[0].at < newest:
            admitted.popleft()  # the records written since counted these calls
        ahead = sum(1 for other in admitted if other.number <= place.number)
        return sum(replica.free_slots for replica in replicas) - ahead
