"""The one place that touches aiosipua's and aiortp's private parts.

Written for the versions constraints.txt pins: aiosipua 0.7.1 and aiortp 0.8.0.
Neither library's public API has the few things sip.py needs (a filter in
front of RTP receiving, the marker bit, a UDP transport Python 3.11 can run,
putting a dialog back), so this module reaches into their internals, and only
this module: sip.py uses its classes and functions and the libraries' public
API. Each private name relied on, and why (GUARDED holds them all, with the
shape expected, and `missing_private_names` checks them with
kame_common/private_names.py; the SIP service does so when it starts, and
tests/telephony/test_sip_adapter.py on every test run):

aiortp
- `RTPSession._handle_rtp(data, addr)`, `RTPSession._handle_rtcp(data, addr)`:
  the receive hooks aiortp binds its sockets to. FilteredRtpSession overrides
  them so that a packet it refuses never reaches aiortp's parsing, jitter
  buffer or SSRC latching: aiortp takes RTP from anyone and has no filter.
- `RTPSession._sender` (an `aiortp.sender.RtpSender`, used through its
  `send_frame_auto(payload, marker, addr)`, `advance_timestamp()`,
  `send_raw(payload_type, payload, timestamp, marker, addr)` and
  `current_timestamp`): send_audio_auto sets no marker bit and cannot let a
  packet's time pass unsent (hold), which the sender itself can; and
  RTPSession.send_dtmf sends a key's packets all at once with a timestamp of
  its caller's choosing, where RFC 4733 wants them one per packet time,
  stamped with the audio's clock.
- `RTPSession._closed`, `RTPSession._remote_addr`: what send_audio_auto checks
  before sending, and where it sends (update_remote sets it).

aiosipua
- `UdpSipTransport._udp_transport`: the datagram transport aiosipua's own
  protocol stores on connection_made and sends with. UdpTransport binds with a
  protocol of its own and stores it there (aiosipua's asserts the transport is
  an asyncio.DatagramTransport, which the selector loop's of Python 3.11 is
  not), and reads it for the port bound and whether it is still open.
- `SipTransport._dispatch(data, addr)`: parses a datagram and hands it to
  on_message; our protocol feeds it.
- `SipUAS._calls` (dialogs by Call-ID): aiosipua drops a call's dialog when a
  retransmitted INVITE makes a new one or a CANCEL crosses our 200 OK;
  `restore_dialog` puts the call's own back (there is no public setter).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiortp
import aiosipua
from aiosipua import IncomingCall, SipUAS, UdpSipTransport

from kame_common import private_names
from kame_common.private_names import Guarded

log = logging.getLogger(__name__)

PINNED = {"aiosipua": "0.7.1", "aiortp": "0.8.0"}  # as constraints.txt has them


def _rtp_session(owner: type) -> object:
    """An RTP session as aiortp's create makes one, before it binds any socket."""
    return owner(payload_type=0, codec=None)


def _uas(owner: type) -> object:
    return owner(aiosipua.UdpSipTransport())


GUARDED = [
    Guarded("aiortp.RTPSession", "_handle_rtp", params=("data", "addr")),
    Guarded("aiortp.RTPSession", "_handle_rtcp", params=("data", "addr")),
    Guarded("aiortp.RTPSession", "_sender", sample=_rtp_session),
    Guarded("aiortp.RTPSession", "_closed", sample=_rtp_session),
    Guarded("aiortp.RTPSession", "_remote_addr", sample=_rtp_session),
    Guarded("aiortp.sender.RtpSender", "send_frame_auto", params=("payload", "marker", "addr")),
    Guarded("aiortp.sender.RtpSender", "advance_timestamp", params=()),
    Guarded(
        "aiortp.sender.RtpSender",
        "send_raw",
        params=("payload_type", "payload", "timestamp", "marker", "addr"),
    ),
    Guarded("aiortp.sender.RtpSender", "current_timestamp"),
    Guarded("aiosipua.UdpSipTransport", "_udp_transport"),
    Guarded("aiosipua.SipTransport", "_dispatch", params=("data", "addr")),
    Guarded("aiosipua.SipUAS", "_calls", sample=_uas),
]


