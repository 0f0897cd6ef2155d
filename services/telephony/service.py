"""What the three protocols share on one replica: the channel to the gateway,
who may call (admission), the calls in progress (for the gauge and a drain), and
what the agent may do to them (call control)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kame_common.server import ACTIVE_SESSIONS
from kamepb import gateway_pb2
from services.telephony import metrics
from services.telephony.call import CallInfo, CallSettings, Ended, PhoneCall, PhoneLeg
from services.telephony.call_control import CallControlPolicy
from services.telephony.call_functions import CallFunctions
from services.telephony.config import TelephonySettings
from services.telephony.playout import PhoneCodec


class Telephony:
    def __init__(self, settings: TelephonySettings) -> None:
        self.settings = settings
        self.channel = settings.gateway_channel(settings.connection_policy())
        self.call_settings = CallSettings(
            mode=gateway_pb2.ConverseConfig.Mode.Value(settings.mode.upper()),
            auth_token=settings.gateway_auth_token,
            prebuffer_ms=settings.playout_prebuffer_ms,
            max_queued_ms=settings.playout_max_ms,
            dtmf_rate_per_s=settings.dtmf_rate_per_s,
            dtmf_burst=settings.dtmf_burst,
        )
        self.call_control = CallControlPolicy.from_settings(settings)
        self.calls: set[PhoneCall] = set()
        # Calls admitted and not yet over, whether or not their Converse call runs
        # yet: what max_sessions counts (see admit()).
        self.slots = 0
        self.draining = False
        self.idle = asyncio.Event()  # set while no call is open
        self.idle.set()
        # Told of each call once it is over (its playout stats, its turns): how a
        # load bench in the same process (kame_cli/bench/sip_load.py) reads them.
        self.on_call_ended: Callable[[PhoneCall], None] | None = None
        self._gauge = ACTIVE_SESSIONS.labels(service="telephony")

    def refusal(self, provider: str, peer_ip: str | None = None) -> str:
        """Why a new call would be refused ("" = it may go on): `peer_ip` not in
        allowed_networks (SIP, AudioSocket), draining, or every slot taken. Counted.
        Only a check (Twilio's webhook, before its stream comes): a call takes its
        slot with admit()."""
        reason = ""
        if peer_ip is not None and not self.settings.caller_allowed(peer_ip):
            reason = "network"
        elif self.draining:
            reason = "draining"
        elif self.settings.max_sessions and self.slots >= self.settings.max_sessions:
            reason = "busy"
        if reason:
            self.refused(provider, reason)
        return reason

    def admit(self, provider: str, peer_ip: str | None = None) -> str:
        """refusal(), and a slot taken when there is none: the check and the count in
        one step, with no await between, so a burst of calls that arrive together
        cannot all pass max_sessions before any of them runs. The caller must
        release() the slot once the call is over, or refused on other grounds."""
        reason = self.refusal(provider, peer_ip)
        if not reason:
            self.slots += 1
        return reason

    def release(self) -> None:
        """Give back the slot an admit() took."""
        self.slots -= 1

    def refused(self, provider: str, reason: str) -> None:
        metrics.REFUSED_CALLS.labels(provider, reason).inc()

    def new_call(self, info: CallInfo, codec: PhoneCodec, leg: PhoneLeg) -> PhoneCall:
        """A call that offers the agent the call control its protocol allows and
        the operator enabled, as client functions (call_functions.py)."""
        functions = CallFunctions(self.call_control, info.provider)
        return PhoneCall(self.channel, self.call_settings, info, codec, leg, functions)

    async def run(self, call: PhoneCall) -> Ended:
        """Run `call` to its end, counted among the open calls meanwhile."""
        self.calls.add(call)
        self._gauge.set(len(self.calls))
        self.idle.clear()
        try:
            return await call.run()
        finally:
            self.calls.discard(call)
            self._gauge.set(len(self.calls))
            if not self.calls:
                self.idle.set()
            if self.on_call_ended is not None:
                self.on_call_ended(call)

    def hang_up_all(self, reason: str = "the telephony service is stopping") -> None:
        """Hang up every open call: each phone is told (SIP BYE, Twilio socket closed,
        AudioSocket hang-up)."""
        for call in list(self.calls):
            call.hang_up(reason)

    async def aclose(self) -> None:
        await self.channel.close()
