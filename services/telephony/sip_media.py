"""A SIP call's media: what the phone offers and what we take from it.

- `choose_media`: the codec (PCMU or PCMA, in the order of sip_codecs) and the
  payload types both ways from the phone's SDP offer; `media_refusal` why an
  INVITE's offer is refused; `sdp_answer` our answer; `on_hold` and
  `media_moves_to` what a re-INVITE's offer does;
- `MediaGate` / `PhoneRtp`: RTP only from the address, port and SSRC the phone
  is known by, RTCP only from its host; the rest dropped and counted;
- `G711Passthrough`: the "codec" that hands aiortp's payloads on unchanged (the
  gateway decodes G.711 itself).

services/telephony/sip.py does the signalling around them.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiortp
from aiosipua import SdpMessage, negotiate_sdp

from services.telephony import metrics
from services.telephony.playout import PCMA, PCMU, PhoneCodec
from services.telephony.sip_adapter import FilteredRtpSession

log = logging.getLogger(__name__)

# The static RTP payload types of G.711 (RFC 3551).
PAYLOAD_TYPES = {"PCMU": 0, "PCMA": 8}
CODECS = {"PCMU": PCMU, "PCMA": PCMA}
# Offered when the phone names no telephone-event type of its own.
DEFAULT_DTMF_PAYLOAD_TYPE = 101
CLOCK_RATE = 8000
SAMPLES_PER_PACKET = 160  # 20 ms at 8 kHz
# The jitter buffer: 16 packets (320 ms) of room for reordering, audio handed on
# once two packets are in (40 ms), a gap skipped once a later packet proves it lost.
JITTER_CAPACITY = 16
JITTER_PREFETCH = 2
# The RTP header's SSRC (RFC 3550 5.1): bytes 8..12 of the 12 it has at least.
RTP_HEADER_BYTES = 12


class G711Passthrough(aiortp.Codec):
    """aiortp decodes what it receives with the session's codec; the gateway takes
    G.711 as is, so this codec hands the payload on unchanged."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def sample_rate(self) -> int:
        return CLOCK_RATE

    @property
    def samples_per_frame(self) -> int:
        return SAMPLES_PER_PACKET

    def encode(self, pcm: bytes) -> bytes:
        return pcm

    def decode(self, payload: bytes) -> bytes:
        return payload


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def ip_of(text: str) -> Address | None:
    """`text` as an IP address (an IPv4-mapped IPv6 one as IPv4); None if it is not one."""
    try:
        address = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class MediaGate:
    """Which datagrams on a call's RTP ports are the phone's. aiortp takes RTP from
    anyone, and the RTP range is easy to spray: a stranger's packets would speak
    in the call (the agent answers them), press keys ("press 1 to confirm") and,
    with their SSRC, reset the caller's stream. Taken: RTP from the address and
    port the phone's SDP named (phones send from the port they receive on,
    symmetric RTP, RFC 4961), with the SSRC the first such packet carried, until
    a re-INVITE, which may change it; RTCP from that host. The rest is dropped
    and counted. Closed (drops everything) until `expect` names the address."""

    def __init__(self) -> None:
        self.host: Address | None = None
        self.port = 0
        self.ssrc: int | None = None
        self.last_packet_at = time.monotonic()  # when the phone's last RTP came
        self.dropped: dict[str, int] = {}  # by reason
        self.call_id = ""  # for the log

    def expect(self, address: tuple[str, int]) -> None:
        """The phone's media address, from its SDP; the SSRC is learnt again."""
        self.host, self.port = ip_of(address[0]), address[1]
        self.ssrc = None

    def takes_rtp(self, data: bytes, addr: tuple[Any, ...]) -> bool:
        if not self._from_phone(addr) or addr[1] != self.port:
            return self._drop("source", addr)
        if len(data) < RTP_HEADER_BYTES:
            return self._drop("malformed", addr)
        ssrc = int.from_bytes(data[8:12], "big")
        if self.ssrc is None:
            self.ssrc = ssrc
        elif ssrc != self.ssrc:
            return self._drop("ssrc", addr)
        self.last_packet_at = time.monotonic()
        return True

    def takes_rtcp(self, addr: tuple[Any, ...]) -> bool:
        return self._from_phone(addr) or self._drop("source", addr)

    def _from_phone(self, addr: tuple[Any, ...]) -> bool:
        return self.host is not None and ip_of(str(addr[0])) == self.host

    def _drop(self, reason: str, addr: tuple[Any, ...]) -> bool:
        metrics.DROPPED_RTP.labels(reason).inc()
        if not self.dropped.get(reason):
            log.warning(
                "sip call %s: dropping RTP from %s:%s (%s): the phone's is %s:%d",
                self.call_id,
                addr[0],
                addr[1],
                reason,
                self.host,
                self.port,
            )
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        return False


