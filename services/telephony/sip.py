"""SIP user agent: phones and trunks call in over UDP, each call one Converse call.

Signalling is aiosipua's (transactions, dialogs, SDP offer/answer), media
aiortp's (RTP/RTCP sockets, a reordering jitter buffer, RFC 4733 telephone
events); services/telephony/README.md says why these. Per INVITE:

- admission first: a peer outside allowed_networks gets 403, a full or
  draining replica 486 / 503 (the slot is taken in the same step as the check),
  an offer without PCMU or PCMA, or whose media address is outside
  allowed_networks (we would send RTP there), 488;
- otherwise an RTP port pair from rtp_port_first..last, a PhoneCall in the
  offered G.711 codec (passed through as is: the gateway decodes G.711 itself),
  180 Ringing, and 200 OK with our SDP once the gateway has started the
  session (a gateway that refuses the call gets the phone a 503, not a call
  that is answered and hung up at once; with Retry-After when the gateway
  said when to retry);
- caller RTP only from the address and port the SDP named, with one SSRC
  (sip_media's MediaGate; anyone else's packets are dropped), through aiortp's
  jitter buffer (in order, lost packets skipped) to `caller_audio`, each
  telephone event once (at its end) to `caller_dtmf`;
- a phone that sends no RTP for rtp_timeout_s while not holding the call,
  or (session timers, RFC 4028) does not refresh the session in time, is gone:
  BYE;
- agent audio as 20 ms RTP packets, timestamps +160 each, the marker bit at
  the start of each talk spurt; nothing is sent while the phone holds the call
  (a re-INVITE with sendonly or inactive);
- a BYE from the phone ends the Converse call; our side ending it (the
  gateway's end, `stop()`) sends BYE, repeated until answered as RFC 3261 asks
  of UDP;
- call control (call_control.py): a transfer is a REFER to the phone
  (sip_transfer.py: its answer and NOTIFYs; success, our BYE), keys the agent
  presses are RFC 4733 events in place of audio packets (sip_dtmf.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiortp
from aiosipua import (
    IncomingCall,
    SdpMessage,
    SdpNegotiationError,
    SipRequest,
    SipResponse,
    SipUAC,
    SipUAS,
)

from kame_client.client import DTMF_KEYS
from kame_client.status import sip_refusal
from kame_common.aio import cancel_and_wait
from services.telephony.call import CallInfo, PhoneCall
from services.telephony.call_control import CallControlError
from services.telephony.playout import PACKET_S
from services.telephony.service import Telephony
from services.telephony.sip_adapter import UdpTransport, check_private_names, restore_dialog
from services.telephony.sip_dtmf import KeysOut, offers_telephone_events
from services.telephony.sip_media import (
    CLOCK_RATE,
    MediaChoice,
    PhoneRtp,
    choose_media,
    describe_stats,
    media_moves_to,
    media_refusal,
    on_hold,
    sdp_answer,
)
from services.telephony.sip_transfer import Transfer

log = logging.getLogger(__name__)

PROVIDER = "sip"
USER_AGENT = "kame-telephony"
# Caller audio this late is taken for missing, and silence goes in its place.
CALLER_GAP_S = 0.1
# What a refused INVITE is answered with, by Telephony.refusal's reason.
REFUSALS = {
    "network": (403, "Forbidden"),
    "busy": (486, "Busy Here"),
    "draining": (503, "Service Unavailable"),
    "codec": (488, "Not Acceptable Here"),
    "media": (488, "Not Acceptable Here"),
}
# BYE over UDP is retransmitted from T1 doubling up to T2 until answered, for at
# most 64 * T1 (RFC 3261 17.1.2.2).
T1_S, T2_S = 0.5, 4.0
BYE_GIVE_UP_S = 64 * T1_S
STOP_WAIT_S = 5.0


class SipCall:
    """One phone call: the SIP dialog, its RTP session and the PhoneCall between
    them. It is the call's PhoneLeg."""

    def __init__(self, server: SipServer, invite: IncomingCall, media: MediaChoice) -> None:
        self.server = server
        self.invite = invite
        self.media = media
        self.rtp_port = 0
        self.rtp: PhoneRtp | None = None
        self.call: PhoneCall | None = None
        self.answered = False
        self.held = False
        self.phone_gone = False  # BYE or CANCEL from the phone
        self.bye_sent = False
        self._talking = False  # the last packet sent carried agent speech
        self._restart = True  # the next packet sent starts a talk spurt
        self._sdp_version = 0
        # The caller's side of the call in our clock's seconds: how far its
        # audio (or silence standing in for it) has reached the PhoneCall.
        self._caller_until = 0.0
        # Since when the phone is due to send RTP (the answer, a resume).
        self._media_expected_since = time.monotonic()
        self.transfer_now: Transfer | None = None  # a REFER under way
        self.keys_out = KeysOut()  # keys the agent presses, in place of audio

    @property
    def call_id(self) -> str:
        return self.invite.call_id

    # ---- the PhoneLeg ---------------------------------------------------------

    async def send_audio(self, packet: bytes, speaking: bool) -> None:
        if self.rtp is None:
            return
        if self.held or not self.answered:
            self.rtp.skip_packet()
            self._restart = True
            return
        if self.keys_out.pending and self.keys_out.send_due(self.rtp, self.media.dtmf_payload_type):
            self._restart = True  # the audio after a key starts a talk spurt
            return
        marker = self._restart or (speaking and not self._talking)
        self._talking, self._restart = speaking, False
        self.rtp.send_packet(packet, marker)

    async def clear(self) -> None:
        """Nothing to do: RTP has no queue at the far end beyond its own small
        jitter buffer, and the playout was flushed."""

    async def hang_up(self, reason: str) -> None:
        log.info("sip call %s: hanging up: %s", self.call_id, reason)
        self.end_here()

    # ---- call control -----------------------------------------------------------

    def _in_progress(self) -> bool:
        return self.answered and not (self.phone_gone or self.bye_sent) and self.call is not None

    async def transfer(self, target_uri: str) -> str:
        """REFER the phone to `target_uri` and wait for its outcome: success ends the
        call here (BYE); anything else is a CallControlError, the call going on."""
        if not self._in_progress():
            raise CallControlError("the call is not in progress")
        if self.transfer_now is not None:
            raise CallControlError("a transfer is already under way")
        transfer = self.transfer_now = Transfer(target_uri)
        try:
            self.server.send_refer(self, transfer)
            outcome = await transfer.outcome()
        finally:
            self.transfer_now = None
        progress = ", ".join(transfer.progress) or "none"
        log.info("sip call %s: transfer: %s (NOTIFYs: %s)", self.call_id, outcome, progress)
        if not (outcome.succeeded or outcome.status == 0):
            raise CallControlError(f"the transfer to {target_uri} failed: {outcome.describe()}")
        assert self.call is not None
        self.call.hang_up(f"transferred to {target_uri}")  # BYE, if the phone has not
        return f"transferred to {target_uri} ({outcome.describe()})"

    async def send_dtmf(self, digits: str) -> None:
        """Press `digits` towards the phone as RFC 4733 events; back once sent."""
        if not self._in_progress():
            raise CallControlError("the call is not in progress")
        if not offers_telephone_events(self.invite.sdp_offer):
            raise CallControlError("the phone did not offer telephone-event (RFC 4733) keys")
        if self.held:
            raise CallControlError("the phone holds the call: no keys can be sent now")
        await self.keys_out.press(digits)  # KeysOut.cancel() ends it with the call
        if not self._in_progress():
            raise CallControlError("the call ended before the keys were sent")

    # ---- the dialog -------------------------------------------------------------

    def end_here(self) -> None:
        """Our side ends the call: BYE once answered, 503 while still ringing (with
        Retry-After when the gateway refused the call for now and said when)."""
        if self.phone_gone or self.bye_sent:
            return
        self.keys_out.cancel()
        if self.answered:
            self.bye_sent = True
            self.server.send_bye(self.invite)
            return
        self.phone_gone = True  # the INVITE is over either way
        status, phrase, headers = sip_refusal(self.call.end if self.call is not None else None)
        self.server.reject(self.invite, status, phrase, headers)

    def phone_hung_up(self) -> None:
        self.phone_gone = True
        self.keys_out.cancel()
        if self.transfer_now is not None:
            self.transfer_now.phone_gone()
        if self.call is not None:
            self.call.caller_hung_up()

    def answer(self, offer: SdpMessage) -> None:
        """200 OK with our answer to `offer` (the INVITE's or a re-INVITE's)."""
        self._sdp_version += 1
        local = (self.server.settings.advertised_ip, self.rtp_port)
        self.invite.accept(sdp_answer(offer, self.media, local, self._sdp_version))
        self.answered = True
        self._media_expected_since = time.monotonic()  # RTP is due from now (a resume too)

    def reinvite(self) -> None:
        """A new offer in the dialog: hold, resume, or a new address for the media."""
        offer = self.invite.sdp_offer
        if offer is None or self.rtp is None:
            self.invite.accept(self.invite.sdp_answer)  # no offer: the last answer stands
            return
        held, moving_to = on_hold(offer), media_moves_to(offer)
        if moving_to is not None and not self.server.settings.caller_allowed(moving_to[0]):
            log.warning("sip call %s: re-INVITE to media at %s refused", self.call_id, moving_to)
            self.server.reject(self.invite, 488, "Not Acceptable Here", end_dialog=False)
            return
        try:
            self.answer(offer)
        except SdpNegotiationError:
            self.server.reject(self.invite, 488, "Not Acceptable Here", end_dialog=False)
            return
        self.held = held
        if moving_to is not None:
            self.rtp.update_remote(moving_to)
        log.info("sip call %s: %s", self.call_id, "on hold" if self.held else "resumed")

    # ---- media from the phone -----------------------------------------------------

    def on_audio(self, payload: bytes, _timestamp: int) -> None:
        if self.call is None:
            return
        now = asyncio.get_running_loop().time()
        self._caller_until = max(self._caller_until, now - CALLER_GAP_S) + len(payload) / CLOCK_RATE
        self.call.caller_audio(payload)

    async def fill_caller_silence(self) -> None:
        """Silence in place of caller audio that does not come: the gateway answers
        each caller frame with an agent frame, so a phone that stops sending (silence
        suppression, a key's RFC 4733 packets replacing audio, lost packets, hold)
        must not stop the agent's voice. Runs from the answer to the end."""
        assert self.call is not None
        loop = asyncio.get_running_loop()
        silence = self.media.codec.silence(self.media.codec.packet_bytes)
        self._caller_until = loop.time()
        while True:
            await asyncio.sleep(PACKET_S)
            while self._caller_until < loop.time() - CALLER_GAP_S:
                self.call.caller_audio(silence)
                self._caller_until += PACKET_S

    async def watch_media(self, timeout_s: float) -> None:
        """Hang up a call whose phone has sent no RTP for `timeout_s` while not
        holding it: the phone vanished without a BYE (crashed, lost its network,
        a NAT forgot it), and silence filled in for it would keep the call, its
        gateway session and a slot for an hour. Runs from the answer to the end."""
        assert self.rtp is not None and self.call is not None
        while True:
            await asyncio.sleep(min(1.0, timeout_s / 4))
            if self.held:
                continue
            last = max(self.rtp.gate.last_packet_at, self._media_expected_since)
            if time.monotonic() - last >= timeout_s:
                why = f"no RTP from the phone for {timeout_s:g} s"
                log.warning("sip call %s: %s: hanging up", self.call_id, why)
                self.call.hang_up(why)
                return

    def on_dtmf(self, digit: str, duration: int) -> None:
        """An RFC 4733 event has ended (aiortp reports each once, whatever number
        of end packets repeat it); its duration is in timestamp units."""
        if self.call is not None and digit in DTMF_KEYS:
            self.call.caller_dtmf(digit, duration * 1000 // CLOCK_RATE)


class SipServer:
    """The SIP side of the telephony service: one UDP socket for signalling, an RTP
    port pair per call."""

    def __init__(self, telephony: Telephony) -> None:
        self.telephony = telephony
        self.settings = telephony.settings
        self.port = 0
        self.calls: dict[str, SipCall] = {}  # by Call-ID, from INVITE to the end
        # Pairs (RTP even, RTCP the odd one above) within first..last; aiortp's
        # allocator probes each and never hands the same pair out twice.
        self._ports = aiortp.PortAllocator(
            (self.settings.rtp_port_first, self.settings.rtp_port_last)
        )
        self._transport: UdpTransport | None = None
        self._uas: SipUAS | None = None
        self._uac: SipUAC | None = None  # builds our in-dialog REFERs
        # What the UAS does with a message (its handler, which its start() installed
        # as the transport's on_message): ours takes BYE responses first.
        self._uas_receive: Callable[[SipRequest | SipResponse, tuple[str, int]], None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._byes: dict[str, asyncio.Task[None]] = {}  # Call-ID -> BYE until answered

    async def start(self) -> None:
        check_private_names()  # an upgraded aiosipua or aiortp: a clear error now
        self._transport = UdpTransport(local_addr=(self.settings.host, self.settings.sip_port))
        # Session timers (RFC 4028) are aiosipua's: it takes the INVITE's
        # Session-Expires and refresher (422 below min_se), answers with them,
        # refreshes with UPDATE when the role is ours, and sends BYE when the
        # phone's refresh does not come (on_session_expired).
        uas = SipUAS(
            self._transport,
            user_agent=USER_AGENT,
            session_expires=self.settings.sip_session_expires_s or None,
            min_se=self.settings.sip_min_se_s,
        )
        uas.on_invite = self._on_invite
        uas.on_reinvite = self._on_reinvite
        uas.on_bye = self._on_bye
        uas.on_cancel = self._on_cancel
        uas.on_ack_timeout = self._on_ack_timeout
        uas.on_session_expired = self._on_session_expired
        uas.on_transfer_progress = self._on_transfer_progress
        await uas.start()
        self._uas = uas
        self._uas_receive = self._transport.on_message
        assert self._uas_receive is not None, "aiosipua's SipUAS.start set no on_message"
        self._transport.on_message = self._on_message
        self.port = self._transport.bound_port
        # Contact and Via name where phones reach us, not the address we bind.
        uas.advertised_addr = (self.settings.advertised_ip, self.port)
        self._uac = SipUAC(self._transport, advertised_addr=uas.advertised_addr)

    async def stop(self) -> None:
        """Hang up every open call (BYE), then close the socket."""
        for sip_call in list(self.calls.values()):
            sip_call.end_here()
            sip_call.phone_hung_up()  # ends the Converse call; the BYE is out already
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=STOP_WAIT_S)
        await cancel_and_wait(list(self._tasks) + list(self._byes.values()))
        if self._uas is not None:
            await self._uas.stop()

    # ---- requests ----------------------------------------------------------------

    def _on_message(self, message: SipRequest | SipResponse, addr: tuple[str, int]) -> None:
        """Responses to our BYEs stop their retransmission, those to our REFERs go to
        the transfer; the UAS takes the requests."""
        if isinstance(message, SipResponse):
            method = message.cseq.method.upper() if message.cseq is not None else ""
            call_id, status = message.call_id or "", message.status_code
            if method == "BYE" and status >= 200:
                task = self._byes.pop(call_id, None)
                if task is not None:
                    task.cancel()
            sip_call = self.calls.get(call_id)
            if method == "REFER" and sip_call is not None and sip_call.transfer_now is not None:
                assert message.cseq is not None
                sip_call.transfer_now.answered(message.cseq.seq, status, message.reason_phrase)
            return
        assert self._uas_receive is not None
        self._uas_receive(message, addr)

    def _on_invite(self, invite: IncomingCall) -> None:
        call_id = invite.call_id
        if call_id in self.calls:
            # A retransmitted INVITE (our 100 Trying crossed it): aiosipua made a
            # new dialog for it; the call goes on with the one it has.
            assert self._uas is not None
            restore_dialog(self._uas, self.calls[call_id].invite)
            return
        peer = invite.source_addr[0]
        reason = self.telephony.admit(PROVIDER, peer)
        if reason:
            self._refuse(invite, reason)
            return
        media = choose_media(invite.sdp_offer, self.settings.codec_choices)
        if reason := media_refusal(invite.sdp_offer, media, self.settings.caller_allowed):
            self.telephony.release()  # the slot admit() took
            self.telephony.refused(PROVIDER, reason)
            self._refuse(invite, reason)
            return
        assert media is not None
        honour_min_se(invite)
        sip_call = SipCall(self, invite, media)
        self.calls[call_id] = sip_call
        task = asyncio.ensure_future(self._run(sip_call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse(self, invite: IncomingCall, reason: str) -> None:
        status, phrase = REFUSALS.get(reason, (503, "Service Unavailable"))
        log.info("sip: refused %s from %s: %s", invite.call_id, invite.source_addr[0], reason)
        invite.reject(status, phrase)

    def _on_reinvite(self, invite: IncomingCall) -> None:
        sip_call = self.calls.get(invite.call_id)
        if sip_call is None or not sip_call.answered:
            self.reject(invite, 491, "Request Pending", end_dialog=False)
            return
        sip_call.reinvite()

    def _on_bye(self, invite: IncomingCall, _request: SipRequest) -> None:
        sip_call = self.calls.get(invite.call_id)
        if sip_call is not None:
            log.info("sip call %s: the phone hung up", invite.call_id)
            sip_call.phone_hung_up()

    def _on_cancel(self, request: SipRequest, _addr: tuple[str, int]) -> None:
        # aiosipua has answered 487 to the INVITE (it was not answered yet).
        sip_call = self.calls.get(request.call_id or "")
        if sip_call is None:
            return
        if sip_call.answered:
            # The CANCEL crossed our 200 OK: the call stands (the phone will send
            # BYE), but aiosipua forgot its dialog, and with it the ACK and BYE.
            assert self._uas is not None
            restore_dialog(self._uas, sip_call.invite)
            return
        log.info("sip call %s: cancelled by the phone", sip_call.call_id)
        sip_call.phone_hung_up()

    def _on_session_expired(self, invite: IncomingCall) -> None:
        # No refresh within the session interval: aiosipua has sent BYE (once).
        sip_call = self.calls.get(invite.call_id)
        if sip_call is not None and sip_call.call is not None:
            log.warning("sip call %s: the session timer expired: BYE sent", invite.call_id)
            sip_call.bye_sent = True
            sip_call.call.hang_up("the session timer expired (no refresh from the phone)")

    def _on_transfer_progress(self, call_id: str, status: int, reason: str) -> None:
        # A NOTIFY's sipfrag (aiosipua has answered it 200).
        sip_call = self.calls.get(call_id)
        if sip_call is not None and sip_call.transfer_now is not None:
            sip_call.transfer_now.notified(status, reason)

    def _on_ack_timeout(self, invite: IncomingCall) -> None:
        # Our 200 OK was never acknowledged: the phone is not there.
        sip_call = self.calls.get(invite.call_id)
        if sip_call is not None:
            log.warning("sip call %s: no ACK for our 200 OK", invite.call_id)
            sip_call.phone_hung_up()

    # ---- one call ----------------------------------------------------------------

    async def _run(self, sip_call: SipCall) -> None:
        """The call from its admission (a slot taken) to its end (the slot given back)."""
        try:
            await self._run_admitted(sip_call)
        finally:
            self.telephony.release()

    async def _run_admitted(self, sip_call: SipCall) -> None:
        try:
            sip_call.rtp_port, _ = await self._ports.allocate()
        except RuntimeError:
            self.calls.pop(sip_call.call_id, None)
            first, last = self.settings.rtp_port_first, self.settings.rtp_port_last
            log.warning("sip: no free RTP port pair in %d..%d", first, last)
            self.telephony.refused(PROVIDER, "busy")
            sip_call.end_here()
            return
        try:
            await self._bridge(sip_call)
        except Exception:
            log.exception("sip call %s failed", sip_call.call_id)
            sip_call.end_here()
        finally:
            self.calls.pop(sip_call.call_id, None)
            if sip_call.rtp is not None:
                log.info("sip call %s: rtp %s", sip_call.call_id, describe_stats(sip_call.rtp))
                await sip_call.rtp.close()
            await self._ports.release(sip_call.rtp_port)

    async def _bridge(self, sip_call: SipCall) -> None:
        invite, media = sip_call.invite, sip_call.media
        offer = invite.sdp_offer
        assert offer is not None and offer.rtp_address is not None
        local = (self.settings.host, sip_call.rtp_port)
        rtp = await PhoneRtp.for_call(invite.call_id, media, local, offer.rtp_address)
        sip_call.rtp = rtp
        info = CallInfo(
            provider=PROVIDER,
            caller=invite.caller,
            callee=invite.callee or invite.invite.uri,
            provider_call_id=invite.call_id,
        )
        call = self.telephony.new_call(info, media.codec, sip_call)
        sip_call.call = call
        rtp.on_audio = sip_call.on_audio
        rtp.on_dtmf = sip_call.on_dtmf
        if sip_call.phone_gone:  # cancelled while the RTP port was bound
            return
        invite.ringing()
        running = asyncio.ensure_future(self.telephony.run(call))
        started = asyncio.ensure_future(call.started.wait())
        helpers: list[asyncio.Future[None]] = []
        try:
            await asyncio.wait([running, started], return_when=asyncio.FIRST_COMPLETED)
            if started.done() and not sip_call.phone_gone:
                sip_call.answer(offer)
                helpers.append(asyncio.ensure_future(sip_call.fill_caller_silence()))
                if self.settings.rtp_timeout_s:
                    watch = sip_call.watch_media(self.settings.rtp_timeout_s)
                    helpers.append(asyncio.ensure_future(watch))
                log.info(
                    "sip call %s answered (%s, session %s)",
                    invite.call_id,
                    media.codec.name,
                    call.session_id,
                )
                log.debug("sip call %s is from %s", invite.call_id, invite.caller)
            await running
        finally:
            await cancel_and_wait([running, started, *helpers])
        sip_call.end_here()  # ended on our side (stop, a drain): the phone is told

    # ---- sending -------------------------------------------------------------------

    def reject(
        self,
        invite: IncomingCall,
        status: int,
        phrase: str,
        headers: dict[str, str] | None = None,
        end_dialog: bool = True,
    ) -> None:
        """A final error response to the INVITE (or, `end_dialog` False, to a
        re-INVITE: the call goes on), with `headers`: aiosipua's
        IncomingCall.reject takes none, and would end the dialog of a re-INVITE."""
        if self._transport is None:
            return
        response = invite.dialog.create_response(invite.invite, status, phrase)
        response.headers.set_single("User-Agent", USER_AGENT)
        for name, value in (headers or {}).items():
            response.headers.set_single(name, value)
        self._transport.send_reply(response)
        if end_dialog:
            invite.dialog.terminate()

    def send_bye(self, invite: IncomingCall) -> None:
        bye = invite.hangup()
        if bye is None or self._transport is None:
            return
        task = asyncio.ensure_future(self._repeat(bye, invite.source_addr))
        self._byes[invite.call_id] = task
        task.add_done_callback(lambda _: self._byes.pop(invite.call_id, None))

    def send_refer(self, sip_call: SipCall, transfer: Transfer) -> None:
        """The REFER of `transfer` in the call's dialog, repeated until answered."""
        if self._uac is None or self._transport is None:
            raise CallControlError("the SIP service is stopping")
        invite = sip_call.invite
        try:
            refer = self._uac.send_refer(invite.dialog, transfer.target, invite.source_addr)
        except ValueError as error:  # the dialog is not (or no longer) confirmed
            raise CallControlError(f"the call cannot be transferred now: {error}") from None
        transfer.sent(refer, asyncio.ensure_future(self._repeat(refer, invite.source_addr)))

    async def _repeat(self, request: SipRequest, addr: tuple[str, int]) -> None:
        """Retransmit `request` until its answer cancels this task, or give up."""
        interval, waited = T1_S, 0.0
        while waited < BYE_GIVE_UP_S:
            await asyncio.sleep(interval)
            waited += interval
            if self._transport is None or not self._transport.is_open:
                return
            self._transport.send(request, addr)
            interval = min(2 * interval, T2_S)


def honour_min_se(invite: IncomingCall) -> None:
    """An INVITE without Session-Expires gets our interval from aiosipua, which does
    not look at its Min-SE: RFC 4028 forbids answering with less."""
    raw = invite.invite.get_header("min-se") or ""
    min_se = raw.split(";")[0].strip()
    if invite.session_interval and min_se.isascii() and min_se.isdigit():
        invite.session_interval = max(invite.session_interval, int(min_se))
