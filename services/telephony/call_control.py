"""Call control: the agent ends the call, transfers it, or presses keys (#33).

The request comes from the gateway (the oracle's built-in tools); what it asks
is a plain `CallControlRequest`, and `act` does it on one phone call, whatever
its protocol, under the operator's `CallControlPolicy`:

- each action only when the operator listed it in `call_control` (none by
  default), and a transfer only to a target in `transfer_targets` (its name or
  its URI; the phone is sent the operator's URI, never the request's words);
- `hang_up`: the agent's last words play out first (bounded), then the call
  ends as when the gateway ends it (SIP BYE, Twilio socket closed, AudioSocket
  hang-up packet);
- `transfer`: the protocol's leg does it. SIP: a REFER (sip_transfer.py), the
  result once the phone reported the outcome: success ends our side of the
  call, a failure leaves the call going on. Twilio: the stream closes and
  Twilio is told to <Dial> the target (twilio_transfer.py); AudioSocket cannot;
- `send_dtmf`: the leg presses the keys towards the phone (SIP: RFC 4733
  events in the call's RTP, sip_dtmf.py); Twilio and AudioSocket cannot.
  The keys of one request must match the operator's `dtmf_send_allowed`
  whole (digits only by default: `*` and `#` reach a PBX's features, a
  transfer or an outside line, and the model may choose keys after reading
  a tool's output or a caller's words), and a call presses at most
  `dtmf_send_max_keys` in all.

A refusal or failure is a `CallControlResult` with ok False and words the
agent can say ("the transfer to sales failed: 486 Busy Here"); nothing raises
out of `act`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kame_client.client import DTMF_KEYS
from services.telephony import metrics
from services.telephony.call import PhoneCall
from services.telephony.config import (
    CALL_CONTROL_ACTIONS,
    DEFAULT_DTMF_SEND_ALLOWED,
    TelephonySettings,
    TransferTarget,
    transfer_targets,
)

log = logging.getLogger(__name__)

# Keys one request may press.
MAX_DIGITS = 32
# A hang-up waits for the agent's last words (the goodbye a model says before
# it calls hang_up): the tts voices them once the caller's turn has ended, which
# the front-end may decide after the oracle, on the final transcript, has
# already made the call; then the tts takes a moment more. So: up to
# HANG_UP_SPEECH_WAIT_S for agent speech to start, then until none has been
# queued for HANG_UP_QUIET_S (gaps between phrases are shorter), at most
# HANG_UP_PLAYOUT_MAX_S in all. The function's answer does not wait for this
# (call_functions.ANSWER_WITHIN_S).
HANG_UP_SPEECH_WAIT_S = 5.0
HANG_UP_QUIET_S = 1.0
HANG_UP_PLAYOUT_MAX_S = 10.0


# What each protocol can do at all (the README's table says why the rest cannot).
CAPABILITIES = {
    "sip": frozenset({"hang_up", "transfer", "send_dtmf"}),
    "twilio": frozenset({"hang_up", "transfer"}),
    "audiosocket": frozenset({"hang_up"}),
}


@dataclass(frozen=True)
class CallControlRequest:
    """What the agent asks of the call."""

    action: str  # one of CALL_CONTROL_ACTIONS: "hang_up", "transfer", "send_dtmf"
    target: str = ""  # transfer: a name or URI from transfer_targets
    digits: str = ""  # send_dtmf: keys 0-9, *, #, A-D
    reason: str = ""  # hang_up: why, for the log


@dataclass(frozen=True)
class CallControlResult:
    """What came of a request: `detail` says it in words (for the agent and the log)."""

    ok: bool
    detail: str
    refused: bool = False  # refused before anything was tried (not enabled, not listed)


class CallControlError(Exception):
    """The call cannot do what was asked (its protocol has no such thing, the phone
    refused, it failed); the call goes on."""


@runtime_checkable
class ControlledLeg(Protocol):
    """What a protocol's leg does beyond hanging up."""

    async def transfer(self, target_uri: str) -> str:
        """Send the phone to `target_uri`; words for the outcome once the phone
        reported success (the call then ends). CallControlError if it failed."""

    async def send_dtmf(self, digits: str) -> None:
        """Press `digits` towards the phone; returns once they are sent."""


