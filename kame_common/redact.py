"""Internal addresses out of what a caller sees, and callers' data out of logs.

Messages that leave the cluster (a gateway status or notice, an error the web
page shows) must not name internal addresses: `redact_addresses` replaces each
with `<internal address>`; the full message belongs in the service's log.

Query strings carry what callers type (`?text_prompt=...`, `?email=...` of a
Moshi client, whatever a client adds): the HTTP services' access log lines
(uvicorn's, for requests and WebSocket handshakes) keep a parameter's name
and drop its value (`QueryValuesOut`, installed by kame_common/http_server.py).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl

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
REDACTED_VALUE = "<redacted>"
# A query parameter's name as protocols spell them (text_prompt, email, model).
_PARAMETER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def redact_addresses(message: str) -> str:
    """`message` with every address replaced, for a client outside the cluster."""
    return _ADDRESS.sub(REDACTED, message)


def redact_query(path: str) -> str:
    """`path` with every query value replaced: `/api/chat?text_prompt=hi&x=1` ->
    `/api/chat?text_prompt=<redacted>&x=<redacted>`; a name that does not look
    like one (`?4711`) goes too (no query: unchanged)."""
    base, question, query = path.partition("?")
    if not question:
        return path
    names = [
        name if _PARAMETER_NAME.fullmatch(name) else REDACTED_VALUE
        for name, _ in parse_qsl(query, keep_blank_values=True)
    ] or [REDACTED_VALUE]
    return f"{base}?" + "&".join(f"{name}={REDACTED_VALUE}" for name in names)


class QueryValuesOut(logging.Filter):
    """A log filter that redacts the query of every argument that is a path (an
    access log line's request target: uvicorn passes it as an argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(map(_is_target, record.args)):
            record.args = tuple(
                redact_query(arg) if isinstance(arg, str) and _is_target(arg) else arg
                for arg in record.args
            )
        return True


def _is_target(arg: object) -> bool:
    return isinstance(arg, str) and arg.startswith("/") and "?" in arg
