"""The engine without gRPC: whole-clip transcription, early finals, and overload."""

from __future__ import annotations

import asyncio

import numpy as np
from prometheus_client import REGISTRY

from kame_common.audio import SAMPLE_RATE, resample
from kamepb import common_pb2
from services.stt.config import SttSettings, stream_settings
from services.stt.engine import SttEngine
from services.stt.session import AudioBuffer, SttSession


def _sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


async def _run_session(engine, frames: list[bytes], **overrides) -> list:
    """Feed every frame as fast as the session takes it, then finish; all responses."""
    session = SttSession(engine, stream_settings("engine", "en", overrides, SttSettings()))

    async def feed():
        for pcm in frames:
            await session.push_frame(pcm)
        await session.finish()

    feeder = asyncio.create_task(feed())
    try:
        responses = [response async for response in session.events()]
        await feeder
    finally:
        await session.aclose()
    return responses


def _finals(responses) -> list[common_pb2.TranscriptEvent]:
    return [r.transcript for r in responses if r.HasField("transcript") and r.transcript.is_final]


def test_other_voices_are_heard(stt_engine, espeak_questions, text_metrics):
    """Not tuned to one voice: espeak-ng's voices (US, British, Scottish, Caribbean;
    male and female; 130-160 words a minute) are recognized as well as piper's."""
    errors = {
        q.text: text_metrics.wer(q.text, stt_engine.transcribe_clip(q.audio))
        for q in espeak_questions[:6]
    }
    assert sum(errors.values()) / len(errors) <= 0.15, errors
    assert max(errors.values()) <= 0.4, errors


def test_transcribe_clip_hears_a_whole_clip(stt_engine, speak, text_metrics):
    silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
    clip = np.concatenate([silence, speak("What is the capital of France?"), silence])
    text = stt_engine.transcribe_clip(clip)
    assert text_metrics.wer("What is the capital of France?", text) <= 0.15, text
    resampled = stt_engine.transcribe_clip(clip[::3], sample_rate=SAMPLE_RATE // 3)
    assert {"capital", "france"} <= set(text_metrics.normalize(resampled)), resampled


async def test_a_pause_shorter_than_the_endpoint_discards_the_early_final(
    stt_engine, speak, stream_helpers, text_metrics
):
    texts = ["Turn off the lights.", "Then lock the front door."]
    # 0.4 s of silence: past the early-final point (0.2 s), short of the 0.8 s endpoint.
    script = stream_helpers.build_script(speak, texts, gap_s=0.4)
    discarded = _sample("kame_stt_early_finals_discarded_total")
    responses = await _run_session(
        stt_engine, stream_helpers.audio_frames(script.audio), endpoint_silence_s=0.8
    )
    (final,) = _finals(responses)
    assert text_metrics.wer(" ".join(texts), final.text) <= 0.2, final.text
    assert _sample("kame_stt_early_finals_discarded_total") >= discarded + 1


async def test_overload_skips_partials_but_never_finals(
    stt_engine, speak, stream_helpers, text_metrics
):
    texts = [
        "The quick brown fox jumps over the lazy dog near the river bank.",
        "I would like to book a table for two people at seven tonight.",
        "Can you tell me the weather in Paris tomorrow morning?",
    ]
    script = stream_helpers.build_script(speak, texts, gap_s=1.0)
    frames = stream_helpers.audio_frames(script.audio)
    skipped = sum(
        _sample("kame_stt_partials_skipped_total", reason=reason)
        for reason in ("superseded", "finalized", "output_full")
    )
    # Three sessions fed far faster than real time: partials pile up, finals may not.
    results = await asyncio.gather(*(_run_session(stt_engine, frames) for _ in range(3)))
    for responses in results:
        finals = _finals(responses)
        assert len(finals) == len(texts)
        assert text_metrics.wer(" ".join(texts), " ".join(f.text for f in finals)) <= 0.15
    skipped_now = sum(
        _sample("kame_stt_partials_skipped_total", reason=reason)
        for reason in ("superseded", "finalized", "output_full")
    )
    assert skipped_now > skipped


def test_audio_buffer_addresses_samples_in_stream_seconds():
    buffer = AudioBuffer()
    for chunk in np.split(np.arange(32_000, dtype=np.float32), 4):  # 2 s at 16 kHz
        buffer.append(chunk)
    assert (buffer.start_s, buffer.end_s) == (0.0, 2.0)
    np.testing.assert_array_equal(buffer.slice(0.5, 0.5 + 1 / 16_000), [8000.0])
    buffer.keep_from(1.25)
    assert (buffer.start_s, buffer.end_s) == (1.25, 2.0)
    np.testing.assert_array_equal(buffer.slice(0.0, 1.25 + 2 / 16_000), [20_000.0, 20_001.0])
    buffer.append(np.array([-1.0], dtype=np.float32))
    assert buffer.slice(1.9, 3.0)[-1] == -1.0 and buffer.end_s == 2.0 + 1 / 16_000


def test_without_word_alignment_words_are_spread_over_their_segment(speak, text_metrics):
    engine = SttEngine(SttSettings(word_timestamps=False))
    try:
        speech = resample(speak("Please remind me to call my mother."), SAMPLE_RATE, 16_000)
        (decoded,) = engine.decode_batch([engine.request(speech, 10.0, "en", beam_size=1)])
    finally:
        engine.close()
    text = " ".join(w.text for w in decoded.words)
    assert text_metrics.wer("Please remind me to call my mother.", text) <= 0.15, text
    starts = [w.start_s for w in decoded.words]
    assert starts == sorted(starts)
    assert 10.0 <= starts[0] and decoded.words[-1].end_s <= 10.0 + len(speech) / 16_000 + 0.05
