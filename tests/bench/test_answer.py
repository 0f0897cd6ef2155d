"""Answer latency and coherence on hand-made event lists, as `kame talk` records
them: the agent's words (agent_text with start_s and generation) and the
oracle updates (RESET, APPEND) of each generation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kame_cli.bench import answer
from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE

SPEECH_START_S, SPEECH_END_S = 0.5, 2.0


def said(heard_t: float, text: str, generation: int) -> dict[str, Any]:
    """An agent_text event already placed in time (heard_t)."""
    return {
        "t": heard_t - 0.01,
        "type": "agent_text",
        "text": text,
        "start_s": heard_t - 0.05,
        "generation": generation,
        "heard_t": heard_t,
    }


def update(t: float, op: str, generation: int, text: str) -> dict[str, Any]:
    return {"t": t, "type": f"oracle_{op}", "generation": generation, "text": text}


def oracle(generation: int, *texts: str, t: float = 1.5) -> list[dict[str, Any]]:
    """A generation as the oracle streams it: a RESET, then APPENDs."""
    first, *rest = texts
    return [update(t, "reset", generation, first)] + [
        update(t + 0.1 * (i + 1), "append", generation, text) for i, text in enumerate(rest)
    ]


def test_answer_latency_starts_after_the_hold_phrase():
    events = [
        *oracle(3, "Rome is", "the capital of Italy."),
        said(2.2, "Hmm,", 0),
        said(2.9, "Rome", 3),
        said(3.2, "is", 3),
    ]
    assert answer.answer_latency_s(events, SPEECH_START_S, SPEECH_END_S) == pytest.approx(0.9)


def test_no_answer_word_means_no_answer_latency():
    events = [said(2.2, "Let me", 0), said(2.5, "see,", 0)]
    assert answer.answer_latency_s(events, SPEECH_START_S, SPEECH_END_S) is None
    assert answer.answer_latency_s([], SPEECH_START_S, SPEECH_END_S) is None
    assert answer.answer_latency_s([said(2.9, "Rome", 3)], SPEECH_START_S, None) is None


def test_words_are_placed_where_their_audio_reached_the_client():
    # 40 frames, each arriving 0.03 s after it was due, so stream second s
    # reached the client at s + 0.08 + 0.03.
    agent_t = [
        (k + 1) * FRAME_SECONDS + 0.03 + np.arange(FRAME_SAMPLES) / SAMPLE_RATE for k in range(40)
    ]
    word = {"t": 0.2, "type": "agent_text", "text": "Rome", "start_s": 2.4, "generation": 2}
    unheard = {"t": 3.3, "type": "agent_text", "text": "is", "start_s": 9.0, "generation": 2}
    events = [word, unheard]
    answer.place_agent_words(events, agent_t)
    assert word["heard_t"] == pytest.approx(2.4 + FRAME_SECONDS + 0.03, abs=1e-3)
    assert unheard["heard_t"] is None  # its audio never came: its arrival (t) stands in
    latency = answer.answer_latency_s(events, SPEECH_START_S, SPEECH_END_S)
    assert latency == pytest.approx(word["heard_t"] - SPEECH_END_S)


def test_words_before_the_question_are_not_the_answer():
    events = [
        said(0.3, "Hello", 0),  # a greeting before the caller spoke
        said(0.4, "there", 7),
        *oracle(8, "Rome."),
        said(2.6, "Rome.", 8),
    ]
    assert answer.answer_latency_s(events, SPEECH_START_S, SPEECH_END_S) == pytest.approx(0.6)
    verdict = answer.coherence(events, SPEECH_START_S)
    assert verdict.coherent and verdict.generation == 8 and verdict.hold_words == 0


def test_a_hold_phrase_then_one_generation_is_coherent():
    events = [
        *oracle(4, "Rome is the", "capital", "of Italy."),
        said(2.1, "Hmm,", 0),
        said(2.6, "Rome", 4),
        said(2.8, "is the", 4),
        said(3.1, "capital", 4),  # the call ended here: a prefix is enough
    ]
    verdict = answer.coherence(events, SPEECH_START_S)
    assert verdict == answer.Coherence(True, 4, 1, 1, 0, "")
    assert verdict.fields() == {
        "coherent": True,
        "coherence_note": "",
        "answer_generation": 4,
        "answer_generations": 1,
        "answer_hold_words": 1,
        "answer_repairs": 0,
    }


def test_words_compare_normalized():
    # Today's RESET carries no text; the words come in the APPENDs.
    events = [
        *oracle(2, "", "Washington,", "D.C."),
        said(2.5, "washington", 2),
        said(2.7, "D. C.", 2),
    ]
    assert answer.coherence(events, SPEECH_START_S).coherent


def test_two_generations_spliced_are_not_coherent():
    # A stale guess from the partial transcript, then the fresh answer.
    events = [
        *oracle(1, "The moon", "is bright.", t=1.0),
        *oracle(2, "Paris is", "the capital.", t=1.8),
        said(2.2, "The moon", 1),
        said(2.6, "Paris is", 2),
    ]
    verdict = answer.coherence(events, SPEECH_START_S)
    assert not verdict.coherent
    assert verdict.generation == 1 and verdict.generations == 2
    assert "spliced" in verdict.note


def test_a_fresh_candidate_continued_mid_text_is_not_coherent():
    # The agent skipped generation 2's leading words because generation 1
    # had already said them: readable, but two candidates in one utterance.
    events = [
        *oracle(1, "The capital of", "France is Paris.", t=1.0),
        *oracle(2, "The capital of", "Italy is Rome.", t=1.9),
        said(2.2, "The capital of", 1),
        said(2.7, "Italy is Rome.", 2),
    ]
    assert not answer.coherence(events, SPEECH_START_S).coherent


def test_a_repair_in_the_middle_is_counted_and_not_coherent():
    events = [
        *oracle(5, "Rome is", "the capital."),
        said(2.3, "Rome", 5),
        said(2.6, "Sorry,", 0),
        said(2.9, "is", 5),
    ]
    verdict = answer.coherence(events, SPEECH_START_S)
    assert not verdict.coherent
    assert verdict.repairs == 1 and verdict.hold_words == 0
    assert "repair" in verdict.note


def test_words_off_the_generation_text_are_not_coherent():
    events = [*oracle(6, "Rome is", "the capital."), said(2.3, "Rome is a city", 6)]
    verdict = answer.coherence(events, SPEECH_START_S)
    assert not verdict.coherent
    assert "word 3 'a'" in verdict.note and "'the'" in verdict.note
    too_long = [*oracle(6, "Rome."), said(2.3, "Rome. Yes.", 6)]
    assert "(its end)" in answer.coherence(too_long, SPEECH_START_S).note


def test_no_answer_or_no_oracle_text_is_not_coherent():
    held_only = [said(2.2, "Hmm,", 0)]
    verdict = answer.coherence(held_only, SPEECH_START_S)
    assert not verdict.coherent and verdict.hold_words == 1 and verdict.note == "no answer words"
    unknown = [said(2.2, "Rome", 9)]  # generation 9 never showed in the oracle updates
    assert "no oracle update" in answer.coherence(unknown, SPEECH_START_S).note
