"""Redis session state: session records, conversation logs, replica capacity.

Keys (all under the `kame:` prefix):
- `kame:session:{id}`        hash, the session record; expires `ttl_s` after the last write.
- `kame:conversation:{id}`   list of JSON turns {role, text, ts}, append-only, same TTL.
- `kame:replicas:{service}`  sorted set of replica ids scored by heartbeat expiry time.
- `kame:replica:{service}:{id}` hash {address, free_slots, total_slots}; expires with its heartbeat.

The client retries commands on connection errors (with backoff), so a Redis
restart or a dropped connection costs a retry, not a session.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

PREFIX = "kame"


def connect(url: str) -> redis.Redis:
    """A client that reconnects and retries on connection errors."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=5),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, ConnectionResetError],
        health_check_interval=10,
        socket_connect_timeout=2,
    )


class SessionStore:
    def __init__(self, client: redis.Redis, ttl_s: int = 3600) -> None:
        self.client = client
        self.ttl_s = ttl_s

    @staticmethod
    def _session_key(session_id: str) -> str:
        return f"{PREFIX}:session:{session_id}"

    @staticmethod
    def _conversation_key(session_id: str) -> str:
        return f"{PREFIX}:conversation:{session_id}"

    async def put_session(self, session_id: str, fields: dict[str, str | int | float]) -> None:
        """Create or update the session record and renew its TTL."""
        key = self._session_key(session_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
            pipe.expire(key, self.ttl_s)
            await pipe.execute()

    async def get_session(self, session_id: str) -> dict[str, str]:
        return await self.client.hgetall(self._session_key(session_id))

    async def append_turn(self, session_id: str, role: str, text: str) -> None:
        """Append one turn ("user" or "agent") to the conversation log."""
        key = self._conversation_key(session_id)
        turn = json.dumps({"role": role, "text": text, "ts": time.time()})
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.rpush(key, turn)
            pipe.expire(key, self.ttl_s)
            await pipe.execute()

    async def conversation(self, session_id: str) -> list[dict]:
        turns = await self.client.lrange(self._conversation_key(session_id), 0, -1)
        return [json.loads(turn) for turn in turns]

    async def delete_session(self, session_id: str) -> None:
        await self.client.delete(self._session_key(session_id), self._conversation_key(session_id))


@dataclass(frozen=True)
class Replica:
    replica_id: str
    address: str
    free_slots: int
    total_slots: int


class CapacityRegistry:
    """Replicas publish their free slots at least every `ttl_s / 3` seconds; a
    replica that stops publishing disappears after `ttl_s`."""

    def __init__(self, client: redis.Redis, service: str, ttl_s: float = 10.0) -> None:
        self.client = client
        self.service = service
        self.ttl_s = ttl_s

    def _index_key(self) -> str:
        return f"{PREFIX}:replicas:{self.service}"

    def _replica_key(self, replica_id: str) -> str:
        return f"{PREFIX}:replica:{self.service}:{replica_id}"

    async def publish(
        self, replica_id: str, address: str, free_slots: int, total_slots: int
    ) -> None:
        key = self._replica_key(replica_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={"address": address, "free_slots": free_slots, "total_slots": total_slots},
            )
            pipe.pexpire(key, int(self.ttl_s * 1000))
            pipe.zadd(self._index_key(), {replica_id: time.time() + self.ttl_s})
            await pipe.execute()

    async def withdraw(self, replica_id: str) -> None:
        await self.client.delete(self._replica_key(replica_id))
        await self.client.zrem(self._index_key(), replica_id)

    async def replicas(self) -> list[Replica]:
        """Live replicas (expired ones are pruned from the index)."""
        await self.client.zremrangebyscore(self._index_key(), "-inf", time.time())
        live = []
        for replica_id in await self.client.zrange(self._index_key(), 0, -1):
            fields = await self.client.hgetall(self._replica_key(replica_id))
            if fields:
                live.append(
                    Replica(
                        replica_id,
                        fields["address"],
                        int(fields["free_slots"]),
                        int(fields["total_slots"]),
                    )
                )
        return live

    async def choose(self) -> Replica | None:
        """The live replica with the most free slots, or None if none has one."""
        candidates = [r for r in await self.replicas() if r.free_slots > 0]
        return max(candidates, key=lambda r: (r.free_slots, r.replica_id), default=None)
