"""Redis session state: session records, conversation logs, replica capacity.

Keys (all under the `kame:` prefix):
- `kame:session:{id}`        hash, the session record; expires `ttl_s` after the last write.
- `kame:conversation:{id}`   list of JSON turns {role, text, ts}, append-only, same TTL,
  trimmed to its newest `max_turns` turns.
- `kame:lease:{id}`          the one call that holds the session now (a random owner id);
  expires unless its holder renews it (see SessionStore.hold_lease).
- `kame:resume:{id}`         the nonce of the one resume token that continues the session
  now (services/gateway/resume.py); same TTL as the record.
- `kame:llm_tokens:session:{id}` the LLM tokens a session spent (estimated; the oracle's
  budgets, services/oracle/budget.py), same TTL as its record.
- `kame:llm_tokens:caller:{caller}:{window}` the LLM tokens one caller spent in one
  window of the oracle's caller_budget_window_s; expires with its window.
- `kame:replicas:{service}`  sorted set of replica ids scored by heartbeat expiry time.
- `kame:replica:{service}:{id}` hash {address, free_slots, total_slots, expires_at_ms,
  signature}; expires with its heartbeat.

Replica records are signed when the registry has a secret: HMAC-SHA256 over
the service, the replica id, the address, the slot counts and the expiry, so
whoever can write to Redis but lacks the secret cannot point the gateway at an
address of their own, inflate a replica's slots, or replay an expired record.
A registry with a secret skips (and counts in
kame_registry_rejected_records_total) every record it cannot verify.

The client retries commands on connection errors (with backoff), so a Redis
restart or a dropped connection costs a retry, not a session; and every
connect and command times out (`redis_timeout_s`, 1 s), so a Redis that
accepts connections and never answers costs a failed write or a session
without history, never a stalled call. A password
travels in the URL (`redis://:PASSWORD@host:6379/0`, from a Secret); never
log a Redis URL, log `redacted_url(url)`.
"""

from __future__ import annotations

import json
import logging
import time
import typing
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis
from prometheus_client import Counter
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from kame_common.auth import same_signature, sign

log = logging.getLogger(__name__)

PREFIX = "kame"
RECORD_VERSION = "kame-replica-v1"
_MAX_REPORTED = 1024  # bounds the memory of which bad records were logged

REJECTED_RECORDS = Counter(
    "kame_registry_rejected_records",
    "Capacity registry records skipped (reason: unsigned, bad_signature, expired, malformed)",
    ["service", "reason"],
)


def redacted_url(url: str) -> str:
    """`url` with any password replaced by ***, for logs and printed endpoints."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


DEFAULT_TIMEOUT_S = 1.0
# Keys of one run of presses named in its conversation turn; more are "and more".
MAX_KEYS_IN_TURN = 32
# A conversation longer than this keeps its newest turns (prompts use far fewer).
DEFAULT_MAX_TURNS = 500

# Take or renew a key for its owner (a lease's holder, a resume token's nonce): set it,
# with a TTL in milliseconds, unless another owner holds it.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# Release a lease only if the owner still holds it (it may have expired and moved on).
_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# Replace a resume nonce with a new one only if the presented one is current.
_ROTATE_NONCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
"""


