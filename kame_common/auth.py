"""Caller authentication: a bearer token in the call's metadata.

Callers send `authorization: Bearer <token>`. Several tokens may be valid at
once, so a token can be rotated without cutting callers off: add the new
one, move callers over, drop the old one. Tokens are compared in constant
time (digests of equal length, `hmac.compare_digest`, every valid token
tried), so timing tells an attacker nothing about how close a guess was.

A refusal is counted in kame_gateway_auth_failures_total{reason} (missing,
malformed, invalid) and logged with the peer and the reason, never with the
token. A peer that keeps failing is slowed down: after `free_failures`
refusals within `forget_after_s`, each further refusal is held back for a
delay that doubles up to `max_delay_s`. Peers are keyed by address without
the port (a new connection does not start afresh); the table forgets a peer
`forget_after_s` after its last failure and holds at most `max_peers`.
Behind a load balancer that hides caller addresses every caller is one peer:
the slow-down then throttles guessing as a whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import Counter

log = logging.getLogger(__name__)
# How long a refused call's first message is waited for (see BearerAuth.check).
REFUSAL_READ_S = 1.0

AUTH_FAILURES = Counter(
    "kame_gateway_auth_failures",
    "Calls refused with UNAUTHENTICATED (reason: missing, malformed, invalid)",
    ["reason"],
)

METADATA_KEY = "authorization"
SCHEME = "bearer"


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata a client sends with `token` (none when it has no token)."""
    return ((METADATA_KEY, f"Bearer {token}"),) if token else ()


def parse_tokens(value: str) -> tuple[str, ...]:
    """The valid tokens of a comma-separated setting (blanks dropped)."""
    return tuple(token.strip() for token in value.split(",") if token.strip())


def peer_host(peer: str) -> str:
    """gRPC's peer string without the port: 'ipv4:10.0.0.7:51234' -> 'ipv4:10.0.0.7'."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rsplit(":", 1)[0]
    return peer


def sign(secret: str | bytes, message: bytes) -> str:
    """HMAC-SHA256 of `message` under `secret`, in hex: how the stack signs what it
    hands out and checks later (capacity registry records, resume tokens)."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def same_signature(presented: str, expected: str) -> bool:
    """Constant-time comparison, so timing tells nothing about a forged signature."""
    return hmac.compare_digest(presented.encode(), expected.encode())


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass
class _Failures:
    count: int
    last: float


class PeerThrottle:
    """Remembers recent failures per peer and says how long to hold a refusal."""

    def __init__(
        self,
        free_failures: int = 3,
        base_delay_s: float = 0.5,
        max_delay_s: float = 8.0,
        forget_after_s: float = 300.0,
        max_peers: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free_failures = free_failures
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.forget_after_s = forget_after_s
        self.max_peers = max_peers
        self._clock = clock
        self._peers: OrderedDict[str, _Failures] = OrderedDict()  # least recent first

    def __len__(self) -> int:
        return len(self._peers)

    def failed(self, peer: str) -> tuple[int, float]:
        """Record a failure; (failures in a row, seconds to hold this refusal)."""
        now = self._clock()
        self._forget_old(now)
        record = self._peers.pop(peer, None) or _Failures(0, now)
        record.count += 1
        record.last = now
        self._peers[peer] = record
        while len(self._peers) > self.max_peers:
            self._peers.popitem(last=False)
        return record.count, self.delay(record.count)

    def succeeded(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def delay(self, failures: int) -> float:
        over = failures - self.free_failures
        if over <= 0:
            return 0.0
        return min(self.max_delay_s, self.base_delay_s * 2.0 ** (over - 1))

    def _forget_old(self, now: float) -> None:
        while self._peers:
            peer, record = next(iter(self._peers.items()))
            if now - record.last < self.forget_after_s:
                return
            del self._peers[peer]


class BearerAuth:
    """Checks the bearer token of each call; no tokens = no auth."""

    def __init__(self, tokens: Iterable[str], throttle: PeerThrottle | None = None) -> None:
        self._digests = tuple(_digest(token) for token in tokens)
        self.throttle = throttle or PeerThrottle()

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def _refusal(self, metadata: Iterable[tuple[str, str | bytes]]) -> tuple[str, str] | None:
        """None if the metadata carries a valid token, else (reason, message)."""
        values = [value for key, value in metadata if key.lower() == METADATA_KEY]
        if not values:
            return "missing", "send the metadata 'authorization: Bearer <token>'"
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, token = value.strip().partition(" ")
        if len(values) > 1 or scheme.lower() != SCHEME or not token.strip():
            return "malformed", "the authorization metadata must be 'Bearer <token>', once"
        presented = _digest(token.strip())
        matched = False
        for digest in self._digests:  # every one, so timing does not say which matched
            matched |= hmac.compare_digest(presented, digest)
        return None if matched else ("invalid", "the bearer token is not valid")

    async def check(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        first_message: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Return if the call may go on; else abort it with UNAUTHENTICATED.

        `first_message`: on a refusal, read (and drop) the caller's first message, for at
        most REFUSAL_READ_S, before aborting. A grpc.aio client whose first write is still
        under way when the refusal arrives reports INTERNAL "Internal error from Core"
        instead of UNAUTHENTICATED (grpc/grpc#36066; `kame talk` showed it): once the
        message is read, that write is done."""
        if not self.enabled:
            return
        peer = peer_host(context.peer() or "unknown")
        refusal = self._refusal(context.invocation_metadata() or ())
        if refusal is None:
            self.throttle.succeeded(peer)
            return
        reason, message = refusal
        AUTH_FAILURES.labels(reason=reason).inc()
        failures, delay_s = self.throttle.failed(peer)
        log.warning(
            "refused a call from %s: %s token (%d failures in a row%s)",
            peer,
            reason,
            failures,
            f", held {delay_s:g} s" if delay_s else "",
        )
        if delay_s:
            await asyncio.sleep(delay_s)
        if first_message is not None:
            with contextlib.suppress(Exception):  # what it is, or whether it comes, is moot
                await asyncio.wait_for(first_message(), REFUSAL_READ_S)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
