"""The turn end that fuses Smart Turn's answers, stt's words and the pause's length
(services/frontend/engines/semantic_turns.py), on recorded sequences.

The model's answers are the ones Smart Turn v3.2 gave espeak-ng clips in
bench/results/turn_bench.json (asked 0.16, 0.24, 0.32 s into the pause), played
back in order by an injected `predict`; the clock is the frames pushed (80 ms
each). Speech is a loud tone, silence zeros: only the level VAD hears them.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE
from services.frontend.engines.semantic_turns import (
    SmartTurnDetector,
    TurnTaking,
    asks_a_finished_question,
)
from services.frontend.engines.turns import TurnEvent

SPEECH = (0.3 * np.sin(2 * np.pi * 220 * np.arange(FRAME_SAMPLES) / SAMPLE_RATE)).astype(np.float32)
SILENCE = np.zeros(FRAME_SAMPLES, np.float32)
# turn_bench.json: whole questions and the words before a 0.6-0.9 s pause.
WHOLE_GERMANY = [0.0366, 0.2566, 0.1065]  # en-gb-x-gbclan+f4: "... of Germany?"
PAUSE_CAPITAL = [0.9228, 0.954, 0.9777]  # the same voice, before its pause: "What is the capital"
WHOLE_MOON = [0.296, 0.272, 0.2012]  # en-us: "Who was the first man on the moon?"
PAUSE_PRESIDENT = [0.9816, 0.9759, 0.9794]  # en-us+f3: "Who was the first president of"


@pytest.fixture
def worker() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as executor:
        yield executor


def turn_end_after(
    worker: ThreadPoolExecutor,
    answers: list[float],
    heard: str | None,
    pause_s: float = 1.6,
    **taking: float,
) -> tuple[float | None, str]:
    """Half a second of silence (the level VAD's floor), one second of speech,
    then `pause_s` of silence; `heard` is stt's transcript
    covering the speech (given as the pause begins), the model answers `answers`
    in turn. When the turn ended, in seconds of silence (None: not in the
    pause), and what ended it."""
    replies = iter(answers)
    detector = SmartTurnDetector(lambda _audio: next(replies), worker, TurnTaking(**taking))
    speech_frames, silent_frames = round(1.0 / FRAME_SECONDS), round(pause_s / FRAME_SECONDS)
    for _ in range(round(0.5 / FRAME_SECONDS)):
        detector.push(SILENCE)
    for _ in range(speech_frames):
        assert detector.push(SPEECH) is not TurnEvent.TURN_END
    if heard is not None:
        detector.heard(heard, detector.frames * FRAME_SECONDS)
    for silent in range(1, silent_frames + 1):
        event = detector.push(SILENCE)
        worker.submit(lambda: None).result()  # the answers asked so far are in
        if event is TurnEvent.TURN_END:
            return round(silent * FRAME_SECONDS, 2), detector.ended_by
    return None, ""


def test_a_finished_question_ends_on_its_words_where_the_model_is_unsure(worker):
    # Smart Turn hears these finished questions as unfinished (< 0.3): alone, the
    # caller waits for the 1.04 s fallback.
    for answers, text in [
        (WHOLE_GERMANY, "What is the capital of Germany?"),
        (WHOLE_MOON, "Who was the first man on the moon?"),
    ]:
        assert turn_end_after(worker, answers, None) == (1.04, "silence")
        assert turn_end_after(worker, answers, text) == (0.24, "words")
        # Words rule off: the transcript alone ends nothing.
        assert turn_end_after(worker, answers, text, words_end_s=0) == (1.04, "silence")


def test_a_mid_sentence_pause_is_not_cut_where_the_model_says_complete(worker):
    # The model says "complete" (>= 0.96 on both asks) before the pause; the words
    # before it are no finished question (dangling, or no question mark): no cut.
    assert turn_end_after(worker, PAUSE_PRESIDENT, "Who was the first president of", 0.88) == (
        None,
        "",
    )
    assert turn_end_after(worker, PAUSE_CAPITAL, "What is the capital", 0.88) == (None, "")
    # Without any words, a model that is sure ends the turn early (piper's case).
    assert turn_end_after(worker, [0.97, 0.98], None) == (0.32, "model")


def test_only_words_that_reach_the_speech_end_count(worker):
    replies = iter(WHOLE_MOON)
    detector = SmartTurnDetector(lambda _audio: next(replies), worker, TurnTaking())
    for frame in [SILENCE] * 6 + [SPEECH] * 12:
        detector.push(frame)
    detector.heard("Who was the first man on the moon?", 0.8)  # an earlier stretch's words
    events = []
    while TurnEvent.TURN_END not in events and len(events) < 20:
        events.append(detector.push(SILENCE))
        worker.submit(lambda: None).result()
    assert len(events) * FRAME_SECONDS == pytest.approx(1.04) and detector.ended_by == "silence"


def test_what_a_finished_question_is():
    assert asks_a_finished_question("What is the capital of France?")
    assert asks_a_finished_question(' Is it "open?" ')
    assert not asks_a_finished_question("What is the capital of?")  # dangling
    assert not asks_a_finished_question("What is the capital")
    assert not asks_a_finished_question("Paris.")
    assert not asks_a_finished_question("")
