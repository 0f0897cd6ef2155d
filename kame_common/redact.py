"""Internal addresses out of what a caller sees.

Messages that leave the cluster (a gateway status or notice, an error the web
page shows) must not name internal addresses: `redact_addresses` replaces each
with `<internal address>`; the full message belongs in the service's log.
"""

from __future__ import annotations

import re

# What an address looks like in an error text: a URL, a gRPC peer, an IPv6 or
# IPv4 address (port optional), or host:port.
_ADDRESS = re.compile(
    r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"),]+"
    r"|\bipv[46]:\S+"
    r"|\[[0-9a-fA-F.]*:[0-9a-fA-F:.]*\](?::\d{1,5})?"  # a colon: not an index like [0]
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b"
    r"|\b[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?:\d{1,5}\b"
)
REDACTED = "<internal address>"


def redact_addresses(message: str) -> str:
    """`message` with every address replaced, for a client outside the cluster."""
    return _ADDRESS.sub(REDACTED, message)
