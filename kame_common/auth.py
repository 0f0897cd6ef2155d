"""Caller authentication: a bearer token in the call's metadata.

Callers send `authorization: Bearer <token>`. Several tokens may be valid at
once, so a token can be rotated without cutting callers off: add the new
one, move callers over, drop the old one. Tokens are compared in constant
time (digests of equal length, `hmac.compare_digest`, every valid token
tried), so timing tells an attacker nothing about how close a guess was.

A refusal is counted in kame_gateway_auth_failures_total{reason} (missing,
malformed, invalid, throttled) and logged with the peer and the reason, never
with the token. A peer that keeps failing is slowed down: after
`free_failures` refusals within `forget_after_s`, each further refusal is
held back for a delay that doubles up to `max_delay_s`. A valid token does
not wipe a peer's failures: web and telephony reach the gateway from their
pod's one address, and a guesser behind them would otherwise start afresh
whenever a real caller got in; the failures are forgotten only
`forget_after_s` after the last one. Peers are keyed by address without the
port (a new connection does not start afresh), IPv6 ones by their /64 (one
host's share of a network, which it can fill with addresses); the table holds
at most `max_peers`. Behind a load balancer that hides caller addresses every
caller is one peer: the slow-down then throttles guessing as a whole.

A held refusal is a call the server keeps open: at most MAX_HELD are held at
once (kame_gateway_auth_held_refusals), so a flood of bad tokens cannot pile
up open calls. Past that, a call from a peer already being slowed down is
refused at once with RESOURCE_EXHAUSTED and a retry hint, its token not even
checked ("throttled"): a flood gets no answer about any guess faster than
the slow-down allows (a valid token from that address waits too, until the
flood ebbs). A token is a secret of at least 16 characters and about 64 bits
of randomness (config.check_token).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)
# How long a refused call's first message is waited for (see BearerAuth.check).
REFUSAL_READ_S = 1.0
# Refused calls held back (slow-down) at once; more are refused without a hold.
MAX_HELD = 256

AUTH_FAILURES = Counter(
    "kame_gateway_auth_failures",
    "Calls refused (reason: missing, malformed, invalid: UNAUTHENTICATED; throttled: "
    "RESOURCE_EXHAUSTED, unchecked, from a peer being slowed down while every hold is taken)",
    ["reason"],
)

HELD_REFUSALS = Gauge(
    "kame_gateway_auth_held_refusals", "Refused calls held back by the slow-down right now"
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


def peer_key(peer: str) -> str:
    """Whose failures a refusal counts as: the host of an IPv4 peer, the /64 of an
    IPv6 one ('ipv6:[2001:db8::1]:5' -> 'ipv6:2001:db8::/64'), else the peer."""
    host = peer_host(peer)
    if not host.startswith("ipv6:"):
        return host
    try:
        network = ipaddress.IPv6Network(f"{host[5:].strip('[]')}/64", strict=False)
    except ValueError:
        return host
    return f"ipv6:{network}"


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


# Who calls when the service has no tokens.
ANONYMOUS = "anonymous"


def principal_of(token: str) -> str:
    """Who a bearer token speaks for, without the token itself: what a resume
    token is bound to (services/gateway/resume.py). Each valid token is its own
    principal, so a rotated-in token cannot continue the old token's sessions."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]


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

    def slowed(self, peer: str) -> float:
        """The hold `peer`'s next failure would get (0: none, it is not slowed down)."""
        record = self._peers.get(peer)
        if record is None or self._clock() - record.last >= self.forget_after_s:
            return 0.0
        return self.delay(record.count + 1)

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


_MISSING = "send the metadata 'authorization: Bearer <token>'"
_MALFORMED = "the authorization metadata must be 'Bearer <token>', once"


@dataclass(frozen=True)
class _Verdict:
    principal: str = ""  # set when the token is valid
    reason: str = ""
    message: str = ""


class BearerAuth:
    """Checks the bearer token of each call; no tokens = no auth."""

    def __init__(self, tokens: Iterable[str], throttle: PeerThrottle | None = None) -> None:
        self._digests = tuple(_digest(token) for token in tokens)
        self.throttle = throttle or PeerThrottle()
        self.held = 0  # refusals being held back now

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def _verify(self, metadata: Iterable[tuple[str, str | bytes]]) -> _Verdict:
        """The caller's principal if the metadata carries a valid token, else the
        refusal's reason and message."""
        values = [value for key, value in metadata if key.lower() == METADATA_KEY]
        if not values:
            return _Verdict(reason="missing", message=_MISSING)
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, token = value.strip().partition(" ")
        if len(values) > 1 or scheme.lower() != SCHEME or not token.strip():
            return _Verdict(reason="malformed", message=_MALFORMED)
        presented = _digest(token.strip())
        matched = False
        for digest in self._digests:  # every one, so timing does not say which matched
            matched |= hmac.compare_digest(presented, digest)
        if not matched:
            return _Verdict(reason="invalid", message="the bearer token is not valid")
        return _Verdict(principal=principal_of(token.strip()))

    async def check(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        first_message: Callable[[], Awaitable[object]] | None = None,
    ) -> str:
        """The caller's principal (`principal_of` its token, or ANONYMOUS without
        auth) if the call may go on; else abort it with UNAUTHENTICATED.

        `first_message`: on a refusal, read (and drop) the caller's first message, for at
        most REFUSAL_READ_S, before aborting. A grpc.aio client whose first write is still
        under way when the refusal arrives reports INTERNAL "Internal error from Core"
        instead of UNAUTHENTICATED (grpc/grpc#36066; `kame talk` showed it): once the
        message is read, that write is done."""
        if not self.enabled:
            return ANONYMOUS
        peer = peer_key(context.peer() or "unknown")
        if self.held >= MAX_HELD and (retry_after_s := self.throttle.slowed(peer)):
            await self._refuse_unchecked(context, peer, retry_after_s)
        verdict = self._verify(context.invocation_metadata() or ())
        if verdict.principal:
            return verdict.principal
        reason, message = verdict.reason, verdict.message
        AUTH_FAILURES.labels(reason=reason).inc()
        failures, delay_s = self.throttle.failed(peer)
        log.warning(
            "refused a call from %s: %s token (%d failures in a row%s)",
            peer,
            reason,
            failures,
            f", held {delay_s:g} s" if delay_s else "",
        )
        if self.held >= MAX_HELD:  # a peer not slowed down yet: no hold to give it
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        self.held += 1
        HELD_REFUSALS.inc()
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            if first_message is not None:
                with contextlib.suppress(Exception):  # what it is, or whether it comes, is moot
                    await asyncio.wait_for(first_message(), REFUSAL_READ_S)
        finally:
            self.held -= 1
            HELD_REFUSALS.dec()
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    @staticmethod
    async def _refuse_unchecked(
        context: grpc.aio.ServicerContext[Any, Any], peer: str, retry_after_s: float
    ) -> None:
        """Refuse a call from a peer being slowed down while every hold is taken,
        without looking at its token: no answer about a guess comes sooner."""
        AUTH_FAILURES.labels(reason="throttled").inc()
        log.warning("refused a call from %s unchecked: too many failures, holds full", peer)
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"too many failed attempts from this address; retry in {retry_after_s:g} s",
            trailing_metadata=(("retry-after-s", f"{retry_after_s:g}"),),
        )