def missing_private_names(packages: Mapping[str, object] | None = None) -> list[str]:
    """What of GUARDED the installed libraries (or `packages`, by package name)
    lack or have in another shape; empty when all is as this module expects."""
    return private_names.missing(GUARDED, packages or {"aiosipua": aiosipua, "aiortp": aiortp})


def check_private_names() -> None:
    """Refuse to run on library versions this module does not fit: an operator who
    upgraded one is told which names went, at start, not by an AttributeError in
    the middle of a call (private_names.IncompatibleLibraries)."""
    private_names.check("services/telephony/sip_adapter.py", PINNED, missing_private_names())


# ---- aiortp ------------------------------------------------------------------------


class FilteredRtpSession(aiortp.RTPSession):
    """aiortp's audio session with what its own API lacks: a filter in front of
    receiving (`accepts_rtp`, `accepts_rtcp`: a packet refused is dropped before
    aiortp sees it), sending with the marker bit, and a packet's time passing
    without sending."""

    def accepts_rtp(self, data: bytes, addr: tuple[str, int]) -> bool:
        return True

    def accepts_rtcp(self, data: bytes, addr: tuple[str, int]) -> bool:
        return True

    def _handle_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.accepts_rtp(data, addr):
            super()._handle_rtp(data, addr)

    def _handle_rtcp(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.accepts_rtcp(data, addr):
            super()._handle_rtcp(data, addr)

    def send_packet(self, payload: bytes, marker: bool) -> None:
        """`payload` as the next packet (timestamp one packet on), its marker bit set
        or not: as send_audio_auto sends, which always leaves it clear."""
        if self._sender is None or self._closed:
            return
        self._sender.send_frame_auto(payload, marker=int(marker), addr=self._remote_addr)

    def skip_packet(self) -> None:
        """A packet's time passed unsent: the next one's timestamp shows the gap."""
        if self._sender is not None:
            self._sender.advance_timestamp()

    @property
    def next_timestamp(self) -> int:
        """The RTP timestamp the next audio packet will carry."""
        return self._sender.current_timestamp if self._sender is not None else 0

    def send_event(self, payload_type: int, payload: bytes, timestamp: int, marker: bool) -> None:
        """One packet of another payload type (an RFC 4733 event) in the call's
        stream: its sequence number is the next, its timestamp `timestamp`."""
        if self._sender is None or self._closed:
            return
        self._sender.send_raw(payload_type, payload, timestamp, int(marker), self._remote_addr)


# ---- aiosipua ----------------------------------------------------------------------


class _Datagrams(asyncio.DatagramProtocol):
    """Datagrams to the SIP transport's parser."""

    def __init__(self, owner: UdpTransport) -> None:
        self._owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._owner._udp_transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self._owner._dispatch(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        log.debug("sip: udp: %s", exc)


class UdpTransport(UdpSipTransport):
    """aiosipua's UDP transport with a protocol of our own: aiosipua's asserts that
    asyncio hands it a DatagramTransport, which the selector loop's datagram
    transport of Python 3.11 is not (it is from 3.12 on)."""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: _Datagrams(self), local_addr=self.local_addr)

    @property
    def is_open(self) -> bool:
        """Started and not stopped."""
        return self._udp_transport is not None

    @property
    def bound_port(self) -> int:
        assert self._udp_transport is not None
        return int(self._udp_transport.get_extra_info("sockname")[1])


def restore_dialog(uas: SipUAS, call: IncomingCall) -> None:
    """Make `call` the UAS's call for its Call-ID again, so that its ACK, BYE and
    re-INVITEs reach it: aiosipua dropped or replaced it (see the docstring)."""
    uas._calls[call.call_id] = call
