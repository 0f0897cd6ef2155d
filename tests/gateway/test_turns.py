"""The turn tracker: response latency (the caller's end of speech -> the first
agent audio) and answer latency (-> the first word of the answer itself),
whichever order the gateway learns the facts in."""

from __future__ import annotations

import pytest

from kamepb import common_pb2
from services.gateway.turns import TurnTracker


def transcript(utterance: str, text: str, final: bool = False, lag_s: float = 0.0):
    return common_pb2.TranscriptEvent(
        utterance_id=utterance, text=text, is_final=final, lag_s=lag_s
    )


def test_speech_end_before_agent_audio():
    tracker = TurnTracker()
    tracker.on_speech_start("u1", 10.0)
    tracker.on_transcript(transcript("u1", "what is"), 10.6)
    tracker.on_oracle_update(10.9)
    tracker.on_transcript(transcript("u1", "what is the capital", final=True, lag_s=0.3), 12.3)
    tracker.on_speech_end("u1", 12.0)
    assert tracker.pop_ready() == []  # the agent has not answered yet
    tracker.on_agent_audio_start(12.45)
    assert tracker.pop_ready() == []  # the answer's first word has not left yet
    tracker.on_answer_word(12.5)
    (turn,) = tracker.pop_ready()
    assert turn.response_latency_s == pytest.approx(0.45)
    assert turn.answer_latency_s == pytest.approx(0.5)
    summary = turn.summary()
    assert summary.user_text == "what is the capital"
    assert summary.utterance_id == "u1"
    assert summary.stt_final_lag_s == pytest.approx(0.3)
    assert summary.oracle_first_update_s == pytest.approx(0.3)
    assert summary.answer_latency_s == pytest.approx(0.5)


def test_a_hold_phrase_makes_the_response_early_not_the_answer():
    tracker = TurnTracker()
    tracker.on_speech_start("u1", 1.0)
    tracker.on_speech_end("u1", 2.0)
    tracker.on_agent_audio_start(2.4)  # "Hmm," (generation 0: not an answer word)
    tracker.on_answer_word(3.1)  # the answer itself, after the hold
    (turn,) = tracker.pop_ready()
    assert turn.response_latency_s == pytest.approx(0.4)
    assert turn.answer_latency_s == pytest.approx(1.1)


def test_agent_audio_before_speech_end_event():
    """The stt reports SPEECH_END after its endpoint silence; the agent may be
    faster. The summary waits for the end of speech, then says the truth."""
    tracker = TurnTracker()
    tracker.on_speech_start("u1", 1.0)
    tracker.on_agent_audio_start(3.4)
    tracker.on_answer_word(3.4)
    assert tracker.pop_ready() == []
    tracker.on_speech_end("u1", 3.0)
    (turn,) = tracker.pop_ready()
    assert turn.response_latency_s == pytest.approx(0.4)


def test_agent_starting_before_the_caller_stops_is_negative():
    tracker = TurnTracker()
    tracker.on_speech_start("u1", 1.0)
    tracker.on_agent_audio_start(2.5)
    tracker.on_answer_word(2.5)
    tracker.on_speech_end("u1", 3.0)
    (turn,) = tracker.pop_ready()
    assert turn.response_latency_s == pytest.approx(-0.5)


def test_a_turn_of_two_utterances_ends_with_the_last():
    tracker = TurnTracker()
    tracker.on_speech_start("u1", 1.0)
    tracker.on_transcript(transcript("u1", "what is", final=True), 2.2)
    tracker.on_speech_end("u1", 1.8)
    tracker.on_speech_start("u2", 2.4)
    tracker.on_transcript(transcript("u2", "the capital of France", final=True), 4.0)
    tracker.on_agent_audio_start(3.9)
    tracker.on_answer_word(3.9)
    assert tracker.pop_ready() == []  # u2 still open
    tracker.on_speech_end("u2", 3.6)
    (turn,) = tracker.pop_ready()
    assert turn.response_latency_s == pytest.approx(0.3)
    assert turn.user_text == "what is the capital of France"
    assert turn.last_utterance_id == "u2"


def test_without_an_answer_word_the_summary_waits_for_the_next_turn_or_the_end():
    tracker = TurnTracker()
    tracker.on_speech_start("u1", 1.0)
    tracker.on_speech_end("u1", 2.0)
    tracker.on_agent_audio_start(2.5)  # only a hold phrase, then the floor went back
    assert tracker.pop_ready() == []
    tracker.on_speech_start("u2", 6.0)  # the caller speaks again: a new turn
    (first,) = tracker.pop_ready()
    assert first.response_latency_s == pytest.approx(0.5)
    assert first.answer_latency_s is None and first.summary().answer_latency_s == 0.0
    tracker.on_speech_end("u2", 7.0)
    tracker.on_agent_audio_start(7.2)
    tracker.close()  # the session ends
    (second,) = tracker.pop_ready()
    assert second.response_latency_s == pytest.approx(0.2)


def test_each_turn_is_summarized_once_and_agent_pauses_do_not_open_turns():
    tracker = TurnTracker()
    tracker.on_speech_start("u1", 1.0)
    tracker.on_speech_end("u1", 2.0)
    tracker.on_agent_audio_start(2.5)
    tracker.on_answer_word(2.5)
    assert len(tracker.pop_ready()) == 1
    tracker.on_agent_audio_start(3.5)  # the agent resumes after a pause
    tracker.on_answer_word(3.6)
    assert tracker.pop_ready() == []
    tracker.on_speech_start("u2", 6.0)
    tracker.on_speech_end("u2", 7.0)
    tracker.on_agent_audio_start(7.2)
    tracker.on_answer_word(7.3)
    (second,) = tracker.pop_ready()
    assert second.response_latency_s == pytest.approx(0.2)
    assert len(tracker.turns) == 2


def test_agent_audio_with_no_caller_turn_is_not_a_turn():
    tracker = TurnTracker()
    tracker.on_agent_audio_start(0.5)
    tracker.on_answer_word(0.5)
    assert tracker.turns == [] and tracker.pop_ready() == []


def test_push_to_talk_latencies_count_from_the_callers_respond():
    tracker = TurnTracker()
    tracker.on_speech_start("u1", 10.0)
    tracker.on_speech_end("u1", 12.0)
    tracker.on_transcript(transcript("u1", "what is the capital", final=True), 12.3)
    tracker.on_answer_asked(15.0)  # MANUAL: the caller asked 3 s after it stopped
    tracker.on_agent_audio_start(15.4)
    tracker.on_answer_word(15.5)
    (turn,) = tracker.pop_ready()
    assert turn.response_latency_s == pytest.approx(0.4)
    assert turn.answer_latency_s == pytest.approx(0.5)
    tracker.on_answer_asked(20.0)  # no turn in progress: nothing to move
    assert tracker.pop_ready() == []
