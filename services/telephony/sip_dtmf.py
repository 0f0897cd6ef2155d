"""Keys the agent presses on a SIP call: RFC 4733 telephone events in its RTP.

A key replaces the call's audio for its length: on each 20 ms packet time of
the playout clock `KeysOut` hands the leg the next event packet to send in
place of the audio packet (whose time passes unsent, so the audio's timestamps
go on from where they would be). Per key, as RFC 4733 2.5 describes: packets of
one timestamp (the audio clock's when the key starts), the first with the
marker bit, the duration growing by one packet each, then the end packet three
times; then a gap of audio before the next key.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from dataclasses import dataclass

from aiosipua import SdpMessage

from services.telephony.sip_adapter import FilteredRtpSession

# RFC 4733 3.2: the event codes of the 16 keys.
EVENT_CODES = {key: code for code, key in enumerate("0123456789*#ABCD")}
SAMPLES_PER_PACKET = 160  # 20 ms at 8 kHz
KEY_PACKETS = 5  # a key lasts 100 ms
END_COPIES = 3  # the end packet is sent three times (RFC 4733 2.5.1.4)
GAP_PACKETS = 4  # 80 ms of audio between keys
VOLUME = 10  # -10 dBm0, the power of a key


@dataclass(frozen=True)
class EventPacket:
    """One telephone-event packet: its payload, and whether it starts its event."""

    payload: bytes
    starts: bool


def event_payload(code: int, end: bool, duration: int) -> bytes:
    """RFC 4733 2.3: event, E bit and volume, duration in timestamp units."""
    return struct.pack("!BBH", code, (0x80 if end else 0) | VOLUME, duration)


def key_packets(key: str) -> list[EventPacket | None]:
    """What a key takes, one entry per packet time: its event packets, then the
    gap (None: audio goes out)."""
    code = EVENT_CODES[key]
    packets: list[EventPacket | None] = [
        EventPacket(event_payload(code, False, n * SAMPLES_PER_PACKET), starts=n == 1)
        for n in range(1, KEY_PACKETS)
    ]
    end = event_payload(code, True, KEY_PACKETS * SAMPLES_PER_PACKET)
    packets += [EventPacket(end, starts=False)] * END_COPIES
    return packets + [None] * GAP_PACKETS


def offers_telephone_events(offer: SdpMessage | None) -> bool:
    """Whether the phone's SDP offer has telephone-event (it takes RFC 4733 keys)."""
    audio = offer.audio if offer is not None else None
    return audio is not None and any(
        codec.encoding_name.lower() == "telephone-event" for codec in audio.codecs
    )


class KeysOut:
    """Keys waiting to be pressed on a call, played out one packet time at a time."""

    def __init__(self) -> None:
        self._plan: deque[EventPacket | None] = deque()  # per packet time; None: audio
        self._taken = 0  # packet times of the plan gone by
        self._queued = 0  # packet times ever planned
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()  # (done at, press)
        self._event_timestamp = 0

    @property
    def pending(self) -> bool:
        return bool(self._plan)

    @property
    def event_timestamp(self) -> int:
        """The RTP timestamp of the event being sent (the audio clock's at its start)."""
        return self._event_timestamp

    def press(self, keys: str) -> asyncio.Future[None]:
        """Queue `keys` (each in EVENT_CODES); the future is done once they are sent
        (or the call ended: `cancel`)."""
        for key in keys:
            planned = key_packets(key)
            self._plan.extend(planned)
            self._queued += len(planned)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((self._queued, done))
        return done

    def next_packet(self, audio_timestamp: int) -> EventPacket | None:
        """What goes out in this packet time: an event packet, or None for audio.
        `audio_timestamp` is the one the audio packet would carry; an event keeps
        the one it started with."""
        if not self._plan:
            return None
        step = self._plan.popleft()
        self._taken += 1
        if step is not None and step.starts:
            self._event_timestamp = audio_timestamp
        while self._waiting and self._waiting[0][0] <= self._taken:
            _, done = self._waiting.popleft()
            if not done.done():
                done.set_result(None)
        return step

    def send_due(self, rtp: FilteredRtpSession, payload_type: int) -> bool:
        """Send the event packet due in this packet time on `rtp` in place of audio
        (whose time passes unsent); False: none is due, audio goes out."""
        event = self.next_packet(rtp.next_timestamp)
        if event is None:
            return False
        rtp.send_event(payload_type, event.payload, self._event_timestamp, marker=event.starts)
        rtp.skip_packet()
        return True

    def cancel(self) -> None:
        """The call ended: nothing more is sent, and every press is over."""
        self._plan.clear()
        for _, done in self._waiting:
            if not done.done():
                done.set_result(None)
        self._waiting.clear()
