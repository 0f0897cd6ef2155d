"""Transferring a Twilio call: what the agent's transfer asks of Twilio.

A Media Stream has no message that moves the call; new TwiML does. Without an
operator credential (the REST API's call update needs the account SID and auth
token), the one way in is `<Connect action="after">` on the webhook's TwiML:
when the stream closes, Twilio asks `POST /twilio/after` (signed like the voice
webhook) what comes next. For a call the agent transferred, the answer is
`<Dial>` to the operator's URI (`tel:` as `<Number>`, `sip:` as `<Sip>`);
for any other, `<Hangup/>`, as a call without the action would end.
"""

from __future__ import annotations

import time

from twilio.twiml.voice_response import Dial, VoiceResponse

AFTER_PATH = "/twilio/after"
# <Connect action>, relative: the voice webhook's URL with its last step replaced,
# so a proxy's path prefix is kept.
AFTER_ACTION = "after"
# Twilio asks within a second or so of the stream closing; a transfer not asked
# for after this is forgotten.
TRANSFER_TTL_S = 60.0


class Transfers:
    """CallSids the agent transferred, each with where to, until Twilio asks. Per
    replica, like StreamClaims: keep a call's webhook, stream and action on one."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[str, float]] = {}  # CallSid -> (URI, deadline)

    def add(self, call_sid: str, uri: str) -> None:
        self._pending[call_sid] = (uri, time.monotonic() + TRANSFER_TTL_S)

    def take(self, call_sid: str) -> str | None:
        """The URI `call_sid` is to be dialled to (once), if it was transferred."""
        now = time.monotonic()
        self._pending = {sid: p for sid, p in self._pending.items() if p[1] >= now}
        pending = self._pending.pop(call_sid, None)
        return pending[0] if pending is not None else None


def dial_twiml(uri: str) -> str:
    """`<Dial>` to a transfer target's URI (transfer_targets: sip:, sips: or tel:)."""
    response = VoiceResponse()
    dial = Dial()
    if uri.lower().startswith("tel:"):
        dial.number(uri[len("tel:") :])
    else:
        dial.sip(uri)
    response.append(dial)
    return str(response)


def hangup_twiml() -> str:
    response = VoiceResponse()
    response.hangup()
    return str(response)