def connect(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> redis.Redis:
    """A client whose connects and commands each fail after `timeout_s` (0: never),
    and that reconnects and retries on connection errors."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        # Not on timeouts: a Redis that hangs would cost every command (retries + 1)
        # timeouts instead of one.
        retry=Retry(
            ExponentialBackoff(cap=1.0, base=0.05),
            retries=5,
            supported_errors=(RedisConnectionError,),
        ),
        retry_on_error=[RedisConnectionError, ConnectionResetError],
        health_check_interval=10,
        socket_timeout=timeout_s or None,
        socket_connect_timeout=timeout_s or None,
    )


class SessionStore:
    def __init__(
        self, client: redis.Redis, ttl_s: int = 3600, max_turns: int = DEFAULT_MAX_TURNS
    ) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self.max_turns = max_turns

    @staticmethod
    def _session_key(session_id: str) -> str:
        return f"{PREFIX}:session:{session_id}"

    @staticmethod
    def _conversation_key(session_id: str) -> str:
        return f"{PREFIX}:conversation:{session_id}"

    @staticmethod
    def _lease_key(session_id: str) -> str:
        return f"{PREFIX}:lease:{session_id}"

    async def put_session(self, session_id: str, fields: dict[str, str | int | float]) -> None:
        """Create or update the session record and renew its TTL."""
        key = self._session_key(session_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
            pipe.expire(key, self.ttl_s)
            await pipe.execute()

    async def get_session(self, session_id: str) -> dict[str, str]:
        return _texts(await self.client.hgetall(self._session_key(session_id)))

    async def append_turn(self, session_id: str, role: str, text: str) -> None:
        """Append one turn ("user" or "agent") to the conversation log, which keeps
        its newest `max_turns` turns: a caller cannot grow it without bound."""
        key = self._conversation_key(session_id)
        turn = json.dumps({"role": role, "text": text, "ts": time.time()})
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.rpush(key, turn)
            pipe.ltrim(key, -self.max_turns, -1)
            pipe.expire(key, self.ttl_s)
            await pipe.execute()

    async def conversation(self, session_id: str) -> list[dict[str, Any]]:
        turns = await self.client.lrange(self._conversation_key(session_id), 0, -1)
        return [json.loads(turn) for turn in turns]

    async def delete_session(self, session_id: str) -> None:
        await self.client.delete(self._session_key(session_id), self._conversation_key(session_id))

    async def hold_lease(self, session_id: str, owner: str, ttl_s: float) -> bool:
        """Take the session's lease for `owner`, or renew it, for `ttl_s`; False while
        another owner holds it. One call at a time continues a session: its holder
        renews the lease while the call lives, so a lease outlives a dead holder
        by at most `ttl_s`."""
        held = await self.client.eval(
            _HOLD, 1, self._lease_key(session_id), owner, int(ttl_s * 1000)
        )
        return bool(held)

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Give the lease up, if `owner` still holds it."""
        await self.client.eval(_RELEASE_LEASE, 1, self._lease_key(session_id), owner)

    @staticmethod
    def _resume_key(session_id: str) -> str:
        return f"{PREFIX}:resume:{session_id}"

    async def keep_resume_nonce(self, session_id: str, nonce: str) -> bool:
        """Write the nonce of the session's resume token, or renew it; False when
        another nonce is current (a resume rotated it)."""
        kept = await self.client.eval(
            _HOLD, 1, self._resume_key(session_id), nonce, self.ttl_s * 1000
        )
        return bool(kept)

    async def resume_nonce(self, session_id: str) -> str:
        """The nonce of the token that resumes the session now ("" = none does)."""
        return str(await self.client.get(self._resume_key(session_id)) or "")

    async def rotate_resume_nonce(self, session_id: str, presented: str, new: str) -> bool:
        """Make `new` the session's nonce if `presented` is the current one (its
        token is then used up); False otherwise."""
        rotated = await self.client.eval(
            _ROTATE_NONCE, 1, self._resume_key(session_id), presented, new, self.ttl_s
        )
        return bool(rotated)

    async def forget_resume_nonce(self, session_id: str) -> None:
        """No token resumes the session any more."""
        await self.client.delete(self._resume_key(session_id))

    @staticmethod
    def _token_keys(session_id: str, caller: str, window: int) -> tuple[str, str]:
        return (
            f"{PREFIX}:llm_tokens:session:{session_id}",
            f"{PREFIX}:llm_tokens:caller:{caller}:{window}",
        )

    async def llm_tokens(self, session_id: str, caller: str, window: int) -> tuple[int, int]:
        """The LLM tokens the session, and its caller in `window`, spent so far."""
        values = await self.client.mget(self._token_keys(session_id, caller, window))
        session, spent_by_caller = (int(value or 0) for value in values)
        return session, spent_by_caller

    async def add_llm_tokens(
        self,
        session_id: str,
        caller: str,
        window: int,
        tokens: int,
        session_ttl_s: int,
        window_ttl_s: int,
    ) -> tuple[int, int]:
        """Count `tokens` spent by the session and its caller; the new totals."""
        session_key, caller_key = self._token_keys(session_id, caller, window)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.incrby(session_key, tokens)
            pipe.expire(session_key, session_ttl_s)
            pipe.incrby(caller_key, tokens)
            pipe.expire(caller_key, window_ttl_s)
            session, _, spent_by_caller, _ = await pipe.execute()
        return int(session), int(spent_by_caller)

    async def lease_left_s(self, session_id: str) -> float:
        """How long the session's lease has left (0 when nobody holds it)."""
        left_ms = await self.client.pttl(self._lease_key(session_id))
        return max(float(left_ms), 0.0) / 1000


def keys_pressed_text(digits: list[str], count: int, shown: bool) -> str:
    """How a run of `count` keys the caller pressed in a row stands in a conversation
    log (the gateway's and the oracle's): one caller turn, on the caller's side,
    in words no speech recognizer would produce. The digits themselves (PINs,
    account numbers) only when `shown`, and at most MAX_KEYS_IN_TURN of them."""
    if not shown:
        return "(pressed a key)" if count == 1 else f"(pressed {count} keys)"
    keys = " ".join(digits[:MAX_KEYS_IN_TURN])
    more = " and more" if count > MAX_KEYS_IN_TURN else ""
    return f"(pressed {keys}{more} on the keypad)"


class KeyRun:
    """Keys pressed in a row, not yet written as their one turn."""

    def __init__(self) -> None:
        self.digits: list[str] = []  # the first MAX_KEYS_IN_TURN
        self.count = 0

    def add(self, digit: str) -> None:
        self.count += 1
        if len(self.digits) < MAX_KEYS_IN_TURN:
            self.digits.append(digit)

    def text(self, shown: bool) -> str:
        return keys_pressed_text(self.digits, self.count, shown)


@dataclass(frozen=True)
class Replica:
    replica_id: str
    address: str
    free_slots: int
    total_slots: int
    published_at: float = 0.0  # wall time the replica wrote this record


class CapacityRegistry:
    """Replicas publish their free slots at least every `ttl_s / 3` seconds; a
    replica that stops publishing disappears after `ttl_s`. With a `secret`,
    records are signed on publish and verified on read (see the module doc)."""

    def __init__(
        self, client: redis.Redis, service: str, ttl_s: float = 10.0, secret: str = ""
    ) -> None:
        self.client = client
        self.service = service
        self.ttl_s = ttl_s
        self._secret = secret.encode()
        self._reported: set[tuple[str, str]] = set()  # (replica, reason) already logged

    def _index_key(self) -> str:
        return f"{PREFIX}:replicas:{self.service}"

    def _replica_key(self, replica_id: str) -> str:
        return f"{PREFIX}:replica:{self.service}:{replica_id}"

    def _signature(self, replica_id: str, fields: dict[str, str]) -> str:
        # JSON of a list: no choice of field values can make two records sign alike.
        signed = [
            RECORD_VERSION,
            self.service,
            replica_id,
            fields["address"],
            fields["free_slots"],
            fields["total_slots"],
            fields.get("expires_at_ms", ""),
        ]
        message = json.dumps(signed, separators=(",", ":")).encode()
        return sign(self._secret, message)

    async def publish(
        self, replica_id: str, address: str, free_slots: int, total_slots: int
    ) -> None:
        key = self._replica_key(replica_id)
        expires_at = time.time() + self.ttl_s
        fields: dict[str, str] = {
            "address": address,
            "free_slots": str(free_slots),
            "total_slots": str(total_slots),
            "expires_at_ms": str(int(expires_at * 1000)),
        }
        if self._secret:
            fields["signature"] = self._signature(replica_id, fields)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)  # no field of an older record survives into this one
            # redis-py types the mapping's keys invariantly as its whole key union.
            pipe.hset(key, mapping=typing.cast("Mapping[Any, Any]", fields))
            pipe.pexpire(key, int(self.ttl_s * 1000))
            pipe.zadd(self._index_key(), {replica_id: expires_at})
            await pipe.execute()

    async def withdraw(self, replica_id: str) -> None:
        await self.client.delete(self._replica_key(replica_id))
        await self.client.zrem(self._index_key(), replica_id)

    async def replicas(self) -> list[Replica]:
        """Live replicas whose records verify (expired ones are pruned from the index)."""
        await self.client.zremrangebyscore(self._index_key(), "-inf", time.time())
        live = []
        for replica_id in await self.client.zrange(self._index_key(), 0, -1):
            assert isinstance(replica_id, str)  # the client decodes responses
            fields = _texts(await self.client.hgetall(self._replica_key(replica_id)))
            if not fields:
                continue
            replica = self._verified(replica_id, fields)
            if replica is not None:
                live.append(replica)
        return live

    def _verified(self, replica_id: str, fields: dict[str, str]) -> Replica | None:
        reason = self._rejection(replica_id, fields)
        if reason is None:
            return Replica(
                replica_id,
                fields["address"],
                int(fields["free_slots"]),
                int(fields["total_slots"]),
                published_at=int(fields.get("expires_at_ms", "0")) / 1000 - self.ttl_s,
            )
        REJECTED_RECORDS.labels(service=self.service, reason=reason).inc()
        if (replica_id, reason) not in self._reported:  # once each, not at every choice
            if len(self._reported) >= _MAX_REPORTED:
                self._reported.clear()
            self._reported.add((replica_id, reason))
            log.warning("%s registry: ignoring replica %r: %s", self.service, replica_id, reason)
        return None

    def _rejection(self, replica_id: str, fields: dict[str, str]) -> str | None:
        """Why the record cannot be used, or None."""
        try:
            int(fields["free_slots"]), int(fields["total_slots"])
            expires_at_ms = int(fields.get("expires_at_ms", "0"))
            fields["address"]
        except (KeyError, ValueError):
            return "malformed"
        if not self._secret:
            return None
        signature = fields.get("signature", "")
        if not signature:
            return "unsigned"
        expected = self._signature(replica_id, fields)
        if not same_signature(signature, expected):
            return "bad_signature"
        if expires_at_ms <= time.time() * 1000:
            return "expired"
        return None

    async def choose(self) -> Replica | None:
        """The live replica with the most free slots, or None if none has one."""
        return choose(await self.replicas())


def choose(replicas: list[Replica]) -> Replica | None:
    """The replica with the most free slots, or None if none has one."""
    candidates = [r for r in replicas if r.free_slots > 0]
    return max(candidates, key=lambda r: (r.free_slots, r.replica_id), default=None)


def _texts(fields: Mapping[Any, Any]) -> dict[str, str]:
    """A hash as the client returns it (decode_responses: str keys and values)."""
    return {str(key): str(value) for key, value in fields.items()}
