"""Windowed, batched Whisper decodes: as accurate as the full 30 s window, batches
that hear each utterance as it would be heard alone, and loops into the padding cut."""

from __future__ import annotations

import numpy as np
import pytest

from kame_common.audio import SAMPLE_RATE, resample
from services.stt.engine import SttEngine
from services.stt.vad import VAD_RATE
from services.stt.whisper import TIMESTAMP_STEP_S, _spoken_segments
from tests.support import word_recall

PIPER_SENTENCES = [
    "What is twelve times four?",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "I would like to book a table for two people at seven tonight.",
    "Can you tell me the weather in Paris tomorrow morning?",
]


def _at_16k(samples: np.ndarray) -> np.ndarray:
    return resample(np.asarray(samples, dtype=np.float32), SAMPLE_RATE, VAD_RATE)


def _text(decoded) -> str:
    return " ".join(word.text for word in decoded.words)


def test_windowed_decodes_are_as_accurate_as_the_full_window(
    stt_engine: SttEngine, speak, espeak_questions, text_metrics
):
    """espeak-ng's voices (all 14 questions) and piper, each utterance alone in its
    fitted window, against faster-whisper's own 30 s window at the same greedy
    search: no more errors, give or take one word in the set."""
    clips = [(q.text, _at_16k(q.audio)) for q in espeak_questions]
    clips += [(text, _at_16k(speak(text))) for text in PIPER_SENTENCES]
    windowed, full, words = 0.0, 0.0, 0
    for said, audio in clips:
        (decoded,) = stt_engine.decode_batch([stt_engine.request(audio, 0.0, "en", 1)])
        segments, _info = stt_engine.model.transcribe(
            audio, language="en", beam_size=1, temperature=0.0, condition_on_previous_text=False
        )
        n = len(text_metrics.normalize(said))
        windowed += text_metrics.wer(said, _text(decoded)) * n
        full += text_metrics.wer(said, " ".join(s.text for s in segments)) * n
        words += n
    assert windowed <= full + 1, f"windowed {windowed:g} vs full {full:g} errors in {words} words"


def test_a_batch_hears_each_utterance_as_it_is_heard_alone(
    stt_engine: SttEngine, speak, espeak_questions, text_metrics
):
    """Utterances of different lengths and voices share one window (the longest's);
    each keeps its own words, times and offset."""
    clips = [
        ("What is twelve times four?", _at_16k(speak("What is twelve times four?"))),
        (espeak_questions[1].text, _at_16k(espeak_questions[1].audio)),
        (
            "I would like to book a table for two people at seven tonight.",
            _at_16k(speak("I would like to book a table for two people at seven tonight.")),
        ),
    ]
    requests = [
        stt_engine.request(audio, offset_s=5.0 * i, language="en", beam_size=1)
        for i, (_text_said, audio) in enumerate(clips)
    ]
    batch = stt_engine.decode_batch(requests)
    assert [d.batch_size for d in batch] == [3, 3, 3]
    alone = [stt_engine.decode_batch([request])[0] for request in requests]
    for (said, audio), together, single, request in zip(clips, batch, alone, requests, strict=True):
        assert text_metrics.wer(said, _text(together)) <= 0.2, (said, _text(together))
        assert text_metrics.wer(_text(single), _text(together)) <= 0.2
        starts = [w.start_s for w in together.words]
        assert starts == sorted(starts)
        assert request.offset_s <= starts[0]
        assert together.words[-1].end_s <= request.offset_s + len(audio) / VAD_RATE + 1e-6


