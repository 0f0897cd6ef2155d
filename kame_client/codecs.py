"""Client codecs <-> the internal audio (float32 mono at 24 kHz), for both sides.

The gateway decodes what the caller sends (PCM16 at any rate, G.711 mu-law or
A-law at 8 kHz, Opus) into 24 kHz samples, and encodes the agent's 24 kHz
frames back into the caller's output format. Clients use the same classes the
other way round (`kame talk`, tests): an `Encoder` makes what a `Decoder` reads.

Opus travels as one packet per chunk. The encoder cuts 80 ms packets (one per
internal frame; libopus supports 80 ms frames) at 48 kHz, the decode rate.
Decoders keep resampler state across chunks, so chunk boundaries leave no
clicks; `flush()` returns the tail the resampling filter still holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from kame_common.audio import (
    SAMPLE_RATE,
    Framer,
    Samples,
    StreamResampler,
    alaw_decode,
    alaw_encode,
    float_to_pcm16,
    mulaw_decode,
    mulaw_encode,
    pcm16_to_float,
)
from kamepb import gateway_pb2

if TYPE_CHECKING:
    import av

Codec = gateway_pb2.AudioFormat.Codec

OPUS_RATE = 48_000
OPUS_FRAME_MS = 80
G711_RATE = 8_000
PCM_MIN_RATE, PCM_MAX_RATE = 8_000, 192_000

_CODEC_NAMES = {Codec.PCM16: "pcm16", Codec.MULAW: "mulaw", Codec.ALAW: "alaw", Codec.OPUS: "opus"}


class CodecError(ValueError):
    """The format is not supported or a chunk does not decode; says what was expected."""


@dataclass(frozen=True)
class AudioFormat:
    codec: str  # "pcm16", "mulaw", "alaw" or "opus"
    sample_rate: int  # Hz of the client's side of the codec

    @property
    def in_thread(self) -> bool:
        """Whether coding this format is worth a worker thread. PCM16 and G.711 cost
        microseconds an 80 ms frame (a resample included), less than the ~0.1 ms a
        thread hop costs, and hops hand the GIL back and forth under load; Opus
        (PyAV) costs more and may come in whole seconds."""
        return self.codec == "opus"


T = TypeVar("T")
R = TypeVar("R")


async def coded(fmt: AudioFormat, code: Callable[[T], R], data: T) -> R:
    """`code(data)`: in a worker thread for a format worth one, else right here and
    then a yield, so that a caller whose messages are all ready (a flood) takes
    turns with the other sessions."""
    if fmt.in_thread:
        return await asyncio.to_thread(code, data)
    result = code(data)
    await asyncio.sleep(0)
    return result


def resolve_format(fmt: gateway_pb2.AudioFormat, field: str) -> AudioFormat:
    """Validate a client AudioFormat and fill in the codec's natural rate.

    Raises CodecError naming `field` (e.g. "input_format") and what is allowed.
    """
    codec = Codec.PCM16 if fmt.codec == Codec.CODEC_UNSPECIFIED else fmt.codec
    if codec not in _CODEC_NAMES:
        raise CodecError(
            f"{field}.codec: unknown codec {fmt.codec}; choose PCM16, MULAW, ALAW or OPUS"
        )
    name, rate = _CODEC_NAMES[codec], fmt.sample_rate_hz
    if name == "pcm16":
        rate = rate or SAMPLE_RATE
        if not PCM_MIN_RATE <= rate <= PCM_MAX_RATE:
            raise CodecError(
                f"{field}.sample_rate_hz: PCM16 needs {PCM_MIN_RATE}..{PCM_MAX_RATE} Hz, got {rate}"
            )
    elif name in ("mulaw", "alaw"):
        if rate not in (0, G711_RATE):
            raise CodecError(
                f"{field}.sample_rate_hz: {name.upper()} is {G711_RATE} Hz, got {rate}"
            )
        rate = G711_RATE
    else:
        if rate not in (0, OPUS_RATE):
            raise CodecError(f"{field}.sample_rate_hz: OPUS decodes at {OPUS_RATE} Hz, got {rate}")
        rate = OPUS_RATE
    return AudioFormat(name, rate)


def _pcm16_samples(chunk: bytes) -> Samples:
    if len(chunk) % 2:
        raise CodecError(
            "PCM16 chunks must hold whole 16-bit samples (an even byte count), "
            f"got {len(chunk)} bytes"
        )
    return pcm16_to_float(chunk)


def _frame_to_float(frame: av.AudioFrame) -> Samples:
    """A decoded PyAV frame as mono float32 (channels averaged, if a packet had several)."""
    data = frame.to_ndarray()
    if data.dtype == np.int16:
        data = data.astype(np.float32) / 32768.0
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        per_channel = data.reshape(channels, -1)
    else:
        per_channel = data.reshape(-1, channels).T
    mono: Samples = per_channel.mean(axis=0).astype(np.float32)
    return mono


class _OpusPacketDecoder:
    def __init__(self) -> None:
        import av  # PyAV only where Opus is spoken (the web image has none)

        self._av = av
        self._codec = av.CodecContext.create("libopus", "r")
        self._codec.sample_rate = OPUS_RATE
        self._codec.layout = "mono"

    def __call__(self, packet: bytes) -> Samples:
        if not packet:
            raise CodecError("an OPUS chunk must hold one Opus packet, got 0 bytes")
        try:
            frames = self._codec.decode(self._av.Packet(packet))
        except self._av.error.FFmpegError as exc:
            raise CodecError(
                f"audio does not decode as Opus (one packet per chunk expected): {exc}"
            ) from None
        parts = [_frame_to_float(f) for f in frames]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


class Decoder:
    """Client chunks in `fmt` -> float32 samples at 24 kHz."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        decoders: dict[str, Callable[[bytes], Samples]] = {
            "pcm16": _pcm16_samples,
            "mulaw": lambda chunk: pcm16_to_float(mulaw_decode(chunk)),
            "alaw": lambda chunk: pcm16_to_float(alaw_decode(chunk)),
            "opus": _OpusPacketDecoder(),
        }
        self._to_samples = decoders[fmt.codec]
        self._resampler = StreamResampler(fmt.sample_rate, SAMPLE_RATE)

    def decode(self, chunk: bytes) -> Samples:
        return self._resampler.process(self._to_samples(chunk))

    def flush(self) -> Samples:
        return self._resampler.flush()


