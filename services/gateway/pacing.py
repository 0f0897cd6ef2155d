"""Input limits of one call, applied to the caller's requests before the session
reads them (`limit_input` wraps the request stream):

- size: one audio message holds at most `max_chunk_s` of audio in the call's
  input format (PCM16: 2 bytes per sample at its rate; G.711: 8000 bytes per
  second; Opus: what one second at Opus's top bitrate of 510 kbit/s takes).
  More is RESOURCE_EXHAUSTED, before anything is decoded.
- pace: audio may not arrive faster than real time plus a burst. From the first
  audio message on, the caller's audio total may not exceed the time elapsed
  plus `input_burst_s`; more is RESOURCE_EXHAUSTED.
- idle: while the gateway waits for the caller's next message (the first audio
  after the config included), `idle_timeout_s` without one ends the call with
  DEADLINE_EXCEEDED, so a caller that stalls cannot hold a frontend slot.

The pace is a budget counted from the first audio, not a bucket capped at the
burst: the gateway reads the caller only as fast as the frontend takes frames
(gRPC flow control), so after a stall on the gateway's side the caller's
backlog arrives at once; a capped bucket would refuse the caller for a stall
that was ours. What a caller's own pause can save up is bounded by the idle
timeout, and over the whole call the audio never outruns real time by more
than the burst.

Every message names the setting that set the limit. The clock is injected so
the logic is tested without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc

from kamepb import gateway_pb2
from services.gateway import metrics
from services.gateway.codecs import G711_RATE, PCM_MAX_RATE, AudioFormat
from services.gateway.config import GatewaySettings
from services.gateway.plan import SessionError

# Opus's top bitrate (RFC 6716): no packet of legitimate audio is denser.
OPUS_MAX_BYTES_PER_S = 510_000 // 8
# Room for the protobuf framing around the largest allowed audio chunk.
_MESSAGE_OVERHEAD_BYTES = 1024

Clock = Callable[[], float]


def bytes_per_second(fmt: AudioFormat) -> int:
    """The most bytes one second of audio takes in `fmt`."""
    if fmt.codec == "pcm16":
        return 2 * fmt.sample_rate
    if fmt.codec in ("mulaw", "alaw"):
        return G711_RATE
    return OPUS_MAX_BYTES_PER_S


def max_message_bytes(max_chunk_s: float) -> int:
    """The gRPC receive limit of the client port: the largest chunk any input
    format may send (PCM16 at its top rate), so an oversized message is refused
    by gRPC before it is even buffered whole."""
    return int(2 * PCM_MAX_RATE * max_chunk_s) + _MESSAGE_OVERHEAD_BYTES


# Frame durations (ms) of the 32 Opus configurations (RFC 6716, section 3.1):
# SILK 10/20/40/60, hybrid 10/20, CELT 2.5/5/10/20.
_OPUS_FRAME_MS = [10, 20, 40, 60] * 3 + [10, 20] * 2 + [2.5, 5, 10, 20] * 4


# No Opus packet may hold more (RFC 6716, section 3.2.5).
OPUS_MAX_PACKET_S = 0.12


def opus_packet_seconds(packet: bytes) -> float:
    """The audio one Opus packet holds, from its TOC byte (and frame count byte);
    0 for a packet that cannot be valid (too short, no frames, over 120 ms): the
    decoder then says what is wrong."""
    if not packet:
        return 0.0
    toc = packet[0]
    code = toc & 0x03
    if code == 0:
        frames = 1
    elif code in (1, 2):
        frames = 2
    elif len(packet) >= 2:
        frames = packet[1] & 0x3F
    else:
        return 0.0
    seconds = frames * _OPUS_FRAME_MS[toc >> 3] / 1000
    return seconds if seconds <= OPUS_MAX_PACKET_S else 0.0


def audio_seconds(chunk: bytes, fmt: AudioFormat) -> float:
    """How much audio a chunk in `fmt` holds."""
    if fmt.codec == "opus":
        return opus_packet_seconds(chunk)
    return len(chunk) / bytes_per_second(fmt)


class RealTimeBudget:
    """Admits audio while the total since the first admitted chunk stays within
    the time elapsed plus `burst_s` (the module doc says why not a capped bucket)."""

    def __init__(self, burst_s: float, clock: Clock = time.monotonic) -> None:
        self.burst_s = burst_s
        self._clock = clock
        self._start: float | None = None
        self.received_s = 0.0

    def elapsed_s(self) -> float:
        return 0.0 if self._start is None else self._clock() - self._start

    def admit(self, audio_s: float) -> bool:
        """Count `audio_s` and return True, or return False (and count nothing)
        when it would put the caller more than the burst ahead of real time."""
        if self._start is None:
            self._start = self._clock()
        if self.received_s + audio_s > self.elapsed_s() + self.burst_s:
            return False
        self.received_s += audio_s
        return True


@dataclass(frozen=True)
class InputLimits:
    idle_timeout_s: float  # 0: wait for the caller forever
    input_burst_s: float  # 0: no pacing
    max_chunk_s: float

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> InputLimits:
        return cls(settings.idle_timeout_s, settings.input_burst_s, settings.max_chunk_s)


class InputGuard:
    """The checks of one call's audio messages (size and pace), in arrival order."""

    def __init__(
        self, fmt: AudioFormat, limits: InputLimits, clock: Clock = time.monotonic
    ) -> None:
        self.format = fmt
        self.limits = limits
        self.max_chunk_bytes = int(bytes_per_second(fmt) * limits.max_chunk_s)
        self._budget = RealTimeBudget(limits.input_burst_s, clock)
        self._index = 0

    def check(self, chunk: bytes) -> None:
        """Raise SessionError(RESOURCE_EXHAUSTED) naming the limit the chunk breaks."""
        index, self._index = self._index, self._index + 1
        if len(chunk) > self.max_chunk_bytes:
            metrics.REFUSED_INPUT.labels("chunk_size").inc()
            raise SessionError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"audio chunk {index} has {len(chunk)} bytes; {self.format.codec} at "
                f"{self.format.sample_rate} Hz allows {self.max_chunk_bytes} bytes "
                f"({self.limits.max_chunk_s:g} s, max_chunk_s) per message",
            )
        if self.limits.input_burst_s <= 0:
            return
        budget = self._budget
        audio_s = audio_seconds(chunk, self.format)
        if not budget.admit(audio_s):
            metrics.REFUSED_INPUT.labels("pace").inc()
            raise SessionError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"audio arrives faster than real time: {budget.received_s + audio_s:.2f} s "
                f"of audio in {budget.elapsed_s():.2f} s; the limit is real time plus "
                f"{budget.burst_s:g} s (input_burst_s)",
            )


async def limit_input(
    requests: AsyncIterator[gateway_pb2.ConverseRequest],
    fmt: AudioFormat,
    limits: InputLimits,
    clock: Clock = time.monotonic,
) -> AsyncIterator[gateway_pb2.ConverseRequest]:
    """The caller's requests after the config, each audio message checked;
    raises SessionError when the caller stalls, floods or sends too much at once.
    Other messages pass through (the session says what is wrong with them)."""
    guard = InputGuard(fmt, limits, clock)
    idle_s = limits.idle_timeout_s or None
    while True:
        try:
            async with asyncio.timeout(idle_s):  # no task per message, unlike wait_for
                request = await anext(requests)
        except StopAsyncIteration:
            return
        except TimeoutError:
            metrics.REFUSED_INPUT.labels("idle").inc()
            raise SessionError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no audio from the caller for {limits.idle_timeout_s:g} s (idle_timeout_s)",
            ) from None
        if request.WhichOneof("msg") == "audio":
            guard.check(request.audio)
        yield request
