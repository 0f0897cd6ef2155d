"""Stream behaviour over real gRPC: concurrent sessions, half-close, the maximum utterance
length, cancellation and admission."""

from __future__ import annotations

import asyncio
import itertools

import grpc
import numpy as np
import pytest

from kame_common.audio import SAMPLE_RATE
from kamepb import common_pb2, stt_pb2, stt_pb2_grpc
from services.stt.server import serve
from tests.support import wait_until, word_recall

SESSION_A = [
    "The quick brown fox jumps over the lazy dog.",
    "Please remind me to call my mother on Sunday.",
]
SESSION_B = [
    "I would like to book a table for two people at seven tonight.",
    "Can you tell me the weather in Paris tomorrow morning?",
]


async def test_two_sessions_at_once_do_not_cross(stt_stub, speak, stream_helpers, text_metrics):
    scripts = [
        stream_helpers.build_script(speak, texts, gap_s=1.0) for texts in (SESSION_A, SESSION_B)
    ]
    results = await asyncio.gather(
        *(
            stream_helpers.stream_audio(
                stt_stub, script.audio, stt_pb2.SttConfig(session_id=f"session-{name}")
            )
            for name, script in zip("ab", scripts, strict=True)
        )
    )
    for name, texts, result in zip("ab", (SESSION_A, SESSION_B), results, strict=True):
        assert len(result.finals()) == len(texts), [f.text for f in result.finals()]
        assert text_metrics.wer(" ".join(texts), result.final_text()) <= 0.15, result.final_text()
        assert all(t.utterance_id.startswith(f"session-{name}-") for t in result.transcripts)
    heard_a, heard_b = (set(text_metrics.normalize(r.final_text())) for r in results)
    said_a, said_b = (set(text_metrics.normalize(" ".join(t))) for t in (SESSION_A, SESSION_B))
    assert said_b - said_a and said_a - said_b
    assert not heard_a & (said_b - said_a), heard_a
    assert not heard_b & (said_a - said_b), heard_b


SPEECH_START = common_pb2.SpeechActivity.SPEECH_START
SPEECH_END = common_pb2.SpeechActivity.SPEECH_END
FINAL_DECODE = common_pb2.SpeechActivity.FINAL_DECODE


def speech_activities(result) -> list[common_pb2.SpeechActivity]:
    """SPEECH_START and SPEECH_END (without FINAL_DECODE, which each final decode adds)."""
    return [a for a in result.activities if a.kind != FINAL_DECODE]


async def test_half_close_finalizes_the_open_utterance(
    stt_stub, speak, stream_helpers, text_metrics
):
    text = "Please remind me to call my mother on Sunday."
    speech = speak(text)
    end = stream_helpers.speech_bounds(speech)[1] / SAMPLE_RATE
    # The stream stops right after the speech: no endpoint pause ever comes.
    result = await stream_helpers.stream_audio(
        stt_stub, speech, stt_pb2.SttConfig(session_id="half-close", endpoint_silence_s=2.0)
    )
    start, speech_end = speech_activities(result)
    assert (start.kind, speech_end.kind) == (SPEECH_START, SPEECH_END)
    assert speech_end.at_s <= len(speech) / SAMPLE_RATE
    assert speech_end.at_s == pytest.approx(end, abs=0.35)
    assert FINAL_DECODE in [a.kind for a in result.activities]  # said before the final
    (final,) = result.finals()
    assert text_metrics.wer(text, final.text) <= 0.15, final.text
    assert result.responses[-1].response.transcript.is_final  # and then the stream ended


async def test_long_speech_is_cut_at_the_maximum_utterance_length(stt_stub, speak, stream_helpers):
    text = (
        "Turn off the lights in the kitchen and lock the front door, "
        "then set an alarm for six thirty in the morning."
    )
    speech = speak(text)
    assert len(speech) / SAMPLE_RATE > 4.5
    result = await stream_helpers.stream_audio(
        stt_stub, speech, stt_pb2.SttConfig(session_id="long", max_utterance_s=2.0)
    )
    finals = result.finals()
    assert len(finals) >= 2
    for earlier, later in itertools.pairwise(finals):
        assert later.span.start_s == pytest.approx(earlier.span.end_s, abs=1e-6)
        assert earlier.span.end_s - earlier.span.start_s == pytest.approx(2.0, abs=0.1)
    # Speech went on across the cuts: one start, one end; a final decode per final.
    assert [a.kind for a in speech_activities(result)] == [SPEECH_START, SPEECH_END]
    assert [a.kind for a in result.activities].count(FINAL_DECODE) >= len(finals)
    # Words split by a cut may be lost; most survive. Recall, not the error rate:
    # Whisper can repeat words of a segment cut mid-word, which says nothing of cuts.
    assert word_recall(text, result.final_text()) >= 0.6, result.final_text()


async def test_a_cancelled_call_frees_its_session(
    stt_stub, stt_server, stt_engine, speak, stream_helpers
):
    frames = stream_helpers.audio_frames(speak("The quick brown fox jumps over the lazy dog."))

    async def requests():
        yield stt_pb2.TranscribeRequest(config=stt_pb2.SttConfig(session_id="cancelled"))
        for seq, pcm in enumerate(frames):
            yield stream_helpers.frame_request(pcm, seq)
        await asyncio.Event().wait()  # never half-closes

    call = stt_stub.Transcribe(requests())
    async for response in call:
        if response.HasField("transcript"):
            break  # speech was being decoded when the client went away
    call.cancel()
    await wait_until(lambda: not stt_server.active_sessions, "the session to end", 5)
    await wait_until(lambda: not stt_engine.scheduler.depth, "the decode queue to empty", 10)


async def test_a_full_replica_refuses_with_resource_exhausted(stt_engine, stream_helpers):
    runtime = await serve(stream_helpers.loopback_settings(max_sessions=1), stt_engine)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
            stub = stt_pb2_grpc.SttStub(channel)
            release = asyncio.Event()

            async def held_open():
                yield stt_pb2.TranscribeRequest(config=stt_pb2.SttConfig(session_id="first"))
                await release.wait()

            first = stub.Transcribe(held_open())
            first_done = asyncio.ensure_future(first.read())
            await wait_until(lambda: runtime.active_sessions == 1, "the first session")
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stream_helpers.stream_audio(
                    stub, np.zeros(0, dtype=np.float32), stt_pb2.SttConfig(session_id="second")
                )
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            release.set()
            assert await first_done == grpc.aio.EOF
    finally:
        await runtime.stop()


async def test_progress_comes_through_silence_as_often_as_asked(stt_stub, stream_helpers):
    silence = np.zeros(int(3.2 * SAMPLE_RATE), np.float32)  # 40 frames
    config = stt_pb2.SttConfig(session_id="progress", progress_interval_s=0.5)
    result = await stream_helpers.stream_audio(stt_stub, silence, config)
    progress = [
        r.response.progress.audio_s for r in result.responses if r.response.HasField("progress")
    ]
    # Every 0.5 s of audio through the VAD, each at the first chunk the resampler
    # hands on past its mark (a frame or two of audio).
    assert len(progress) == 6, progress
    assert all(0.5 * (i + 1) <= p < 0.5 * (i + 1) + 0.2 for i, p in enumerate(progress)), progress
    assert not result.transcripts and not result.activities  # nobody spoke


async def test_no_progress_unless_asked(stt_stub, stream_helpers):
    silence = np.zeros(SAMPLE_RATE, np.float32)
    result = await stream_helpers.stream_audio(
        stt_stub, silence, stt_pb2.SttConfig(session_id="quiet")
    )
    assert not [r for r in result.responses if r.response.HasField("progress")]