class _OpusPacketEncoder:
    """float32 at 48 kHz -> 80 ms Opus packets."""

    def __init__(self, bitrate: int) -> None:
        import av  # as in _OpusPacketDecoder

        self._av = av
        self._codec = av.CodecContext.create("libopus", "w")
        self._codec.sample_rate = OPUS_RATE
        self._codec.layout = "mono"
        self._codec.format = "s16"
        self._codec.bit_rate = bitrate
        self._codec.options = {"frame_duration": str(OPUS_FRAME_MS), "application": "voip"}
        self._codec.open()
        self._framer = Framer(OPUS_RATE * OPUS_FRAME_MS // 1000)
        self._pts = 0

    def _encode_frame(self, samples: Samples | None) -> list[bytes]:
        if samples is None:
            return [bytes(p) for p in self._codec.encode(None)]
        pcm = np.frombuffer(float_to_pcm16(samples), dtype=np.int16)
        frame = self._av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        self._pts += len(pcm)
        return [bytes(p) for p in self._codec.encode(frame)]

    def __call__(self, samples: Samples) -> list[bytes]:
        return [p for frame in self._framer.push(samples) for p in self._encode_frame(frame)]

    def flush(self) -> list[bytes]:
        tail = self._framer.flush()
        packets = self._encode_frame(tail) if tail is not None else []
        return packets + self._encode_frame(None)


class Encoder:
    """float32 samples at 24 kHz -> chunks in `fmt` (PCM/G.711: one chunk per call
    with samples; Opus: one chunk per 80 ms packet)."""

    def __init__(self, fmt: AudioFormat, opus_bitrate: int = 32_000) -> None:
        self.format = fmt
        self._resampler = StreamResampler(SAMPLE_RATE, fmt.sample_rate)
        self._opus = _OpusPacketEncoder(opus_bitrate) if fmt.codec == "opus" else None

    def _from_samples(self, samples: Samples) -> list[bytes]:
        if self._opus is not None:
            return self._opus(samples)
        if not len(samples):
            return []
        pcm = float_to_pcm16(samples)
        if self.format.codec == "mulaw":
            return [mulaw_encode(pcm)]
        if self.format.codec == "alaw":
            return [alaw_encode(pcm)]
        return [pcm]

    def encode(self, samples: Samples) -> list[bytes]:
        return self._from_samples(self._resampler.process(samples))

    def flush(self) -> list[bytes]:
        chunks = self._from_samples(self._resampler.flush())
        if self._opus is not None:
            chunks += self._opus.flush()
        return chunks
