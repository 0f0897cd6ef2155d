"""The shared audio helpers: G.711 against the standard's code values,
resampling round trips, and lossless 80 ms framing."""

from __future__ import annotations

import numpy as np
import pytest

from kame_common import audio


# Code values of the G.711 reference coder (ITU-T G.191 / Sun's g711.c): (sample, code).
@pytest.mark.parametrize(
    ("sample", "code"),
    [
        (0, 0xFF),
        (-1, 0x7E),
        (8, 0xFE),
        (100, 0xF2),
        (-100, 0x72),
        (1000, 0xCE),
        (8159, 0x9F),
        (32767, 0x80),
        (-32768, 0x00),
    ],
)
def test_mulaw_encode_known_codes(sample, code):
    pcm = np.array([sample], dtype="<i2").tobytes()
    assert audio.mulaw_encode(pcm) == bytes([code])


@pytest.mark.parametrize(
    ("code", "sample"), [(0xFF, 0), (0x80, 32124), (0x00, -32124), (0xF2, 104), (0xCE, 988)]
)
def test_mulaw_decode_known_values(code, sample):
    decoded = np.frombuffer(audio.mulaw_decode(bytes([code])), dtype="<i2")
    assert decoded[0] == sample


@pytest.mark.parametrize(
    ("sample", "code"),
    [(0, 0xD5), (-1, 0x55), (100, 0xD3), (-100, 0x53), (1000, 0xFA), (32767, 0xAA), (-32768, 0x2A)],
)
def test_alaw_encode_known_codes(sample, code):
    pcm = np.array([sample], dtype="<i2").tobytes()
    assert audio.alaw_encode(pcm) == bytes([code])


@pytest.mark.parametrize(
    ("code", "sample"), [(0xD5, 8), (0x55, -8), (0xAA, 32256), (0x2A, -32256), (0xFE, 880)]
)
def test_alaw_decode_known_values(code, sample):
    decoded = np.frombuffer(audio.alaw_decode(bytes([code])), dtype="<i2")
    assert decoded[0] == sample


def test_g711_matches_cpython_audioop_on_every_sample():
    """CPython's audioop (stdlib until 3.13) implements the same reference coder."""
    audioop = pytest.importorskip("audioop")
    every_sample = np.arange(-32768, 32768, dtype="<i2").tobytes()
    every_code = bytes(range(256))
    assert audio.mulaw_encode(every_sample) == audioop.lin2ulaw(every_sample, 2)
    assert audio.alaw_encode(every_sample) == audioop.lin2alaw(every_sample, 2)
    assert audio.mulaw_decode(every_code) == audioop.ulaw2lin(every_code, 2)
    assert audio.alaw_decode(every_code) == audioop.alaw2lin(every_code, 2)


@pytest.mark.parametrize(
    ("encode", "decode"),
    [(audio.mulaw_encode, audio.mulaw_decode), (audio.alaw_encode, audio.alaw_decode)],
)
def test_g711_round_trip_error_is_within_quantization(encode, decode):
    samples = np.linspace(-32768, 32767, 5000).astype("<i2")
    back = np.frombuffer(decode(encode(samples.tobytes())), dtype="<i2").astype(np.int32)
    # Logarithmic quantization: the error grows with the magnitude, below ~1/16 of it.
    error = np.abs(back - samples.astype(np.int32))
    assert np.all(error <= np.maximum(np.abs(samples.astype(np.int32)) / 16, 16) + 1)


def _dominant_frequency(signal: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(signal * np.hanning(len(signal))))
    return float(np.fft.rfftfreq(len(signal), 1 / rate)[np.argmax(spectrum)])


def test_resampling_8k_24k_8k_keeps_frequency_and_level():
    rate, freq = 8000, 440.0
    t = np.arange(rate * 2) / rate
    sine = 0.5 * np.sin(2 * np.pi * freq * t).astype(np.float32)
    up = audio.resample(sine, 8000, 24000)
    assert len(up) == 3 * len(sine)
    assert abs(_dominant_frequency(up, 24000) - freq) < 1.0
    back = audio.resample(up, 24000, 8000)
    assert abs(_dominant_frequency(back, 8000) - freq) < 1.0
    middle = slice(400, -400)  # skip the filter's edges
    assert abs(audio.rms_dbfs(back[middle]) - audio.rms_dbfs(sine[middle])) < 0.1


def test_stream_resampler_matches_length_and_frequency():
    rate, freq = 8000, 300.0
    sine = 0.3 * np.sin(2 * np.pi * freq * np.arange(rate) / rate).astype(np.float32)
    stream = audio.StreamResampler(8000, 24000)
    rng = np.random.default_rng(1)
    out, pos = [], 0
    while pos < len(sine):
        size = int(rng.integers(1, 700))
        out.append(stream.process(sine[pos : pos + size]))
        pos += size
    out.append(stream.flush())
    joined = np.concatenate(out)
    assert abs(len(joined) - 3 * len(sine)) <= 3
    assert abs(_dominant_frequency(joined, 24000) - freq) < 1.0


def test_framer_keeps_every_sample_for_random_chunk_sizes():
    rng = np.random.default_rng(7)
    signal = rng.standard_normal(24000 * 3 + 123).astype(np.float32)
    framer, frames, pos = audio.Framer(), [], 0
    while pos < len(signal):
        size = int(rng.integers(0, 5000))
        frames.extend(framer.push(signal[pos : pos + size]))
        pos += size
    assert all(len(f) == audio.FRAME_SAMPLES for f in frames)
    tail = framer.flush()
    assert tail is not None and len(tail) == audio.FRAME_SAMPLES
    joined = np.concatenate([*frames, tail])
    np.testing.assert_array_equal(joined[: len(signal)], signal)
    assert np.all(joined[len(signal) :] == 0)
    assert framer.flush() is None


def test_pcm16_round_trip_and_clipping():
    samples = np.array([0.0, 0.5, -0.5, 1.5, -1.5], dtype=np.float32)
    back = audio.pcm16_to_float(audio.float_to_pcm16(samples))
    np.testing.assert_allclose(back[:3], samples[:3], atol=1 / 32768)
    assert back[3] == pytest.approx(32767 / 32768) and back[4] == -1.0


@pytest.mark.parametrize(
    ("pcm", "rate", "message"),
    [
        (b"\0" * audio.FRAME_BYTES, 16000, "sample_rate_hz must be 24000"),
        (b"\0" * 3, 24000, "even byte count"),
        (b"\0" * 1000, 24000, "1920 samples"),
    ],
)
def test_check_frame_says_what_was_expected(pcm, rate, message):
    with pytest.raises(ValueError, match=message):
        audio.check_frame(pcm, rate)


def test_through_phone_keeps_the_voice_band_and_drops_what_8_khz_cannot_carry():
    rate = 16_000
    t = np.arange(rate) / rate
    voice_band, too_high = 0.5 * np.sin(2 * np.pi * 1_000 * t), 0.5 * np.sin(2 * np.pi * 6_000 * t)
    for tone, kept in ((voice_band, True), (too_high, False)):
        heard = audio.through_phone(tone.astype(np.float32), rate)
        assert heard.dtype == np.float32 and abs(len(heard) - rate) <= 2
        ratio = np.sqrt(np.mean(heard[1000:-1000] ** 2) / np.mean(tone[1000:-1000] ** 2))
        assert (ratio > 0.9) if kept else (ratio < 0.05), ratio
