"""Audio helpers: PCM16 <-> float32, resampling, G.711, and 80 ms framing.

Every internal stream carries PCM s16le mono at 24 kHz in frames of 1920
samples (80 ms, one Mimi frame). Only the gateway sees other rates and codecs.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr

SAMPLE_RATE = 24_000
FRAME_SAMPLES = 1_920
FRAME_SECONDS = FRAME_SAMPLES / SAMPLE_RATE
FRAME_BYTES = FRAME_SAMPLES * 2
PHONE_RATE = 8_000  # G.711's: a telephone line's audio

# A float32 signal in [-1, 1): how every service holds audio between codecs.
Samples = npt.NDArray[np.float32]
# Integer arrays of the G.711 coders (linear samples and codes).
IntArray = npt.NDArray[np.integer]


def pcm16_to_float(pcm: bytes) -> Samples:
    """Decode PCM s16le bytes to float32 samples in [-1, 1)."""
    if len(pcm) % 2:
        raise ValueError(f"PCM16 needs an even byte count, got {len(pcm)} bytes")
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def float_to_pcm16(samples: npt.ArrayLike) -> bytes:
    """Encode float samples to PCM s16le, clipping to the 16-bit range."""
    scaled = np.clip(np.asarray(samples, dtype=np.float32) * 32768.0, -32768, 32767)
    return np.round(scaled).astype("<i2").tobytes()


def resample(samples: npt.ArrayLike, from_rate: int, to_rate: int) -> Samples:
    """Resample a whole signal (float32) with libsoxr's high-quality filter."""
    signal = np.asarray(samples, dtype=np.float32)
    if from_rate == to_rate:
        return signal
    resampled: Samples = soxr.resample(signal, from_rate, to_rate, quality="HQ")
    return resampled


class StreamResampler:
    """Resamples a stream chunk by chunk with filter state kept between chunks,
    so chunk boundaries leave no clicks. `flush()` returns the filter's tail."""

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self.from_rate = from_rate
        self.to_rate = to_rate
        self._stream = (
            None
            if from_rate == to_rate
            else soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality="HQ")
        )

    def process(self, samples: npt.ArrayLike) -> Samples:
        signal = np.asarray(samples, dtype=np.float32)
        if self._stream is None:
            return signal
        resampled: Samples = self._stream.resample_chunk(signal)
        return resampled

    def flush(self) -> Samples:
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        tail: Samples = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return tail


# --- G.711, bit-exact with the ITU reference coder (Sun's g711.c, CPython's audioop) ---

_MULAW_BIAS = 0x84
_MULAW_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _mulaw_encode_array(samples: IntArray) -> IntArray:
    value = samples.astype(np.int32) >> 2  # mu-law codes 14-bit linear samples
    mask = np.where(value < 0, 0x7F, 0xFF)
    value = np.minimum(np.abs(value), 8159) + (_MULAW_BIAS >> 2)
    segment = np.searchsorted(_MULAW_SEGMENT_ENDS, value)
    code = np.where(segment >= 8, 0x7F, (segment << 4) | ((value >> (segment + 1)) & 0x0F))
    encoded: IntArray = (code ^ mask).astype(np.uint8)
    return encoded


def _mulaw_decode_array(codes: IntArray) -> IntArray:
    inverted = ~codes.astype(np.int32) & 0xFF
    magnitude = (((inverted & 0x0F) << 3) + _MULAW_BIAS) << ((inverted & 0x70) >> 4)
    decoded: IntArray = np.where(inverted & 0x80, _MULAW_BIAS - magnitude, magnitude - _MULAW_BIAS)
    return decoded


def _alaw_encode_array(samples: IntArray) -> IntArray:
    value = samples.astype(np.int32) >> 3  # A-law codes 13-bit linear samples
    mask = np.where(value >= 0, 0xD5, 0x55)
    value = np.where(value >= 0, value, -value - 1)
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, value)
    shift = np.where(segment < 2, 1, segment)
    code = np.where(segment >= 8, 0x7F, (segment << 4) | ((value >> shift) & 0x0F))
    encoded: IntArray = (code ^ mask).astype(np.uint8)
    return encoded


