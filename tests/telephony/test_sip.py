"""The SIP user agent against real SIP peers nobody here wrote: baresip (a
softphone) and SIPp (scenarios written below), with a real gateway on loopback
whose upstreams are the scripted fakes of tests/gateway/fakes.py (no models:
the fake frontend echoes each caller frame back as agent audio, so what the
phone says comes back to it) and the real Redis for the session records.

Each call goes INVITE -> the service -> a Converse call -> the gateway, and
back as RTP: what the phone hears, the keys it pressed, how each side's hang-up
ends the other, what is refused and how."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from aiosipua import parse_sdp

from kame_cli.bench.baresip import Baresip, write_wav
from kame_common.server import ServiceRuntime
from services.telephony.config import TelephonySettings
from services.telephony.playout import PCMA, PCMU
from services.telephony.service import Telephony
from services.telephony.sip import SipCall, SipServer
from services.telephony.sip_dtmf import KeysOut
from services.telephony.sip_media import (
    CLOCK_RATE,
    G711Passthrough,
    MediaChoice,
    PhoneRtp,
    choose_media,
    on_hold,
)
from tests.gateway.fakes import FakeFrontend, Fakes
from tests.support import wait_until
from tests.telephony.sip_support import (
    ACK_ERROR,
    CANCEL,
    SIPP_PCAPS,
    SippResult,
    answered,
    in_dialog,
    invite_scenario,
    request,
    scenario,
    sdp,
    sipp,
)

# ---- the service behind the phone -----------------------------------------------


@dataclass
class Rig:
    """The shared fakes (tests/conftest.py), a real gateway in front of them, and
    the SIP servers the test started."""

    fakes: Fakes
    gateway: ServiceRuntime | None = None
    sips: list[SipServer] = field(default_factory=list)

    @property
    def frontend(self) -> FakeFrontend:
        return self.fakes.frontend

    async def start_gateway(self, **overrides: object) -> ServiceRuntime:
        # With the gateway's own input pacing, which a phone's real-time audio meets.
        self.gateway = await self.fakes.gateway(**{"input_burst_s": 2.0, **overrides})
        return self.gateway

    async def sip(self, **overrides: object) -> SipServer:
        if self.gateway is None:
            await self.start_gateway()
        assert self.gateway is not None
        fields: dict[str, object] = {
            "host": "127.0.0.1",
            "sip_port": 0,
            "metrics_port": 0,
            "gateway_address": self.gateway.address,
            "playout_prebuffer_ms": 60,
        }
        telephony = Telephony(TelephonySettings(**{**fields, **overrides}))  # type: ignore[arg-type]
        server = SipServer(telephony)
        await server.start()
        self.sips.append(server)
        return server

    async def record(self, session_id: str) -> dict[str, str]:
        return await self.fakes.session_record(session_id)

    async def close(self) -> None:
        """The SIP servers; the gateway and the fakes stop with the `fakes` fixture."""
        for server in self.sips:
            await server.stop()
            await server.telephony.aclose()


@pytest.fixture
async def rig(fakes: Fakes) -> AsyncIterator[Rig]:
    fakes.frontend.speak_at = 0  # every echoed frame is agent speech
    made = Rig(fakes)
    try:
        yield made
    finally:
        await made.close()


def tone(seconds: float, hz: float = 300.0, lead_s: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * CLOCK_RATE)) / CLOCK_RATE
    return np.concatenate(
        [
            np.zeros(int(lead_s * CLOCK_RATE), np.float32),
            (0.4 * np.sin(2 * np.pi * hz * t)).astype(np.float32),
        ]
    )


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum[1:])) + 1])


async def one_session(sip: SipServer) -> str:
    """The session id of the one call in progress, once the gateway started it."""
    await wait_until(
        lambda: any(c.call and c.call.session_id for c in sip.calls.values()), "the session"
    )
    (sip_call,) = sip.calls.values()
    assert sip_call.call is not None
    return sip_call.call.session_id


async def all_ended(rig: Rig, sip: SipServer) -> None:
    await wait_until(lambda: not sip.calls and not sip.telephony.calls, "the SIP call to end")
    assert rig.gateway is not None
    await wait_until(lambda: rig.gateway.active_sessions == 0, "the gateway session to end")


# ---- baresip ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def baresip_call(
    sip: SipServer, directory: Path, seconds: float
) -> AsyncIterator[tuple[Baresip, dict]]:
    """baresip playing a 300 Hz tone of `seconds` (the fake frontend echoes it back as
    agent audio), in a call to `sip` once established; the phone and that event."""
    phone = await Baresip(write_wav(directory / "tone.wav", tone(seconds))).start()
    try:
        await phone.dial(f"sip:agent@127.0.0.1:{sip.port}")
        yield phone, await phone.wait_for("CALL_ESTABLISHED")
    finally:
        await phone.close()


async def test_a_baresip_call_hears_the_agent_presses_keys_and_hangs_up(rig, tmp_path):
    sip = await rig.sip()
    # 300 Hz for the whole call: the fake frontend echoes it back as agent audio.
    async with baresip_call(sip, tmp_path, 12.0) as (phone, _):
        session_id = await one_session(sip)
        (sip_call,) = sip.calls.values()
        assert sip_call.media.codec is PCMU  # baresip offers PCMU first; so do we

        # Keys, as RFC 4733 events: each once, in order, in the session record.
        await phone.send_digits("12#")
        await wait_until(
            lambda: sip_call.call is not None and sip_call.call.dtmf_echoed == ["1", "2", "#"],
            "the gateway to echo three keys",
        )
        record = await rig.record(session_id)
        assert len(record["dtmf"]) == 3  # each key once (the gateway may mask the digits)
        assert record["call_provider"] == "sip"
        assert record["call_caller"] == "sip:caller@127.0.0.1"
        assert record["call_callee"].startswith("sip:agent@127.0.0.1")
        assert record["call_provider_call_id"] == sip_call.call_id

        # Three seconds of agent audio, then the phone hangs up: both legs end, and
        # every session with them.
        assert sip_call.rtp is not None
        await wait_until(lambda: sip_call.rtp.stats["packets_sent"] >= 150, "3 s of agent audio")
        await phone.hang_up()
        await phone.wait_for("CALL_CLOSED")
        await all_ended(rig, sip)
        assert sip.telephony.idle.is_set()
        heard, rate = phone.heard()
        loud = heard[np.abs(heard) > 0.05]
        assert len(loud) > rate, "baresip heard less than a second of agent audio"
        assert abs(dominant_hz(heard, rate) - 300) < 15


async def test_on_hold_no_agent_audio_goes_out(rig, tmp_path):
    sip = await rig.sip()
    async with baresip_call(sip, tmp_path, 20.0) as (phone, _):
        await one_session(sip)
        (sip_call,) = sip.calls.values()
        # baresip re-INVITEs with sendonly): no agent audio goes out meanwhile.
        assert sip_call.rtp is not None
        await wait_until(lambda: sip_call.rtp.stats["packets_sent"] > 10, "agent audio")
        await phone.command("hold")
        await wait_until(lambda: sip_call.held, "the call to be on hold")
        held_at = sip_call.rtp.stats["packets_sent"]
        await asyncio.sleep(0.5)
        assert sip_call.rtp.stats["packets_sent"] == held_at
        await phone.command("resume")
        await wait_until(lambda: not sip_call.held, "the call to resume")
        await wait_until(lambda: sip_call.rtp.stats["packets_sent"] > held_at + 10, "audio again")

        await phone.hang_up()
        await phone.wait_for("CALL_CLOSED")
        await all_ended(rig, sip)


async def test_the_agent_side_ending_the_call_hangs_baresip_up(rig, tmp_path):
    await rig.start_gateway(max_session_s=2.0)
    sip = await rig.sip()
    async with baresip_call(sip, tmp_path, 20.0) as (phone, established):
        closed = await phone.wait_for("CALL_CLOSED", timeout_s=10)
        # The gateway's cap, not the 20 s file, ended the call: our BYE did.
        assert closed["at"] - established["at"] < 6.0
        await all_ended(rig, sip)


async def test_stopping_the_server_hangs_up_open_calls(rig, tmp_path):
    sip = await rig.sip()
    async with baresip_call(sip, tmp_path, 20.0) as (phone, _):
        await one_session(sip)
        await sip.stop()
        await phone.wait_for("CALL_CLOSED", timeout_s=5)
        await all_ended(rig, sip)


async def test_a_second_call_over_max_sessions_is_busy(rig, tmp_path):
    sip = await rig.sip(max_sessions=1)
    async with baresip_call(sip, tmp_path, 20.0) as _:
        result = await sipp(invite_scenario(expect=486), f"127.0.0.1:{sip.port}", tmp_path)
        assert result.passed, result.output


# ---- SIPp ---------------------------------------------------------------------------


async def sipp_sampling(
    xml: str, sip: SipServer, tmp_path: Path, sample: Callable[[], None]
) -> SippResult:
    """Run a SIPp scenario against `sip`, calling `sample` every 50 ms while it runs
    (to see what the service held during the call)."""

    async def watch() -> None:
        while True:
            sample()
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        return await sipp(xml, f"127.0.0.1:{sip.port}", tmp_path)
    finally:
        watcher.cancel()


async def test_refusals_and_options(rig, tmp_path):
    outsiders = await rig.sip(allowed_networks="10.0.0.0/8")
    sip = await rig.sip()
    cases = {
        "network": (invite_scenario(403), outsiders),
        "codec": (invite_scenario(488, formats="9 101"), sip),
        "options": (
            scenario(request("OPTIONS"), '  <recv response="200"/>\n'),
            sip,
        ),
    }
    for name, (xml, server) in cases.items():
        workdir = tmp_path / name
        workdir.mkdir()
        result = await sipp(xml, f"127.0.0.1:{server.port}", workdir)
        assert result.passed, (name, result.output)
    assert not sip.calls and not outsiders.calls
    assert rig.gateway is not None and rig.gateway.active_sessions == 0


async def test_a_call_cancelled_while_ringing_ends_its_session(rig, tmp_path):
    # The frontend never gets ready: the gateway never starts the session, so the
    # phone rings until the caller gives up.
    rig.frontend.silent_start = True
    sip = await rig.sip()
    xml = scenario(
        request("INVITE", sdp()),
        '  <recv response="100" optional="true"/>\n',
        '  <recv response="180"/>\n',
        '  <pause milliseconds="300"/>\n',
        CANCEL,
        '  <recv response="200"/>\n',
        '  <recv response="487"/>\n',
        ACK_ERROR,
    )
    calls_seen: list[int] = []
    result = await sipp_sampling(
        xml, sip, tmp_path, lambda: calls_seen.append(len(sip.telephony.calls))
    )
    assert result.passed, result.output
    assert max(calls_seen) == 1  # the Converse call was under way while it rang
    await all_ended(rig, sip)


async def test_a_cancel_that_crosses_the_answer_leaves_the_call_standing(rig, tmp_path):
    sip = await rig.sip()
    xml = scenario(
        request("INVITE", sdp()),
        '  <recv response="100" optional="true"/>\n',
        '  <recv response="180" optional="true"/>\n',
        '  <recv response="200" rrs="true"/>\n',
        CANCEL,  # too late: the call was answered
        '  <recv response="200"/>\n',
        in_dialog("ACK", 1),
        '  <pause milliseconds="300"/>\n',
        in_dialog("BYE", 2),
        '  <recv response="200"/>\n',  # not 481: the dialog is still known
    )
    result = await sipp(xml, f"127.0.0.1:{sip.port}", tmp_path)
    assert result.passed, result.output
    await all_ended(rig, sip)


async def test_a_session_the_gateway_refuses_is_never_answered(rig, tmp_path):
    # The frontend refuses: the gateway ends the Converse call before it starts a
    # session, so the phone, still ringing, gets 503 instead of a call that is
    # answered and hung up at once.
    rig.frontend.refuse = grpc.StatusCode.UNAVAILABLE
    sip = await rig.sip()
    xml = scenario(
        request("INVITE", sdp()),
        '  <recv response="100" optional="true"/>\n',
        '  <recv response="180" optional="true"/>\n',
        '  <recv response="503"/>\n',
        ACK_ERROR,
    )
    result = await sipp(xml, f"127.0.0.1:{sip.port}", tmp_path)
    assert result.passed, result.output
    await all_ended(rig, sip)


async def test_keys_from_sipp_reach_the_session_once_each(rig, tmp_path):
    sip = await rig.sip()
    pcaps = [SIPP_PCAPS / f"dtmf_2833_{key}.pcap" for key in ("1", "2", "pound")]
    play = "".join(
        f'  <nop><action><exec play_pcap_audio="{pcap}"/></action></nop>\n'
        '  <pause milliseconds="400"/>\n'
        for pcap in pcaps
    )
    xml = scenario(
        *answered(),
        play,
        '  <pause milliseconds="300"/>\n',
        in_dialog("BYE", 2),
        '  <recv response="200"/>\n',
    )
    session_ids: list[str] = []

    def sample() -> None:
        session_ids.extend(
            c.call.session_id for c in sip.calls.values() if c.call and c.call.session_id
        )

    result = await sipp_sampling(xml, sip, tmp_path, sample)
    assert result.passed, result.output
    assert session_ids
    record = await rig.record(session_ids[0])
    # Three end packets per key, each key once (the gateway may mask the digits).
    assert len(record["dtmf"]) == 3
    await all_ended(rig, sip)
    # SIPp sent keys and no audio: silence stood in for it, so the gateway went on
    # answering frame for frame through the ~1.5 s call (80 ms frames).
    assert len(rig.frontend.log.of("audio")) >= 12


# ---- pieces -------------------------------------------------------------------------


OFFER = """\
v=0
o=- 1 1 IN IP4 127.0.0.1
s=-
c=IN IP4 127.0.0.1
t=0 0
m=audio 4000 RTP/AVP {formats}
{extra}
"""


def offer(formats: str, extra: str = "") -> object:
    return parse_sdp(OFFER.format(formats=formats, extra=extra))


def test_the_codec_is_ours_to_choose_among_those_offered():
    both = offer("8 0 96", "a=rtpmap:96 telephone-event/8000")
    assert choose_media(both, ["PCMU", "PCMA"]) == MediaChoice(PCMU, 0, 96)
    assert choose_media(both, ["PCMA", "PCMU"]) == MediaChoice(PCMA, 8, 96)
    assert choose_media(offer("0"), ["PCMA"]) is None
    assert choose_media(offer("9 101"), ["PCMU", "PCMA"]) is None
    assert choose_media(offer("0"), ["PCMU"]) == MediaChoice(PCMU, 0, 101)
    assert on_hold(offer("0", "a=sendonly")) and on_hold(offer("0", "a=inactive"))
    assert not on_hold(offer("0", "a=sendrecv")) and not on_hold(offer("0"))


async def test_agent_packets_are_rtp_with_marker_and_timestamps():
    """What the leg puts on the wire: the codec's payload type, +160 per packet
    even across a hold, the marker bit where each talk spurt starts."""
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.setblocking(False)
    rtp = await PhoneRtp.create(
        local_addr=("127.0.0.1", 0),
        remote_addr=receiver.getsockname(),
        payload_type=8,
        codec=G711Passthrough("PCMA"),
    )
    leg = SipCall.__new__(SipCall)  # the leg's media half alone: no dialog
    leg.rtp, leg.answered, leg.held = rtp, True, False
    leg._talking, leg._restart = False, True
    leg.keys_out = KeysOut()  # no keys pressed
    try:
        plan = [
            (b"\xd5", False),
            (b"\x01", True),
            (b"\x02", True),
            (b"\xd5", False),
            (b"\x03", True),
        ]
        for byte, speaking in plan:
            await leg.send_audio(byte * 160, speaking)
        leg.held = True
        await leg.send_audio(b"\x04" * 160, True)  # on hold: not sent, time passes
        leg.held = False
        await leg.send_audio(b"\x05" * 160, True)
        await asyncio.sleep(0.05)
        packets = []
        while True:
            try:
                packets.append(receiver.recv(2048))
            except BlockingIOError:
                break
    finally:
        await rtp.close()
        receiver.close()
    headers = [struct.unpack("!BBHI", p[:8]) for p in packets if p[1] & 0x7F == 8]
    assert [len(p) - 12 for p in packets if p[1] & 0x7F == 8] == [160] * 6
    markers = [b1 >> 7 for _, b1, _, _ in headers]
    assert markers == [1, 1, 0, 0, 1, 1]  # first packet, speech starts twice, after hold
    stamps = [ts for *_, ts in headers]
    assert [b - a for a, b in itertools.pairwise(stamps)] == [160, 160, 160, 160, 320]
    sequence = [seq for _, _, seq, _ in headers]
    assert [(b - a) % 65536 for a, b in itertools.pairwise(sequence)] == [1] * 5
