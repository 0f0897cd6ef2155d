"""Attacks on the SIP side, each performed against the real service (a real gateway
behind it, the fakes of tests/gateway/fakes.py upstream) with real SIP peers:
SIPp for the phone, a stranger's UDP socket spraying RTP, INVITEs written by
hand where a burst or a response header is the point.

- RTP from anyone but the phone (another port, another SSRC) reaches no call;
- an INVITE whose media address is outside allowed_networks is refused (we
  would send RTP there);
- a burst of INVITEs passes max_sessions no more than one at a time does;
- a gateway that refuses the call for now gets the ringing phone 503 with
  Retry-After;
- a phone that stops sending RTP (not on hold), or stops refreshing its session
  timer, is hung up with BYE."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid
from dataclasses import dataclass, field

import aiortp
import numpy as np

from kame_common.audio import pcm16_to_float, rms_dbfs
from services.telephony.sip import SipCall, SipServer
from services.telephony.sip_media import CLOCK_RATE, G711Passthrough, PhoneRtp
from tests.gateway import test_admission
from tests.support import wait_until
from tests.support.metrics import metric
from tests.telephony import test_sip
from tests.telephony.phone_support import refused
from tests.telephony.sip_support import (
    BYE_200,
    SIPP_PCAPS,
    answered,
    in_dialog,
    invite_scenario,
    request,
    scenario,
    sdp,
    sipp,
)
from tests.telephony.test_sip import all_ended

# The SIP tests' rig (a gateway on the shared fakes, SIP servers), and the stt and
# oracle capacity registries of the admission tests.
rig = test_sip.rig
registries = test_admission.registries

DTMF_PT = 101  # sdp()'s telephone-event


# ---- RTP by hand --------------------------------------------------------------------


def rtp_packet(payload_type: int, seq: int, timestamp: int, ssrc: int, payload: bytes) -> bytes:
    return struct.pack("!BBHII", 0x80, payload_type, seq & 0xFFFF, timestamp, ssrc) + payload


def loud_pcmu(seconds: float, hz: float = 1000.0) -> list[bytes]:
    """A loud tone as 20 ms PCMU payloads (G.711 mu-law by formula)."""
    t = np.arange(int(seconds * CLOCK_RATE)) / CLOCK_RATE
    x = 0.8 * np.sin(2 * np.pi * hz * t)
    magnitude = np.log1p(255 * np.abs(x)) / np.log1p(255)
    code = np.where(x < 0, 0x7F, 0xFF) - np.round(magnitude * 127).astype(int)
    data = code.astype(np.uint8).tobytes()
    return [data[i : i + 160] for i in range(0, len(data) - 159, 160)]


def key_event(digit: int, end: bool, duration: int) -> bytes:
    """An RFC 4733 telephone-event payload."""
    return struct.pack("!BBH", digit, (0x80 if end else 0) | 10, duration)


async def spray(target: tuple[str, int], sock: socket.socket, ssrc: int, seconds: float) -> None:
    """Speech and key 9 (RFC 4733: a start packet, three end packets) at `target`
    from `sock`, as a stranger who found the RTP port would send them."""
    seq, stamp = 1000, 50_000
    for index, payload in enumerate(loud_pcmu(seconds)):
        sock.sendto(rtp_packet(0, seq, stamp, ssrc, payload), target)
        seq, stamp = seq + 1, stamp + 160
        if index % 10 == 5:  # a key press every 200 ms
            for end, duration in ((False, 160), (True, 800), (True, 800), (True, 800)):
                sock.sendto(
                    rtp_packet(DTMF_PT, seq, stamp, ssrc, key_event(9, end, duration)), target
                )
                seq += 1
        await asyncio.sleep(0.02)


def udp_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def answered_call(sip: SipServer) -> SipCall | None:
    return next((c for c in sip.calls.values() if c.answered and c.rtp is not None), None)


def dropped_rtp(reason: str) -> float:
    return metric("kame_telephony_dropped_rtp_packets_total", reason=reason)


# ---- SIP by hand --------------------------------------------------------------------


@dataclass
class RawPhone:
    """INVITEs written by hand over one UDP socket, and the responses they get: a
    burst at once (SIPp runs a scenario's calls one after another) and response
    headers in full."""

    target: int  # the SIP port of the service on loopback
    sock: socket.socket = field(default_factory=udp_socket)
    responses: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)

    def invite(self, call_id: str, media_ip: str = "127.0.0.1", media_port: int = 4000) -> None:
        body = (
            f"v=0\r\no=raw 1 1 IN IP4 {media_ip}\r\ns=-\r\nc=IN IP4 {media_ip}\r\nt=0 0\r\n"
            f"m=audio {media_port} RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
            "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
        )
        local = self.sock.getsockname()[1]
        tag = uuid.uuid4().hex[:10]
        head = [
            f"INVITE sip:agent@127.0.0.1:{self.target} SIP/2.0",
            f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bK{tag}",
            f"From: <sip:raw@127.0.0.1>;tag={tag}",
            f"To: <sip:agent@127.0.0.1:{self.target}>",
            f"Call-ID: {call_id}",
            "CSeq: 1 INVITE",
            f"Contact: <sip:raw@127.0.0.1:{local}>",
            "Max-Forwards: 70",
            "Content-Type: application/sdp",
            f"Content-Length: {len(body)}",
        ]
        message = "\r\n".join(head) + "\r\n\r\n" + body
        self.sock.sendto(message.encode(), ("127.0.0.1", self.target))

    def read(self) -> None:
        """Every response that has arrived, by Call-ID."""
        while True:
            try:
                data = self.sock.recv(65536).decode(errors="replace")
            except BlockingIOError:
                return
            head = data.split("\r\n\r\n", 1)[0].split("\r\n")
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            status = int(head[0].split()[1])
            self.responses.setdefault(headers.get("call-id", ""), []).append((status, headers))

    def statuses(self, call_id: str) -> list[int]:
        self.read()
        return [status for status, _ in self.responses.get(call_id, [])]

    def final(self, call_id: str) -> tuple[int, dict[str, str]] | None:
        self.read()
        return next((r for r in self.responses.get(call_id, []) if r[0] >= 200), None)

    def close(self) -> None:
        self.sock.close()


# ---- RTP injection ------------------------------------------------------------------


async def test_a_stranger_spraying_rtp_at_a_live_call_is_not_heard(rig, tmp_path):
    """A live SIPp call (SIPp sends no RTP: silence stands in), and a stranger on an
    allowed network, on another port than the phone's SDP named, sprays the
    call's RTP port with loud speech and key 9. The gateway hears neither."""
    sip = await rig.sip()
    xml = scenario(
        *answered(),
        '  <pause milliseconds="3000"/>\n',
        in_dialog("BYE", 2),
        '  <recv response="200"/>\n',
    )
    before = dropped_rtp("source")
    phone = asyncio.create_task(sipp(xml, f"127.0.0.1:{sip.port}", tmp_path))
    stranger = udp_socket()
    try:
        await wait_until(lambda: answered_call(sip) is not None, "the call to be answered")
        sip_call = answered_call(sip)
        assert sip_call is not None and sip_call.call is not None
        await spray(("127.0.0.1", sip_call.rtp_port), stranger, ssrc=0x5EED, seconds=1.5)
        result = await phone
    finally:
        stranger.close()
    assert result.passed, result.output
    await all_ended(rig, sip)

    assert sip_call.call.dtmf_echoed == []
    record = await rig.record(sip_call.call.session_id)
    assert record.get("dtmf", "") == ""
    heard = pcm16_to_float(b"".join(frame.pcm for frame in rig.frontend.log.of("audio")))
    assert len(heard) > 24_000  # a second and more of caller audio reached the frontend
    assert rms_dbfs(heard) < -60, "the stranger's speech reached the gateway"
    assert dropped_rtp("source") >= before + 75


async def test_another_ssrc_from_the_phones_own_address_is_dropped_until_a_reinvite():
    """The gate on the call's RTP session: the phone's address with its first SSRC
    is heard; another SSRC from that same address (a spoofed source) is not; a
    re-INVITE (update_remote) lets the phone's stream start anew."""
    phone, stranger = udp_socket(), udp_socket()
    # A free port pair, as SipServer takes one, so that we know where to send.
    port, _ = await aiortp.PortAllocator((40000, 40999)).allocate()
    target = ("127.0.0.1", port)
    rtp = await PhoneRtp.create(
        local_addr=target,
        remote_addr=phone.getsockname(),
        payload_type=0,
        codec=G711Passthrough("PCMU"),
        jitter_prefetch=1,
        skip_audio_gaps=True,
        plc=False,
    )
    assert isinstance(rtp, PhoneRtp)
    heard: list[bytes] = []
    rtp.on_audio = lambda payload, _ts: heard.append(payload[:1])
    rtp.gate.expect(phone.getsockname())

    async def burst(sock: socket.socket, ssrc: int, byte: bytes, first_seq: int) -> None:
        for seq in range(first_seq, first_seq + 6):
            sock.sendto(rtp_packet(0, seq, 160 * seq, ssrc, byte * 160), target)
        await asyncio.sleep(0.1)

    try:
        await burst(phone, 0xA, b"\x01", 1)
        await burst(phone, 0xB, b"\x02", 500)  # same address, another SSRC
        await burst(stranger, 0xA, b"\x03", 7)  # the phone's SSRC, another port
        assert set(heard) == {b"\x01"}, heard
        rtp.update_remote(phone.getsockname())  # a re-INVITE
        await burst(phone, 0xB, b"\x04", 900)
        assert b"\x04" in heard and b"\x02" not in heard and b"\x03" not in heard
        assert rtp.gate.dropped == {"ssrc": 6, "source": 6}
    finally:
        await rtp.close()
        phone.close()
        stranger.close()


async def test_an_invite_whose_media_address_is_not_allowed_is_refused(rig, tmp_path):
    """A spoofed INVITE from an allowed network naming a third party's address for
    the media: answered, we would send RTP there (a reflector)."""
    sip = await rig.sip()
    before = refused("sip", "media")
    xml = invite_scenario(488).replace("c=IN IP4 [media_ip]", "c=IN IP4 192.0.2.10")
    result = await sipp(xml, f"127.0.0.1:{sip.port}", tmp_path)
    assert result.passed, result.output
    assert refused("sip", "media") == before + 1
    assert not sip.calls and sip.telephony.slots == 0


# ---- admission ----------------------------------------------------------------------


async def test_a_burst_of_invites_passes_max_sessions_no_more_than_calls_one_by_one(rig):
    # The gateway never starts the sessions: the admitted calls stay ringing.
    rig.frontend.silent_start = True
    sip = await rig.sip(max_sessions=2)
    raw = RawPhone(sip.port)
    call_ids = [f"burst-{index}-{uuid.uuid4().hex[:6]}" for index in range(10)]
    try:
        for call_id in call_ids:
            raw.invite(call_id)
        await wait_until(
            lambda: sum(raw.final(c) is not None for c in call_ids) >= 8, "the refusals", 5.0
        )
        await asyncio.sleep(0.3)  # any more answers that would come
        ringing = [c for c in call_ids if 180 in raw.statuses(c) and raw.final(c) is None]
        busy = [c for c in call_ids if (raw.final(c) or (0,))[0] == 486]
        assert (len(ringing), len(busy)) == (2, 8), {c: raw.statuses(c) for c in call_ids}
        assert sip.telephony.slots == 2
    finally:
        raw.close()
        await sip.stop()
    assert sip.telephony.slots == 0


# ---- the gateway refuses ------------------------------------------------------------


async def test_a_gateway_at_capacity_gets_the_ringing_phone_503_with_retry_after(rig, registries):
    """stt has no free session: the gateway refuses the call with RESOURCE_EXHAUSTED
    and retry-after-s 3, which the phone hears as 503 with Retry-After: 3."""
    await registries["stt"].publish("stt-a", "10.0.0.1:50053", free_slots=0, total_slots=3)
    sip = await rig.sip()
    raw = RawPhone(sip.port)
    call_id = f"refused-{uuid.uuid4().hex[:8]}"
    try:
        raw.invite(call_id)
        await wait_until(lambda: raw.final(call_id) is not None, "a final response", 8.0)
        final = raw.final(call_id)
    finally:
        raw.close()
    assert final is not None
    status, headers = final
    assert status == 503, final
    assert headers.get("retry-after") == "3", headers
    await all_ended(rig, sip)


# ---- vanished phones ----------------------------------------------------------------


async def test_a_phone_that_stops_sending_rtp_is_hung_up_with_bye(rig, tmp_path):
    """SIPp sends a key's RTP, then nothing, and never hangs up: with rtp_timeout_s
    1, our BYE comes about a second after its last packet."""
    sip = await rig.sip(rtp_timeout_s=1.0)
    xml = scenario(
        *answered(),
        f'  <nop><action><exec play_pcap_audio="{SIPP_PCAPS / "dtmf_2833_1.pcap"}"/>'
        "</action></nop>\n",
        '  <recv request="BYE" timeout="6000"/>\n',
        BYE_200,
    )
    started = time.monotonic()
    result = await sipp(xml, f"127.0.0.1:{sip.port}", tmp_path)
    assert result.passed, result.output
    assert time.monotonic() - started < 5.0
    await all_ended(rig, sip)


async def test_a_call_on_hold_is_not_hung_up_for_its_silence(rig, tmp_path):
    sip = await rig.sip(rtp_timeout_s=0.5)
    held = sdp().replace("a=sendrecv", "a=inactive")
    xml = scenario(
        *answered(),
        in_dialog("INVITE", 2, held),
        '  <recv response="200"/>\n',
        in_dialog("ACK", 2),
        '  <pause milliseconds="2000"/>\n',
        in_dialog("BYE", 3),
        '  <recv response="200"/>\n',  # not 481: the call was still there
    )
    result = await sipp(xml, f"127.0.0.1:{sip.port}", tmp_path)
    assert result.passed, result.output
    await all_ended(rig, sip)


async def test_a_session_timer_nobody_refreshes_ends_the_call_with_bye(rig, tmp_path):
    """The phone asks for session timers (Session-Expires 4 s, it refreshes) and
    never refreshes: the answer carries the interval, and our BYE comes once it
    has run out (RFC 4028: 4 - 4/3 s after the answer)."""
    sip = await rig.sip(rtp_timeout_s=0, sip_min_se_s=1)
    invite = request("INVITE", sdp()).replace(
        "Max-Forwards: 70", "Max-Forwards: 70\nSupported: timer\nSession-Expires: 4;refresher=uac"
    )
    check = (
        '  <recv response="200" rrs="true">\n'
        '    <action><ereg regexp="4;refresher=uac" search_in="hdr" header="Session-Expires:"'
        ' check_it="true" assign_to="expires"/>'
        '<log message="Session-Expires: [$expires]"/></action>\n'
        "  </recv>\n"
    )
    xml = scenario(
        *answered(invite, check),
        '  <recv request="BYE" timeout="8000"/>\n',
        BYE_200,
    )
    started = time.monotonic()
    result = await sipp(xml, f"127.0.0.1:{sip.port}", tmp_path)
    assert result.passed, result.output
    assert 2.0 < time.monotonic() - started < 7.0
    await all_ended(rig, sip)
