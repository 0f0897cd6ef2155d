"""Answer latency and coherence on hand-made calls, as `kame talk` records
them: the agent's words (AgentText with start_s and generation) and the
oracle updates (RESET, APPEND) of each generation."""

from __future__ import annotations

import numpy as np
import pytest

from kame_cli.bench import answer
from kame_client.events import AgentText, OracleAppend, OracleReset
from kame_client.result import TalkResult, Timed
from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE

SPEECH_START_S, SPEECH_END_S = 0.5, 2.0


def said(heard_t: float, text: str, generation: int) -> answer.Word:
    """An agent word already placed in time (heard_t)."""
    event = AgentText(text, heard_t - 0.05, heard_t, generation, False)
    return answer.Word(heard_t - 0.01, heard_t, event)


def oracle(generation: int, *texts: str) -> list[answer.OracleUpdate]:
    """A generation as the oracle streams it: a RESET, then APPENDs."""
    first, *rest = texts
    return [OracleReset(generation, first, "", True), *(OracleAppend(generation, t) for t in rest)]


def latency(spoken: list[answer.Word], speech_end_s: float | None = SPEECH_END_S) -> float | None:
    return answer.answer_latency_s(spoken, SPEECH_START_S, speech_end_s)


def coherence(updates: list[answer.OracleUpdate], spoken: list[answer.Word]) -> answer.Coherence:
    return answer.coherence(spoken, updates, SPEECH_START_S)


def test_answer_latency_starts_after_the_hold_phrase():
    spoken = [said(2.2, "Hmm,", 0), said(2.9, "Rome", 3), said(3.2, "is", 3)]
    assert latency(spoken) == pytest.approx(0.9)


def test_no_answer_word_means_no_answer_latency():
    assert latency([said(2.2, "Let me", 0), said(2.5, "see,", 0)]) is None
    assert latency([]) is None
    assert latency([said(2.9, "Rome", 3)], speech_end_s=None) is None


def test_words_are_placed_where_their_audio_reached_the_client():
    # 40 frames, each arriving 0.03 s after it was due, so stream second s
    # reached the client at s + 0.08 + 0.03.
    result = TalkResult(caller=np.zeros(0, np.float32), speech_start_s=None, speech_end_s=None)
    result.agent_t = [
        (k + 1) * FRAME_SECONDS + 0.03 + np.arange(FRAME_SAMPLES) / SAMPLE_RATE for k in range(40)
    ]
    result.events = [
        Timed(0.2, AgentText("Rome", 2.4, 2.6, 2, False)),
        Timed(3.3, AgentText("is", 9.0, 9.1, 2, False)),
    ]
    word, unheard = answer.placed_words(result)
    assert word.heard_t == pytest.approx(2.4 + FRAME_SECONDS + 0.03, abs=1e-3)
    assert unheard.heard_t is None and unheard.when == 3.3  # its audio never came: its arrival
    assert latency([word, unheard]) == pytest.approx(word.heard_t - SPEECH_END_S)
    assert word.json() == {
        "t": 0.2,
        "type": "agent_text",
        "text": "Rome",
        "start_s": 2.4,
        "end_s": 2.6,
        "generation": 2,
        "filler": False,
        "heard_t": word.heard_t,
    }


def test_words_before_the_question_are_not_the_answer():
    spoken = [
        said(0.3, "Hello", 0),  # a greeting before the caller spoke
        said(0.4, "there", 7),
        said(2.6, "Rome.", 8),
    ]
    assert latency(spoken) == pytest.approx(0.6)
    verdict = coherence(oracle(8, "Rome."), spoken)
    assert verdict.coherent and verdict.generation == 8 and verdict.hold_words == 0


def test_a_hold_phrase_then_one_generation_is_coherent():
    spoken = [
        said(2.1, "Hmm,", 0),
        said(2.6, "Rome", 4),
        said(2.8, "is the", 4),
        said(3.1, "capital", 4),  # the call ended here: a prefix is enough
    ]
    verdict = coherence(oracle(4, "Rome is the", "capital", "of Italy."), spoken)
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
    spoken = [said(2.5, "washington", 2), said(2.7, "D. C.", 2)]
    assert coherence(oracle(2, "", "Washington,", "D.C."), spoken).coherent


def test_two_generations_spliced_are_not_coherent():
    # A stale guess from the partial transcript, then the fresh answer.
    updates = [*oracle(1, "The moon", "is bright."), *oracle(2, "Paris is", "the capital.")]
    verdict = coherence(updates, [said(2.2, "The moon", 1), said(2.6, "Paris is", 2)])
    assert not verdict.coherent
    assert verdict.generation == 1 and verdict.generations == 2
    assert "spliced" in verdict.note


def test_a_fresh_candidate_continued_mid_text_is_not_coherent():
    # The agent skipped generation 2's leading words because generation 1
    # had already said them: readable, but two candidates in one utterance.
    updates = [
        *oracle(1, "The capital of", "France is Paris."),
        *oracle(2, "The capital of", "Italy is Rome."),
    ]
    spoken = [said(2.2, "The capital of", 1), said(2.7, "Italy is Rome.", 2)]
    assert not coherence(updates, spoken).coherent


def test_a_repair_in_the_middle_is_counted_and_not_coherent():
    spoken = [said(2.3, "Rome", 5), said(2.6, "Sorry,", 0), said(2.9, "is", 5)]
    verdict = coherence(oracle(5, "Rome is", "the capital."), spoken)
    assert not verdict.coherent
    assert verdict.repairs == 1 and verdict.hold_words == 0
    assert "repair" in verdict.note


def test_words_off_the_generation_text_are_not_coherent():
    verdict = coherence(oracle(6, "Rome is", "the capital."), [said(2.3, "Rome is a city", 6)])
    assert not verdict.coherent
    assert "word 3 'a'" in verdict.note and "'the'" in verdict.note
    too_long = coherence(oracle(6, "Rome."), [said(2.3, "Rome. Yes.", 6)])
    assert "(its end)" in too_long.note


def test_no_answer_or_no_oracle_text_is_not_coherent():
    verdict = coherence([], [said(2.2, "Hmm,", 0)])
    assert not verdict.coherent and verdict.hold_words == 1 and verdict.note == "no answer words"
    # Generation 9 never showed in the oracle updates.
    assert "no oracle update" in coherence([], [said(2.2, "Rome", 9)]).note
