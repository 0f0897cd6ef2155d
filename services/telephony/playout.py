"""Agent audio to the phone, 20 ms at a time, on our own clock.

The gateway answers each 80 ms caller frame with 80 ms of agent audio, so agent
audio arrives in 80 ms pieces, a little jittered; a phone wants one 20 ms
packet every 20 ms. `Playout` holds `prebuffer` of audio before it starts (the
jitter it rides out), then sends a packet on every tick of a 20 ms clock with
absolute deadlines (no drift), silence when nothing is queued (an underrun), and
drops the oldest audio beyond `max_queued` (a phone clock slower than ours).
A barge-in `flush`es what is queued, so the caller does not hear the agent go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.telephony import metrics

PACKET_S = 0.020
# A packet sent this long after its deadline counts as late.
LATE_S = 0.010


@dataclass(frozen=True)
class PhoneCodec:
    """What a phone speaks, and the AudioFormat the gateway is asked for in its place:
    the gateway decodes and encodes G.711 and PCM16 itself, so audio passes through."""

    name: str  # "PCMU", "PCMA", "SLIN" (PCM16 little-endian, 8 kHz)
    gateway_codec: int  # gateway_pb2.AudioFormat.Codec
    sample_rate_hz: int
    bytes_per_sample: int
    silence_byte: bytes

    @property
    def packet_bytes(self) -> int:
        return round(self.sample_rate_hz * PACKET_S) * self.bytes_per_sample

    def silence(self, size: int) -> bytes:
        return self.silence_byte * size


# The gateway_pb2.AudioFormat codec numbers (MULAW = 2, ALAW = 3, PCM16 = 1).
PCMU = PhoneCodec("PCMU", 2, 8000, 1, b"\xff")
PCMA = PhoneCodec("PCMA", 3, 8000, 1, b"\xd5")
SLIN = PhoneCodec("SLIN", 1, 8000, 2, b"\x00")


@dataclass
class PlayoutStats:
    packets: int = 0
    late: int = 0  # sent more than LATE_S after its deadline
    underruns: int = 0  # nothing queued at a deadline: silence went out
    dropped_bytes: int = 0  # over max_queued, oldest dropped
    flushed_bytes: int = 0  # thrown away by barge-ins


# Sends one packet: its bytes, and whether it carries agent speech.
SendPacket = Callable[[bytes, bool], Awaitable[None]]


class Playout:
    def __init__(
        self,
        codec: PhoneCodec,
        send: SendPacket,
        prebuffer_ms: int,
        max_queued_ms: int,
        provider: str = "",
    ) -> None:
        """`provider` labels the service's metrics, counted as packets go."""
        self.codec = codec
        self._send = send
        self._packet = codec.packet_bytes
        self._prebuffer = self._packet * (prebuffer_ms // 20)
        self._max = self._packet * (max_queued_ms // 20)
        # Queued audio, and where each stretch of speech in it ends (byte offsets).
        self._queue = bytearray()
        self._speech: list[tuple[int, int]] = []  # (start, end) of speaking spans in _queue
        self._started = False
        self._wake = asyncio.Event()
        self.stats = PlayoutStats()
        self._sent = metrics.PACKETS_SENT.labels(provider)
        self._late = metrics.LATE_PACKETS.labels(provider)
        self._underruns = metrics.UNDERRUNS.labels(provider)

    @property
    def queued_ms(self) -> float:
        return 1000 * len(self._queue) / (self.codec.sample_rate_hz * self.codec.bytes_per_sample)

    @property
    def speech_queued(self) -> bool:
        """Whether agent speech waits to be played (not only silence)."""
        return bool(self._speech)

    def push(self, audio: bytes, speaking: bool) -> None:
        """Agent audio from the gateway, in the phone's codec."""
        if speaking and audio:
            self._speech.append((len(self._queue), len(self._queue) + len(audio)))
        self._queue += audio
        if len(self._queue) > self._max:
            self._drop(len(self._queue) - self._max)
        if len(self._queue) >= self._prebuffer:
            self._wake.set()

    def flush(self) -> int:
        """Drop everything queued (a barge-in); how many bytes went."""
        dropped = len(self._queue)
        self.stats.flushed_bytes += dropped
        self._queue.clear()
        self._speech.clear()
        return dropped

    async def run(self) -> None:
        """Send packets until cancelled: from the first prebuffered audio on, one
        every 20 ms."""
        await self._wake.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            packet, speaking = self._next_packet()
            late = loop.time() - deadline
            self.stats.packets += 1
            self._sent.inc()
            if late > LATE_S:
                self.stats.late += 1
                self._late.inc()
            await self._send(packet, speaking)
            deadline += PACKET_S
            if (wait := deadline - loop.time()) > 0:
                await asyncio.sleep(wait)
            elif -wait > 10 * PACKET_S:
                deadline = loop.time()  # the loop stalled: start the clock again, do not burst

    def _next_packet(self) -> tuple[bytes, bool]:
        size = self._packet
        if len(self._queue) < size:
            self.stats.underruns += 1
            self._underruns.inc()
            packet = bytes(self._queue) + self.codec.silence(size - len(self._queue))
            speaking = bool(self._speech)
            self._queue.clear()
            self._speech.clear()
            return packet, speaking
        packet = bytes(self._queue[:size])
        speaking = bool(self._speech) and self._speech[0][0] < size
        self._consume(size)
        return packet, speaking

    def _drop(self, size: int) -> None:
        self.stats.dropped_bytes += size
        self._consume(size)

    def _consume(self, size: int) -> None:
        del self._queue[:size]
        self._speech = [
            (max(start - size, 0), end - size) for start, end in self._speech if end > size
        ]