class PhoneRtp(FilteredRtpSession):
    """aiortp's audio session (with sip_adapter's additions: the marker bit, a
    packet's time passing unsent) taking packets only from the phone (MediaGate)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = MediaGate()

    def accepts_rtp(self, data: bytes, addr: tuple[str, int]) -> bool:
        return self.gate.takes_rtp(data, addr)

    def accepts_rtcp(self, data: bytes, addr: tuple[str, int]) -> bool:
        return self.gate.takes_rtcp(addr)

    @classmethod
    async def for_call(
        cls,
        call_id: str,
        media: MediaChoice,
        local_addr: tuple[str, int],
        phone_addr: tuple[str, int],
    ) -> PhoneRtp:
        """The RTP session of a call: bound to `local_addr`, to and from the phone
        at `phone_addr` (its SDP's), G.711 passed through."""
        rtp = await cls.create(
            local_addr=local_addr,
            remote_addr=phone_addr,
            payload_type=media.payload_type,
            codec=G711Passthrough(media.codec.name),
            clock_rate=CLOCK_RATE,
            dtmf_payload_type=media.dtmf_payload_type,
            jitter_capacity=JITTER_CAPACITY,
            jitter_prefetch=JITTER_PREFETCH,
            skip_audio_gaps=True,
            plc=False,  # concealment works on PCM; we pass G.711 through
        )
        assert isinstance(rtp, PhoneRtp)
        rtp.gate.call_id = call_id
        rtp.gate.expect(phone_addr)
        return rtp

    def update_remote(self, addr: tuple[str, int]) -> None:
        """Media to and from a new address (a re-INVITE's), its SSRC learnt anew."""
        super().update_remote(addr)
        self.gate.expect(addr)


@dataclass(frozen=True)
class MediaChoice:
    """What a call's audio is: the codec and the payload types both ways."""

    codec: PhoneCodec
    payload_type: int
    dtmf_payload_type: int


def choose_media(offer: SdpMessage | None, codec_choices: list[str]) -> MediaChoice | None:
    """The first of `codec_choices` the offer carries (None: no G.711 offered).
    Telephone events keep the phone's payload type, so both directions agree."""
    audio = offer.audio if offer is not None else None
    if audio is None or offer is None or offer.rtp_address is None:
        return None
    offered = {codec.payload_type: codec.encoding_name.upper() for codec in audio.codecs}
    offered.update({int(f): "" for f in audio.formats if f.isdigit() and int(f) not in offered})
    for name in codec_choices:
        payload_type = PAYLOAD_TYPES[name]
        if payload_type in offered and offered[payload_type] in ("", name):
            dtmf = next(
                (
                    codec.payload_type
                    for codec in audio.codecs
                    if codec.encoding_name.lower() == "telephone-event"
                    and codec.clock_rate in (0, CLOCK_RATE)
                ),
                DEFAULT_DTMF_PAYLOAD_TYPE,
            )
            return MediaChoice(CODECS[name], payload_type, dtmf)
    return None


def on_hold(offer: SdpMessage) -> bool:
    """Whether an offer puts the call on hold: the phone will not listen (sendonly,
    inactive), or the old way, a connection address of 0.0.0.0."""
    audio = offer.audio
    if audio is None:
        return True
    address = offer.rtp_address
    return audio.direction in ("sendonly", "inactive") or (
        address is not None and address[0] in ("0.0.0.0", "::")
    )


def media_moves_to(offer: SdpMessage) -> tuple[str, int] | None:
    """Where a re-INVITE's offer moves the media: its address, unless the offer
    holds the call (a held call's address is not used) or names no port."""
    address = offer.rtp_address
    if on_hold(offer) or address is None or not address[1]:
        return None
    return address


def media_refusal(
    offer: SdpMessage | None, media: MediaChoice | None, allowed: Callable[[str], bool]
) -> str:
    """Why an INVITE's offer is refused ("" = taken): "codec" without G.711;
    "media" when its media address is not `allowed` (outside allowed_networks):
    we send RTP there, and a spoofed INVITE must not aim it at a third party."""
    if media is None or offer is None or offer.rtp_address is None:
        return "codec"
    if not allowed(offer.rtp_address[0]):
        return "media"
    return ""


def sdp_answer(
    offer: SdpMessage, media: MediaChoice, local_addr: tuple[str, int], version: int
) -> SdpMessage:
    """Our answer to `offer` (the INVITE's or a re-INVITE's): the call's codec and
    telephone events at `local_addr`; `version` goes up with each answer in the
    dialog, as RFC 3264 8 asks of a changed one. aiosipua's SdpNegotiationError
    when the offer no longer carries the call's codec."""
    ip, rtp_port = local_addr
    answer, _ = negotiate_sdp(
        offer=offer,
        local_ip=ip,
        rtp_port=rtp_port,
        supported_codecs=[media.payload_type],
        dtmf_payload_type=media.dtmf_payload_type,
        session_id=str(rtp_port),
    )
    answer.origin.session_version = str(version)
    return answer


def describe_stats(rtp: aiortp.RTPSession) -> str:
    """One line of an RTP session's statistics, for the log."""
    return ", ".join(f"{key} {value}" for key, value in sorted(rtp.stats.items()))