def _alaw_decode_array(codes: IntArray) -> IntArray:
    value = codes.astype(np.int32) ^ 0x55
    segment = (value & 0x70) >> 4
    magnitude = ((value & 0x0F) << 4) + np.where(segment == 0, 8, 0x108)
    magnitude = magnitude << np.maximum(segment - 1, 0)
    decoded: IntArray = np.where(value & 0x80, magnitude, -magnitude)
    return decoded


# Lookup tables: encoding indexes by the 16-bit sample (offset by 32768).
_ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int32)
_ALL_CODES = np.arange(256, dtype=np.int32)
_MULAW_ENC = _mulaw_encode_array(_ALL_SAMPLES)
_MULAW_DEC = _mulaw_decode_array(_ALL_CODES).astype(np.int16)
_ALAW_ENC = _alaw_encode_array(_ALL_SAMPLES)
_ALAW_DEC = _alaw_decode_array(_ALL_CODES).astype(np.int16)


def mulaw_encode(pcm: bytes) -> bytes:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.int32) + 32768
    return _MULAW_ENC[samples].tobytes()


def mulaw_decode(data: bytes) -> bytes:
    return _MULAW_DEC[np.frombuffer(data, dtype=np.uint8)].astype("<i2").tobytes()


def through_phone(samples: npt.ArrayLike, rate: int) -> Samples:
    """`samples` (at `rate`) as a telephone caller sounds: down to G.711's 8 kHz,
    mu-law and back, then up to `rate` again."""
    narrow = resample(samples, rate, PHONE_RATE)
    coded = mulaw_decode(mulaw_encode(float_to_pcm16(narrow)))
    return resample(pcm16_to_float(coded), PHONE_RATE, rate)


def alaw_encode(pcm: bytes) -> bytes:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.int32) + 32768
    return _ALAW_ENC[samples].tobytes()


def alaw_decode(data: bytes) -> bytes:
    return _ALAW_DEC[np.frombuffer(data, dtype=np.uint8)].astype("<i2").tobytes()


class Framer:
    """Turns float32 chunks of any size into exact FRAME_SAMPLES frames.

    Samples are buffered, never dropped: `push` returns every complete frame,
    and `flush` returns the remainder zero-padded to one last frame (or None).
    """

    def __init__(self, frame_samples: int = FRAME_SAMPLES) -> None:
        self.frame_samples = frame_samples
        self._pending: Samples = np.zeros(0, dtype=np.float32)

    @property
    def pending_samples(self) -> int:
        return len(self._pending)

    def push(self, samples: npt.ArrayLike) -> list[Samples]:
        self._pending = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        count = len(self._pending) // self.frame_samples
        frames = [
            self._pending[i * self.frame_samples : (i + 1) * self.frame_samples]
            for i in range(count)
        ]
        self._pending = self._pending[count * self.frame_samples :].copy()
        return frames

    def flush(self) -> Samples | None:
        if not len(self._pending):
            return None
        frame = np.zeros(self.frame_samples, dtype=np.float32)
        frame[: len(self._pending)] = self._pending
        self._pending = np.zeros(0, dtype=np.float32)
        return frame


def check_frame(pcm: bytes, sample_rate_hz: int) -> None:
    """Raise ValueError saying what was expected unless `pcm` is one internal frame."""
    if sample_rate_hz != SAMPLE_RATE:
        raise ValueError(f"sample_rate_hz must be {SAMPLE_RATE}, got {sample_rate_hz}")
    if len(pcm) % 2:
        raise ValueError(f"PCM s16le needs an even byte count, got {len(pcm)} bytes")
    if len(pcm) != FRAME_BYTES:
        raise ValueError(
            f"a frame must be {FRAME_SAMPLES} samples ({FRAME_BYTES} bytes of PCM s16le "
            f"at {SAMPLE_RATE} Hz, 80 ms), got {len(pcm) // 2} samples"
        )


def rms_dbfs(samples: Samples) -> float:
    """Level of a float signal in dB relative to full scale (-inf for silence)."""
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if len(samples) else 0.0
    return 20 * float(np.log10(rms)) if rms > 0 else float("-inf")
