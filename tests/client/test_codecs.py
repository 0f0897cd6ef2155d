"""Client codecs: every format round-trips real speech through Encoder ->
Decoder (what a client sends and the gateway reads, and back), Opus included
(PyAV's libopus), and bad formats or undecodable chunks raise CodecError
saying what was expected."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kame_client.codecs import CodecError, Decoder, Encoder, resolve_format
from kame_common.audio import SAMPLE_RATE, resample
from kamepb import gateway_pb2

Codec = gateway_pb2.AudioFormat.Codec


def fmt(codec: int, rate: int = 0) -> gateway_pb2.AudioFormat:
    return gateway_pb2.AudioFormat(codec=codec, sample_rate_hz=rate)


def round_trip(samples: np.ndarray, codec: int, rate: int = 0, chunk: int = 1920) -> tuple:
    audio_format = resolve_format(fmt(codec, rate), "input_format")
    encoder, decoder = Encoder(audio_format), Decoder(audio_format)
    chunks = []
    for start in range(0, len(samples), chunk):
        chunks += encoder.encode(samples[start : start + chunk])
    chunks += encoder.flush()
    decoded = np.concatenate([decoder.decode(c) for c in chunks] + [decoder.flush()])
    return chunks, decoded


def aligned_error(original: np.ndarray, decoded: np.ndarray, max_lag: int = 2000) -> float:
    """RMS error relative to the signal's RMS, at the best lag (codec delay)."""
    span = len(original) - max_lag
    errors = [
        np.sqrt(np.mean((decoded[lag : lag + span] - original[:span]) ** 2))
        for lag in range(max_lag)
    ]
    return float(min(errors) / np.sqrt(np.mean(original[:span] ** 2)))


@pytest.fixture(scope="module")
def question(speak) -> np.ndarray:
    speech = speak("What is the capital of France?")
    return (0.5 * speech / np.max(np.abs(speech))).astype(np.float32)  # no clipping anywhere


@pytest.mark.parametrize("rate", [8_000, 16_000, 24_000, 44_100, 48_000])
def test_pcm16_any_rate_round_trips(question, rate):
    # Band-limit to what the lowest rate carries, so the comparison is fair.
    reference = resample(resample(question, SAMPLE_RATE, 8_000), 8_000, SAMPLE_RATE)
    _, decoded = round_trip(reference, Codec.PCM16, rate)
    assert len(decoded) == len(reference)
    assert aligned_error(reference, decoded) < 0.01


def test_pcm16_at_24k_is_bit_exact(question):
    chunks, decoded = round_trip(question, Codec.PCM16)
    assert all(len(c) == 1920 * 2 for c in chunks[:-1])
    assert np.max(np.abs(decoded - question)) <= 1 / 32768


@pytest.mark.parametrize("codec", [Codec.MULAW, Codec.ALAW])
def test_g711_round_trips_at_8k(question, codec):
    reference = resample(resample(question, SAMPLE_RATE, 8_000), 8_000, SAMPLE_RATE)
    chunks, decoded = round_trip(reference, codec)
    assert sum(len(c) for c in chunks) == pytest.approx(len(reference) / 3, abs=2)  # 1 byte/sample
    assert aligned_error(reference, decoded) < 0.1  # G.711 is 8-bit log-companded


def test_opus_round_trips_one_packet_per_80_ms(question):
    chunks, decoded = round_trip(question, Codec.OPUS)
    duration_s = len(question) / SAMPLE_RATE
    assert len(chunks) == pytest.approx(duration_s / 0.08, abs=2)
    assert all(0 < len(c) < 1000 for c in chunks)  # compressed packets, not raw PCM
    assert aligned_error(question, decoded) < 0.35  # lossy, but the same speech


def test_opus_packets_decode_with_a_fresh_pyav_decoder(question):
    """What the gateway sends is plain Opus: an independent decoder reads it."""
    import av

    chunks, _ = round_trip(question, Codec.OPUS)
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate, decoder.layout = 48_000, "mono"
    samples = sum(frame.samples for c in chunks for frame in decoder.decode(av.Packet(c)))
    assert samples == pytest.approx(len(question) * 2, rel=0.1)


def test_garbage_opus_is_a_codec_error():
    decoder = Decoder(resolve_format(fmt(Codec.OPUS), "input_format"))
    with pytest.raises(CodecError, match="does not decode as Opus"):
        for _ in range(30):  # a random packet can look valid; 30 in a row cannot
            decoder.decode(os.urandom(120))


def test_empty_opus_chunk_is_a_codec_error():
    decoder = Decoder(resolve_format(fmt(Codec.OPUS), "input_format"))
    with pytest.raises(CodecError, match="one Opus packet"):
        decoder.decode(b"")


def test_odd_pcm16_chunk_is_a_codec_error():
    decoder = Decoder(resolve_format(fmt(Codec.PCM16, 16_000), "input_format"))
    with pytest.raises(CodecError, match=r"an even byte count\), got 3 bytes"):
        decoder.decode(b"\x00\x01\x02")


@pytest.mark.parametrize(
    ("codec", "rate", "message"),
    [
        (99, 0, "input_format.codec: unknown codec 99"),
        (Codec.PCM16, 1_000, "input_format.sample_rate_hz: PCM16 needs 8000..192000 Hz, got 1000"),
        (Codec.MULAW, 16_000, "MULAW is 8000 Hz, got 16000"),
        (Codec.ALAW, 24_000, "ALAW is 8000 Hz, got 24000"),
        (Codec.OPUS, 16_000, "OPUS decodes at 48000 Hz, got 16000"),
    ],
)
def test_bad_formats_name_the_field(codec, rate, message):
    with pytest.raises(CodecError, match=message):
        resolve_format(fmt(codec, rate), "input_format")


def test_natural_rates_fill_in():
    assert resolve_format(fmt(Codec.CODEC_UNSPECIFIED), "f").codec == "pcm16"
    assert resolve_format(fmt(Codec.PCM16), "f").sample_rate == 24_000
    assert resolve_format(fmt(Codec.MULAW), "f").sample_rate == 8_000
    assert resolve_format(fmt(Codec.OPUS), "f").sample_rate == 48_000
