"""Who may hold what in the web service, for every protocol (the one rule the
bridge applies, services/web/bridge.py):

- a socket is *waiting* from its handshake until its gateway call opens: at
  most `max_waiting_per_address` such sockets per client address (more are
  refused before the handshake), and none for longer than `start_timeout_s`
  (the bridge closes it), so sockets that never call cost little and not for long;
- a socket counts against `max_sessions` only once its call opens (the gateway
  then checks its token): sockets without a call, however many, lock nobody out;
- the client address is the peer's, or, when the peer is one of
  `trusted_proxies`, the nearest address of X-Forwarded-For that is not a
  trusted proxy: a client cannot choose its address by writing the header.

Sans-IO: the server says who connects, the bridge when a call opens and when
a socket ends.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kame_common.config import ConfigError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def proxy_networks(value: str) -> list[Network]:
    """The networks of a comma-separated `trusted_proxies` (addresses or CIDRs)."""
    networks = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(f"trusted_proxies: {item!r} is not an address or network") from None
    return networks


def client_address(peer: str, forwarded_for: str | None, proxies: list[Network]) -> str:
    """Who a request comes from: the peer, unless the peer is a trusted proxy; then
    X-Forwarded-For read from the right (the proxies append), the first address
    that is not a trusted proxy (or the leftmost, when all of them are)."""
    address = peer
    if not _trusted(peer, proxies):
        return address
    for hop in reversed([part.strip() for part in (forwarded_for or "").split(",")]):
        if not hop:
            continue
        address = hop
        if not _trusted(hop, proxies):
            break
    return address


def _trusted(address: str, proxies: list[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in proxies)


@dataclass
class Ticket:
    """One socket, from its handshake: waiting until its call opens, then counted."""

    address: str
    waiting: bool = True
    counted: bool = False
    opened_at: float = field(default_factory=lambda: asyncio.get_running_loop().time())


class Admission:
    """The web service's counts: sockets waiting per address, calls open."""

    def __init__(
        self,
        max_sessions: int,
        max_waiting_per_address: int,
        counted: Callable[[int], None] = lambda active: None,
    ) -> None:
        self.counted = counted  # told the number of open calls as it changes (a gauge)
        self.max_sessions = max_sessions
        self.max_waiting_per_address = max_waiting_per_address
        self.waiting: Counter[str] = Counter()
        self.active = 0  # sockets with an open call
        self.draining = False
        self.idle = asyncio.Event()  # set while no call is open
        self.idle.set()

    def arrive(self, address: str) -> Ticket | None:
        """A new socket from `address`, waiting; None if that address has its fill."""
        limit = self.max_waiting_per_address
        if limit and self.waiting[address] >= limit:
            return None
        self.waiting[address] += 1
        return Ticket(address)

    def refusal(self) -> str:
        """Why a call may not open now ("" if it may)."""
        if self.draining:
            return "the web service is draining"
        if self.max_sessions and self.active >= self.max_sessions:
            return f"the web service is at its limit of {self.max_sessions} conversations"
        return ""

    def admit(self, ticket: Ticket) -> str:
        """The ticket's call opens: counted, no longer waiting; or why it may not."""
        if refusal := self.refusal():
            return refusal
        self._stop_waiting(ticket)
        ticket.counted = True
        self.active += 1
        self.counted(self.active)
        self.idle.clear()
        return ""

    def leave(self, ticket: Ticket) -> None:
        """The ticket's socket ended (twice is once)."""
        self._stop_waiting(ticket)
        if ticket.counted:
            ticket.counted = False
            self.active -= 1
            self.counted(self.active)
            if not self.active:
                self.idle.set()

    def _stop_waiting(self, ticket: Ticket) -> None:
        if ticket.waiting:
            ticket.waiting = False
            self.waiting[ticket.address] -= 1
            if not self.waiting[ticket.address]:
                del self.waiting[ticket.address]
