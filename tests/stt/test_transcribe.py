"""Transcribe over real gRPC with real piper speech, paced at real time: finals, partials,
prefix stability, timings, speech activity and the lag metrics."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import REGISTRY

from kamepb import common_pb2, stt_pb2, stt_pb2_grpc
from services.stt.config import SttSettings
from services.stt.server import serve
from services.stt.session import FINAL_TAIL_S

SENTENCES = [
    "What is twelve times four?",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "I would like to book a table for two people at seven tonight.",
    "Can you tell me the weather in Paris tomorrow morning?",
    "Please remind me to call my mother on Sunday.",
]
# Long enough that the previous final is done before the next utterance's first partial.
GAP_S = 2.0
ENDPOINT_S = 0.5
# Silero scores 32 ms windows and reacts within a few of them.
VAD_TOLERANCE_S = 0.35
METRICS = {
    "partial_lag": ("kame_stt_partial_lag_seconds_count", {}),
    "final_lag": ("kame_stt_final_lag_seconds_count", {}),
    "final_rtf": ("kame_stt_decode_rtf_count", {"kind": "final"}),
    "partial_rtf": ("kame_stt_decode_rtf_count", {"kind": "partial"}),
}


def _metric_totals() -> dict[str, float]:
    return {
        key: REGISTRY.get_sample_value(name, labels) or 0.0
        for key, (name, labels) in METRICS.items()
    }


@pytest.fixture(scope="module")
def paced(stt_engine, speak, stream_helpers):
    """One session streaming all sentences at real time (about 25 s)."""
    script = stream_helpers.build_script(speak, SENTENCES, gap_s=GAP_S)

    async def run():
        runtime = await serve(stream_helpers.loopback_settings(), stt_engine)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
                return await stream_helpers.stream_audio(
                    stt_pb2_grpc.SttStub(channel),
                    script.audio,
                    stt_pb2.SttConfig(session_id="paced", endpoint_silence_s=ENDPOINT_S),
                    realtime=True,
                )
        finally:
            await runtime.stop()

    before = _metric_totals()
    result = asyncio.run(run())
    after = _metric_totals()
    return script, result, {key: after[key] - before[key] for key in METRICS}


def _utterances(result):
    """(SPEECH_START, partials, SPEECH_END, final) per utterance, in order."""
    out = []
    for utterance_id in result.utterance_ids():
        events = result.events_of(utterance_id)
        out.append(events)
    return out


def test_one_final_per_sentence_with_low_word_error_rate(paced, text_metrics):
    _script, result, _ = paced
    finals = result.finals()
    assert len(finals) == len(SENTENCES), [f.text for f in finals]
    for final, sentence in zip(finals, SENTENCES, strict=True):
        print(f"{text_metrics.wer(sentence, final.text):.2f}  {sentence!r} -> {final.text!r}")
    wer = text_metrics.wer(" ".join(SENTENCES), result.final_text())
    assert wer <= 0.15, (wer, result.final_text())
    question = finals[0].text
    assert text_metrics.normalize(question)[-3:] == ["twelve", "times", "four"], question


def test_speech_activity_brackets_each_utterance(paced):
    script, result, _ = paced
    utterances = _utterances(result)
    assert len(utterances) == len(script.spans)
    for events, (speech_start, speech_end) in zip(utterances, script.spans, strict=True):
        start, end, final = events[0], None, events[-1]
        assert isinstance(start, common_pb2.SpeechActivity)
        assert start.kind == common_pb2.SpeechActivity.SPEECH_START
        assert isinstance(final, common_pb2.TranscriptEvent) and final.is_final
        ends = [
            e
            for e in events
            if isinstance(e, common_pb2.SpeechActivity)
            and e.kind == common_pb2.SpeechActivity.SPEECH_END
        ]
        assert len(ends) == 1
        end = ends[0]
        assert abs(start.at_s - speech_start) <= VAD_TOLERANCE_S, (start.at_s, speech_start)
        assert abs(end.at_s - speech_end) <= VAD_TOLERANCE_S, (end.at_s, speech_end)
        assert events.index(end) < len(events) - 1  # SPEECH_END comes before the final


def test_a_partial_precedes_the_final_of_every_long_utterance(paced):
    _, result, _ = paced
    long_utterances = 0
    for events in _utterances(result):
        start, end = (
            events[0],
            next(
                e
                for e in events
                if isinstance(e, common_pb2.SpeechActivity)
                and e.kind == common_pb2.SpeechActivity.SPEECH_END
            ),
        )
        if end.at_s - start.at_s < 2.0:
            continue
        long_utterances += 1
        transcripts = [e for e in events if isinstance(e, common_pb2.TranscriptEvent)]
        assert transcripts[-1].is_final
        assert any(not t.is_final for t in transcripts[:-1]), [t.text for t in transcripts]
    assert long_utterances >= 3


def test_partials_keep_their_stable_prefix(paced):
    _, result, _ = paced
    stable_words_seen = 0
    for events in _utterances(result):
        partials = [
            e for e in events if isinstance(e, common_pb2.TranscriptEvent) and not e.is_final
        ]
        previous_stable: list[str] = []
        for partial in partials:
            stable = partial.stable_text.split()
            assert partial.text.split()[: len(stable)] == stable, partial
            assert stable[: len(previous_stable)] == previous_stable, (previous_stable, stable)
            assert 0.0 <= partial.stability <= 1.0
            assert partial.stability == pytest.approx(len(stable) / max(len(partial.words), 1))
            previous_stable = stable
            stable_words_seen += len(stable)
        final = events[-1]
        assert final.stability == 1.0 and final.stable_text == final.text
    assert stable_words_seen > 0  # the property above was exercised


def test_word_timings_lie_in_the_sentence_and_the_span(paced):
    script, result, _ = paced
    for final, (speech_start, speech_end) in zip(result.finals(), script.spans, strict=True):
        assert final.span.start_s == pytest.approx(
            max(speech_start - SttSettings.pre_roll_s, 0), abs=0.4
        )
        assert final.span.end_s == pytest.approx(speech_end + FINAL_TAIL_S, abs=0.4)
        assert [w.word for w in final.words] == final.text.split()
        starts = [w.start_s for w in final.words]
        assert starts == sorted(starts)
        for word in final.words:
            assert word.start_s <= word.end_s
            assert final.span.start_s - 0.05 <= word.start_s
            assert word.end_s <= final.span.end_s + 0.05
            assert speech_start - 0.5 <= word.start_s and word.end_s <= speech_end + 0.5
            assert 0.0 <= word.probability <= 1.0


def test_lags_are_measured_and_the_final_waits_for_the_endpoint(paced):
    script, result, metric_deltas = paced
    for transcript in result.transcripts:
        assert 0.0 <= transcript.lag_s < 15.0
    for final, (_, speech_end) in zip(result.finals(), script.spans, strict=True):
        after_speech = result.received_at(final) - result.sent_at(speech_end)
        # No final before the pause is confirmed; under load it can trail by seconds.
        assert ENDPOINT_S - VAD_TOLERANCE_S <= after_speech < 15.0, after_speech
    assert metric_deltas["final_lag"] == len(SENTENCES)
    partials = sum(1 for t in result.transcripts if not t.is_final)
    assert metric_deltas["partial_lag"] == partials
    # Every final was decoded (early finals the caller talked through add to the count),
    # and at least every emitted partial but those that carry an early final's words
    # (all stable, decoded as a final).
    assert metric_deltas["final_rtf"] >= len(SENTENCES)
    unsettled = sum(1 for t in result.transcripts if not t.is_final and t.stability < 1.0)
    assert metric_deltas["partial_rtf"] >= unsettled
    assert REGISTRY.get_sample_value("kame_active_sessions", {"service": "stt"}) == 0