@dataclass(frozen=True)
class CallControlPolicy:
    """What the operator lets the agent do: `actions` (none by default) and where
    a call may be transferred to."""

    actions: frozenset[str] = frozenset()
    targets: tuple[TransferTarget, ...] = ()
    dtmf_allowed: str = DEFAULT_DTMF_SEND_ALLOWED  # what one send_dtmf's keys must match
    dtmf_max_keys: int = MAX_DIGITS  # keys sent in one call, all requests together

    @classmethod
    def from_settings(cls, settings: TelephonySettings) -> CallControlPolicy:
        return cls(
            settings.call_control_actions,
            tuple(transfer_targets(settings.transfer_targets)),
            settings.dtmf_send_allowed,
            settings.dtmf_send_max_keys,
        )

    def offered(self, provider: str) -> tuple[list[str], list[str]]:
        """What the agent of a `provider` call may be offered: the actions enabled
        and possible on its protocol (in CALL_CONTROL_ACTIONS' order), and the
        transfer targets' names (the URIs stay here)."""
        possible = self.actions & CAPABILITIES.get(provider, frozenset())
        actions = [action for action in CALL_CONTROL_ACTIONS if action in possible]
        names = [t.name for t in self.targets] if "transfer" in possible else []
        return actions, names

    def target(self, wanted: str) -> TransferTarget | None:
        """The allowed target named or addressed by `wanted`, if any."""
        wanted = wanted.strip()
        return next((t for t in self.targets if wanted in (t.name, t.uri)), None)

    def refusal(self, request: CallControlRequest) -> str:
        """Why `request` is refused before anything is sent ("" = it may go on)."""
        if request.action not in self.actions:
            return f"{request.action or 'no action'} is not enabled on this line"
        if request.action == "transfer" and self.target(request.target) is None:
            names = ", ".join(t.name for t in self.targets)
            return f"{request.target!r} is not a transfer target (allowed: {names})"
        if request.action == "send_dtmf":
            digits = request.digits.upper()
            # The words name no key: they are logged (the keys may be a PIN).
            if not 0 < len(digits) <= MAX_DIGITS or not set(digits) <= DTMF_KEYS:
                return f"send 1 to {MAX_DIGITS} keys of 0-9, *, #, A-D"
            if not re.fullmatch(self.dtmf_allowed, digits):
                return (
                    f"these {len(digits)} keys may not be pressed on this line (the keys "
                    f"allowed match {self.dtmf_allowed})"
                )
        return ""

    def keys_refusal(self, call: PhoneCall, digits: str) -> str:
        """Why `call` may not press `digits` more ("" = it may): its cap."""
        if call.agent_keys_sent + len(digits) > self.dtmf_max_keys:
            return (
                f"this call may press at most {self.dtmf_max_keys} keys in all "
                f"({call.agent_keys_sent} pressed already)"
            )
        return ""


async def act(
    call: PhoneCall, request: CallControlRequest, policy: CallControlPolicy
) -> CallControlResult:
    """Do `request` on `call` if `policy` allows it; the result in words."""
    info = call.info
    result = await _act(call, request, policy)
    # Keys pressed may be a PIN or an account number: their count at INFO only.
    said = f"sent {len(request.digits)} keys" if request.digits and result.ok else result.detail
    log.info(
        "%s call %s: call control %s: %s",
        info.provider,
        info.provider_call_id,
        request.action,
        said,
    )
    if request.digits:
        log.debug("%s call %s: keys %s", info.provider, info.provider_call_id, request.digits)
    outcome = "done" if result.ok else "refused" if result.refused else "failed"
    action = request.action if request.action in CALL_CONTROL_ACTIONS else "other"
    metrics.CALL_CONTROL.labels(info.provider, action, outcome).inc()
    return result


async def _act(
    call: PhoneCall, request: CallControlRequest, policy: CallControlPolicy
) -> CallControlResult:
    if refusal := policy.refusal(request):
        return CallControlResult(False, f"refused: {refusal}", refused=True)
    if not call.started.is_set() or call.ended is not None:
        return CallControlResult(False, "refused: the call is not in progress", refused=True)
    try:
        if request.action == "hang_up":
            await hang_up_after_playout(call, request.reason or "the agent hung up")
            return CallControlResult(True, "hung up")
        leg = call.leg
        if request.action == "transfer":
            target = policy.target(request.target)
            assert target is not None  # refusal() checked it
            if not isinstance(leg, ControlledLeg):
                raise CallControlError(f"{call.info.provider} calls cannot be transferred")
            return CallControlResult(True, await leg.transfer(target.uri))
        if not isinstance(leg, ControlledLeg):
            raise CallControlError(f"{call.info.provider} calls cannot send keys")
        if refusal := policy.keys_refusal(call, request.digits):
            return CallControlResult(False, f"refused: {refusal}", refused=True)
        call.agent_keys_sent += len(request.digits)
        await leg.send_dtmf(request.digits.upper())
        return CallControlResult(True, f"sent {request.digits.upper()}")
    except CallControlError as error:
        return CallControlResult(False, str(error))


async def hang_up_after_playout(call: PhoneCall, reason: str) -> None:
    """End the call once the agent's speech has started and played out (a goodbye
    said just before is heard whole), or when none starts in time."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    spoke_at: float | None = None  # the last time agent speech was queued
    while loop.time() < started + HANG_UP_PLAYOUT_MAX_S and call.ended is None:
        now = loop.time()
        if call.playout.speech_queued:
            spoke_at = now
        elif spoke_at is None and now - started >= HANG_UP_SPEECH_WAIT_S:
            break  # no last words
        elif spoke_at is not None and now - spoke_at >= HANG_UP_QUIET_S:
            break  # they have played
        await asyncio.sleep(0.02)
    call.hang_up(reason)
