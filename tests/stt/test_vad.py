"""Streaming Silero VAD and the segmenter that turns its probabilities into speech events."""

from __future__ import annotations

import numpy as np
import pytest
from faster_whisper.vad import get_vad_model

from kame_common.audio import SAMPLE_RATE, resample
from services.stt.vad import WINDOW_S, Segmenter, SileroVad, VadEvent


@pytest.fixture(scope="module")
def speech_16k(speak) -> np.ndarray:
    silence = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    audio = np.concatenate([silence, speak("Hello there. What is twelve times four?"), silence])
    audio16 = resample(audio, SAMPLE_RATE, 16_000)
    return audio16[: len(audio16) // 512 * 512]


def test_streaming_in_frames_matches_one_pass_over_the_clip(speech_16k):
    whole = get_vad_model()(speech_16k).reshape(-1)
    stream = SileroVad().stream()
    # 80 ms frames at 16 kHz are 1280 samples: windows straddle frame boundaries.
    chunks = [stream.process(speech_16k[i : i + 1280]) for i in range(0, len(speech_16k), 1280)]
    assert [len(c) for c in chunks[:4]] == [2, 3, 2, 3]
    streamed = np.concatenate(chunks)
    np.testing.assert_allclose(streamed, whole, atol=1e-5)
    assert streamed.max() > 0.9 and streamed[:10].max() < 0.1  # speech found, silence not


def _windows(pattern: str) -> np.ndarray:
    """'s' = a speech window (0.9), '.' = silence (0.05), '~' = in between (0.4)."""
    return np.array([{"s": 0.9, ".": 0.05, "~": 0.4}[c] for c in pattern], dtype=np.float32)


def test_segmenter_starts_at_speech_and_ends_after_the_endpoint_pause():
    segmenter = Segmenter(threshold=0.5, endpoint_silence_s=10 * WINDOW_S)
    assert segmenter.push(_windows("...")) == []
    assert segmenter.push(_windows("sss")) == [VadEvent("start", 3 * WINDOW_S)]
    assert segmenter.push(_windows("." * 9)) == []
    assert segmenter.speaking and segmenter.pause_s() == pytest.approx(9 * WINDOW_S)
    assert segmenter.push(_windows(".")) == [VadEvent("end", 6 * WINDOW_S)]
    assert not segmenter.speaking and segmenter.pause_start_s is None


def test_speech_inside_the_pause_cancels_it_and_in_between_keeps_it():
    segmenter = Segmenter(threshold=0.5, endpoint_silence_s=6 * WINDOW_S)
    # Pauses of 3 windows, then 5 (two silent and three in-between windows keep it going).
    assert segmenter.push(_windows("ss...s..~~~s")) == [VadEvent("start", 0.0)]
    assert segmenter.pause_start_s is None
    # In-between windows after speech do not start a pause; a silent one does.
    assert segmenter.push(_windows("s~~~~.")) == []
    assert segmenter.pause_start_s == pytest.approx(17 * WINDOW_S)
    assert segmenter.push(_windows("....")) == []
    assert segmenter.push(_windows(".")) == [VadEvent("end", 17 * WINDOW_S)]


def test_an_outside_end_of_speech_lets_the_next_speech_start_anew():
    segmenter = Segmenter(threshold=0.5, endpoint_silence_s=10 * WINDOW_S)
    assert segmenter.push(_windows("sss..")) == [VadEvent("start", 0.0)]
    segmenter.end_speech()  # the caller's turn ended before the endpoint pause
    assert not segmenter.speaking and segmenter.pause_start_s is None
    assert segmenter.push(_windows("." * 20)) == []  # no late end for the ended speech
    assert segmenter.push(_windows("s")) == [VadEvent("start", 25 * WINDOW_S)]
