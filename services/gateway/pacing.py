"""Input limits of one call, applied to the caller's requests before the session
reads them (`limit_input` wraps the request stream):

- size: one audio message holds at most `max_chunk_s` of audio in the call's
  input format (PCM16: 2 bytes per sample at its rate; G.711: 8000 bytes per
  second; Opus: what one second at Opus's top bitrate of 510 kbit/s takes).
  More is RESOURCE_EXHAUSTED, before anything is decoded.
- pace: audio may not arrive faster than real time plus a burst. From the first
  audio message on, the caller's audio total may not exceed the time elapsed
  plus `input_burst_s`; more is RESOURCE_EXHAUSTED.
- idle: while the gateway waits for the caller's audio (the first after the
  config included), `idle_timeout_s` of waiting without one frame's worth (80
  ms) of it ends the call with DEADLINE_EXCEEDED, so a caller that stalls
  cannot hold a frontend slot. Only audio counts: empty or tiny audio messages
  and keys pressed do not keep a call alive. The time the gateway itself takes
  between two reads is not counted.
- keys: Dtmf messages beyond `dtmf_per_s` a second (after a burst of
  `dtmf_burst`) are dropped and counted in kame_gateway_dropped_dtmf_total, not
  refused: a phone network that repeats events must not end the call, and a
  flood reaches neither the oracle's conversation nor Redis.
- length: the call ends with OUT_OF_RANGE `max_session_s` after it started,
  whatever the caller sends. A caller that stops reading blocks the session on
  its output, where no input limit looks: `cap_call_time` cancels such a call
  `drain_timeout_s` later.

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
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import Counter

from kame_client.codecs import G711_RATE, PCM_MAX_RATE, AudioFormat
from kame_common.audio import FRAME_SECONDS
from kamepb import gateway_pb2
from services.gateway import metrics
from services.gateway.config import GatewaySettings
from services.gateway.plan import SessionError

log = logging.getLogger(__name__)

DROPPED_DTMF = Counter(
    "kame_gateway_dropped_dtmf", "Keys pressed beyond the call's dtmf_per_s, dropped"
)

# Audio the caller must send to count as there (a frame: no empty or tiny message).
ACTIVITY_S = FRAME_SECONDS

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


class KeyRate:
    """A token bucket of keys pressed: `burst` at once, then `per_s` a second."""

    def __init__(self, per_s: float, burst: int, clock: Clock = time.monotonic) -> None:
        self.per_s = per_s
        self.burst = max(burst, 1)
        self._clock = clock
        self._tokens = float(self.burst)
        self._at = clock()

    def admit(self) -> bool:
        """Whether one more key may pass now (0 keys a second: every one may)."""
        if self.per_s <= 0:
            return True
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@dataclass(frozen=True)
class InputLimits:
    idle_timeout_s: float  # 0: wait for the caller forever
    input_burst_s: float  # 0: no pacing
    max_chunk_s: float
    max_session_s: float = math.inf  # 0 or inf: no cap on the call's length
    dtmf_per_s: float = 0.0  # 0: no limit
    dtmf_burst: int = 1

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> InputLimits:
        return cls(
            settings.idle_timeout_s,
            settings.input_burst_s,
            settings.max_chunk_s,
            settings.max_session_s,
            settings.dtmf_per_s,
            settings.dtmf_burst,
        )


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

    def check(self, chunk: bytes) -> float:
        """The audio the chunk holds, in seconds; raise SessionError(RESOURCE_EXHAUSTED)
        naming the limit the chunk breaks."""
        index, self._index = self._index, self._index + 1
        if len(chunk) > self.max_chunk_bytes:
            metrics.REFUSED_INPUT.labels("chunk_size").inc()
            raise SessionError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"audio chunk {index} has {len(chunk)} bytes; {self.format.codec} at "
                f"{self.format.sample_rate} Hz allows {self.max_chunk_bytes} bytes "
                f"({self.limits.max_chunk_s:g} s, max_chunk_s) per message",
            )
        audio_s = audio_seconds(chunk, self.format)
        if self.limits.input_burst_s <= 0:
            return audio_s
        budget = self._budget
        if not budget.admit(audio_s):
            metrics.REFUSED_INPUT.labels("pace").inc()
            raise SessionError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"audio arrives faster than real time: {budget.received_s + audio_s:.2f} s "
                f"of audio in {budget.elapsed_s():.2f} s; the limit is real time plus "
                f"{budget.burst_s:g} s (input_burst_s)",
            )
        return audio_s


async def limit_input(
    requests: AsyncIterator[gateway_pb2.ConverseRequest],
    fmt: AudioFormat,
    limits: InputLimits,
    clock: Clock = time.monotonic,
) -> AsyncIterator[gateway_pb2.ConverseRequest]:
    """The caller's requests after the config, each audio message checked and keys
    pressed rate-limited; raises SessionError when the caller stalls, floods,
    sends too much at once or reaches the call's cap. Other messages pass
    through (the session says what is wrong with them)."""
    guard = InputGuard(fmt, limits, clock)
    keys = KeyRate(limits.dtmf_per_s, limits.dtmf_burst, clock)
    loop = asyncio.get_running_loop()
    capped = 0 < limits.max_session_s < math.inf
    call_end = loop.time() + limits.max_session_s if capped else math.inf
    idle_s = limits.idle_timeout_s or math.inf
    idle_left_s = idle_s  # waiting time left before the caller counts as gone
    heard_s = 0.0  # audio since the caller last counted as there
    while True:
        waited_from = loop.time()
        idle_end = waited_from + idle_left_s
        deadline = min(idle_end, call_end)
        try:
            async with asyncio.timeout_at(deadline if deadline < math.inf else None):
                request = await anext(requests)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise _expired(limits, idle_end <= call_end) from None
        idle_left_s -= loop.time() - waited_from
        kind = request.WhichOneof("msg")
        if kind == "audio":
            heard_s += guard.check(request.audio)
            if heard_s >= ACTIVITY_S:
                heard_s, idle_left_s = 0.0, idle_s
        elif kind == "dtmf" and not keys.admit():
            DROPPED_DTMF.inc()
            continue
        yield request


def _expired(limits: InputLimits, idle: bool) -> SessionError:
    if idle:
        metrics.REFUSED_INPUT.labels("idle").inc()
        return SessionError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"no audio from the caller for {limits.idle_timeout_s:g} s (idle_timeout_s)",
        )
    metrics.REFUSED_INPUT.labels("max_session").inc()
    return SessionError(
        grpc.StatusCode.OUT_OF_RANGE,
        f"the session reached its cap of {limits.max_session_s:g} s (max_session_s)",
    )


def cap_call_time(context: grpc.aio.ServicerContext[Any, Any], limit_s: float) -> None:
    """Cancel the call's handler `limit_s` from now, whatever it waits on, unless the
    call has ended by then (0 or inf: never). The backstop of max_session_s for a
    caller that stops reading: the session then waits on its output, where
    `limit_input` does not look."""
    if not 0 < limit_s < math.inf:
        return
    handler = asyncio.current_task()
    if handler is None:
        return
    timer = asyncio.get_running_loop().call_later(limit_s, _cut, handler, limit_s)
    context.add_done_callback(lambda _: timer.cancel())  # type: ignore[arg-type]  # stub: a class


def _cut(handler: asyncio.Task[Any], limit_s: float) -> None:
    log.info("a call outlived its cap of %g s: cancelled", limit_s)
    metrics.REFUSED_INPUT.labels("max_session").inc()
    handler.cancel()