def test_too_little_audio_is_not_decoded(stt_engine: SttEngine, speak):
    speech = stt_engine.request(_at_16k(speak("Hello there.")), 0.0, "en", 1)
    blip = stt_engine.request(np.zeros(VAD_RATE // 20, dtype=np.float32), 0.0, "en", 1)
    decoded = stt_engine.decode_batch([blip, speech])
    assert decoded[0].words == [] and decoded[0].seconds == 0.0
    assert decoded[1].words and decoded[1].batch_size == 1


class _Result:
    """What CTranslate2's generate returns, for one sequence."""

    def __init__(self, tokens: list[int], no_speech_prob: float = 0.0) -> None:
        self.sequences_ids = [tokens]
        self.scores = [-0.1]
        self.no_speech_prob = no_speech_prob


@pytest.fixture(scope="module")
def tokenizer(stt_engine: SttEngine):
    return stt_engine.whisper._tokenizer("en")


def _timestamp(tokenizer, seconds: float) -> int:
    return tokenizer.timestamp_begin + round(seconds / TIMESTAMP_STEP_S)


def test_a_segment_repeating_the_one_before_is_a_loop_and_is_cut(tokenizer):
    words = tokenizer.encode(" What is twelve times four?")
    ts = lambda s: _timestamp(tokenizer, s)  # noqa: E731
    looped = [ts(0), *words, ts(1.5), ts(1.5), *words, ts(3.0), ts(3.0), *words]
    segments = _spoken_segments(_Result(looped), tokenizer, content_s=4.0)
    assert [s.tokens for s in segments] == [tuple(words)]
    other = tokenizer.encode(" And then some more.")
    two = [ts(0), *words, ts(1.5), ts(1.5), *other, ts(3.0), tokenizer.eot]
    assert len(_spoken_segments(_Result(two), tokenizer, content_s=4.0)) == 2


def test_a_segment_saying_the_start_again_is_a_loop_and_is_cut(tokenizer):
    """Whisper closed its segment before the speech ended and began the utterance
    again inside the audio (what it did on piper's door code question)."""
    words = tokenizer.encode(" What is the door code for the Paris office?")
    ts = lambda s: _timestamp(tokenizer, s)  # noqa: E731
    looped = [ts(0), *words, ts(2.0), ts(2.0), *words[:8]]
    segments = _spoken_segments(_Result(looped), tokenizer, content_s=2.5)
    assert [s.tokens for s in segments] == [tuple(words)]
    # Again from the first segment's start, after a second one.
    other = tokenizer.encode(" And the London one.")
    twice = [ts(0), *words, ts(2.0), ts(2.0), *other, ts(3.0), ts(3.0), *words[:5], ts(3.5)]
    segments = _spoken_segments(_Result(twice), tokenizer, content_s=4.0)
    assert [s.tokens for s in segments] == [tuple(words), tuple(other)]
    # A few words said again are speech ("No. No, I said").
    no = tokenizer.encode(" No.")
    speech = [ts(0), *no, ts(0.5), ts(0.6), *tokenizer.encode(" No, I said."), ts(1.5)]
    assert len(_spoken_segments(_Result(speech), tokenizer, content_s=2.0)) == 2


def test_a_phrase_said_twice_in_a_row_is_a_loop_and_ends_its_segment(tokenizer):
    words = tokenizer.encode(" What is twelve times four?")
    ts = lambda s: _timestamp(tokenizer, s)  # noqa: E731
    tokens = [ts(0), *words, *words, *words[:3]]
    (segment,) = _spoken_segments(_Result(tokens), tokenizer, content_s=4.0)
    assert segment.tokens == tuple(words)
    # A short word repeated ("no, no") is speech, not a loop.
    no = tokenizer.encode(" no")
    speech = [ts(0), *no, *no, *tokenizer.encode(" I said no."), ts(2.0)]
    (kept,) = _spoken_segments(_Result(speech), tokenizer, content_s=4.0)
    assert len(kept.tokens) == len(speech) - 2


def test_a_segment_that_starts_past_the_audio_is_cut(tokenizer):
    words, more = tokenizer.encode(" Turn off the lights."), tokenizer.encode(" Thank you.")
    ts = lambda s: _timestamp(tokenizer, s)  # noqa: E731
    tokens = [ts(0), *words, ts(1.2), ts(2.6), *more, ts(3.2)]
    segments = _spoken_segments(_Result(tokens), tokenizer, content_s=2.5)
    assert [s.tokens for s in segments] == [tuple(words)]
    assert segments[0].start_s == 0.0 and segments[0].end_s == pytest.approx(1.2)


def test_silence_by_whisper_own_rule_has_no_segments(tokenizer):
    tokens = [_timestamp(tokenizer, 0), *tokenizer.encode(" you"), _timestamp(tokenizer, 1)]
    quiet = _Result(tokens, no_speech_prob=0.9)
    quiet.scores = [-3.0]
    assert _spoken_segments(quiet, tokenizer, content_s=2.0) == []


def test_an_utterance_past_30_s_is_decoded_in_the_full_window(stt_engine: SttEngine, speak):
    """A max-length cut plus its pre-roll can pass Whisper's 30 s by a little."""
    speech = _at_16k(speak("Turn off the lights."))
    long = np.concatenate([speech, np.zeros(int(30.5 * VAD_RATE) - len(speech), np.float32)])
    decoded, short = stt_engine.decode_batch(
        [stt_engine.request(long, 0.0, "en", 1), stt_engine.request(speech, 0.0, "en", 1)]
    )
    # Both heard the words (a recall with a margin, not one exact word).
    for result in (decoded, short):
        assert word_recall("Turn off the lights.", _text(result)) >= 0.5, _text(result)
    assert decoded.words[-1].end_s <= 30.5
