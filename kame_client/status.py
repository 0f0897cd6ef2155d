"""How a Converse call ended, as each edge says it: the one mapping of the
gateway's gRPC status.

`CallEnd.of` reads a failed call once: its code, its details, the gateway's
`retry-after-s` hint (trailing metadata, sent with UNAVAILABLE while the stack
starts and RESOURCE_EXHAUSTED while it is full) and whether the gateway was
reached at all. Then each edge takes its own words from it:

- `message`: what a person reads (the web page, the Realtime and Moshi
  protocols' errors): what happened in words, then the details, internal
  addresses redacted (the gateway redacts its own already; this also covers
  what gRPC itself writes, "ipv4:10.0.0.5:50051: Connection refused"); a
  gateway never reached is said in words only;
- `close_code`: the WebSocket close code (RFC 6455, 7.4.1);
- `error_type`: the Realtime protocol's error type (the client's fault or the
  server's);
- `sip_refusal`: the SIP response to a ringing phone, with Retry-After.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import grpc

from kame_common.redact import redact_addresses

# A gateway that refuses a call for now (not ready, at capacity) says when to try
# again in this trailing metadata (services/gateway/plan.py SessionError).
RETRY_AFTER_KEY = "retry-after-s"
# A longer hint is taken for this: neither a person nor a phone network's retry
# header should be told "come back tomorrow".
MAX_RETRY_AFTER_S = 3600.0
# What grpc.aio reports, as INTERNAL, when a write of the caller's was under way as
# the call ended (grpc/grpc#36066): the gateway's own status is lost.
CORE_INTERNAL_DETAILS = "Internal error from Core"
# The refusals the gateway sends a hint with.
RETRYABLE = frozenset((grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED))


class CloseCode(IntEnum):
    """WebSocket close codes (RFC 6455, 7.4.1)."""

    NORMAL_CLOSURE = 1000
    UNSUPPORTED_DATA = 1003
    INVALID_PAYLOAD = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013


# What a person is told for each way the gateway can end a call.
HINTS = {
    "UNAUTHENTICATED": "auth refused: the gateway wants a valid access token",
    "UNAVAILABLE": "the call broke off (the gateway is draining, or a service behind it failed)",
    "RESOURCE_EXHAUSTED": "the agent is busy",
    "INVALID_ARGUMENT": "the gateway refused the settings",
    "OUT_OF_RANGE": "the conversation reached its length limit",
    "DEADLINE_EXCEEDED": "the gateway timed out",
}
# ... for a refusal with a hint: the stack is still starting (its services do not
# serve yet), or it is full. The gateway's details say which.
RETRY_HINTS = {
    "UNAVAILABLE": "the agent is not ready yet",
    "RESOURCE_EXHAUSTED": "the agent is busy",
}
UNREACHABLE = "gateway down: the web service gets no answer from the gateway"
# How each status closes a WebSocket (others: INTERNAL_ERROR).
CLOSE_OF_STATUS = {
    "OK": CloseCode.NORMAL_CLOSURE,
    "OUT_OF_RANGE": CloseCode.NORMAL_CLOSURE,  # the conversation reached its length limit
    "UNAUTHENTICATED": CloseCode.POLICY_VIOLATION,
    "PERMISSION_DENIED": CloseCode.POLICY_VIOLATION,
    "INVALID_ARGUMENT": CloseCode.POLICY_VIOLATION,
    "RESOURCE_EXHAUSTED": CloseCode.TRY_AGAIN_LATER,
    "UNAVAILABLE": CloseCode.TRY_AGAIN_LATER,
}
# The statuses that are the client's doing (the Realtime protocol's
# invalid_request_error; the others are server_error).
CLIENT_STATUSES = frozenset(
    ("UNAUTHENTICATED", "INVALID_ARGUMENT", "PERMISSION_DENIED", "OUT_OF_RANGE")
)
# A ringing phone hears this whatever the gateway's reason: nothing it can change.
SIP_REFUSAL = (503, "Service Unavailable")


def retry_after_s(exc: grpc.aio.AioRpcError) -> float | None:
    """The gateway's hint (`retry-after-s`) of when to call again, when it refused
    the call for now and sent a readable one (a finite number of seconds, not
    negative), at most MAX_RETRY_AFTER_S."""
    if exc.code() not in RETRYABLE:
        return None
    for key, value in exc.trailing_metadata() or ():
        if key != RETRY_AFTER_KEY:
            continue
        try:
            hint = float(value)
        except (TypeError, ValueError):
            return None
        return min(hint, MAX_RETRY_AFTER_S) if math.isfinite(hint) and hint >= 0 else None
    return None


@dataclass(frozen=True)
class CallEnd:
    """How the gateway ended (or refused) a call."""

    code: grpc.StatusCode
    details: str = ""  # the status's own words, unredacted (for the log)
    retry_after_s: float | None = None
    # The gateway was reached (not a connection that never came up); a hint says
    # so too, as only the gateway sends one.
    reached: bool = True

    @classmethod
    def of(cls, exc: grpc.aio.AioRpcError, channel: grpc.aio.Channel | None = None) -> CallEnd:
        """`exc`'s status; `channel`, the call's, tells whether the gateway was reached."""
        hint = retry_after_s(exc)
        connected = channel is None or channel.get_state() == grpc.ChannelConnectivity.READY
        return cls(exc.code(), exc.details() or "", hint, connected or hint is not None)

    @property
    def name(self) -> str:
        return self.code.name

    @property
    def cancelled(self) -> bool:
        """Our side cancelled the call (the client went away): nobody to tell."""
        return self.code == grpc.StatusCode.CANCELLED

    @property
    def unreachable(self) -> bool:
        return self.code == grpc.StatusCode.UNAVAILABLE and not self.reached

    def summary(self) -> str:
        """`CODE: details`, for a log line or a call record."""
        return f"{self.name}: {self.details}"

    def message(self) -> str:
        """What a person is told: in words, then the details (addresses redacted);
        with a hint, when to try again."""
        if self.unreachable:
            return UNREACHABLE  # gRPC's details name the addresses it tried
        details = redact_addresses(self.details)
        if self.retry_after_s is not None and self.name in RETRY_HINTS:
            return f"{RETRY_HINTS[self.name]}: try again in {self.retry_after_s:g} s ({details})"
        return f"{HINTS.get(self.name, self.name)}: {details}"

    @property
    def close_code(self) -> CloseCode:
        return CLOSE_OF_STATUS.get(self.name, CloseCode.INTERNAL_ERROR)

    @property
    def error_type(self) -> str:
        """The Realtime protocol's error type."""
        return "invalid_request_error" if self.name in CLIENT_STATUSES else "server_error"


def sip_refusal(end: CallEnd | None) -> tuple[int, str, dict[str, str]]:
    """The SIP final response to a phone still ringing whose call the gateway
    ended (`end`; None: it never started one): 503, with Retry-After (whole
    seconds, at least 1) when the gateway said when to try again."""
    status, phrase = SIP_REFUSAL
    if end is None or end.retry_after_s is None:
        return status, phrase, {}
    return status, phrase, {"Retry-After": str(max(1, math.ceil(end.retry_after_s)))}
