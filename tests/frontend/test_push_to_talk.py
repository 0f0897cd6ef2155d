"""Push-to-talk in the front-end: the caller's END_TURN, RESPOND and CANCEL, and
typed messages, in the tts engine's answer policy (a fake clock), in a tts
session with the real piper voice, and through the Frontend service."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS
from kamepb import common_pb2, frontend_pb2
from services.frontend.engines.base import (
    CandidateSource,
    SessionParams,
    SpokenWord,
    StepOutput,
    Transcript,
)
from services.frontend.engines.commit import AnswerPolicy, Floor, LineKind
from services.frontend.engines.mute import UNMUTE_AFTER_QUIET_FRAMES, SpeechMute
from services.frontend.engines.tts import TtsEngine
from tests.frontend.calls import Typed, frames_of, play_call, reset, silence, words_in
from tests.frontend.test_tts_engine import LEAD_S, last_voiced_frame, run_session
from tests.support.clock import FakeClock

QUESTION = "What is the capital of France?"
ANSWER = "Paris is the capital of France."
Action = common_pb2.TurnControl.Action


def heard_final(policy: AnswerPolicy, end_s: float, utterance: str = "u1") -> None:
    policy.transcript(Transcript(utterance, QUESTION, True, end_s, settled=True))


def answered(policy: AnswerPolicy, generation: int = 1, utterance: str = "u1") -> None:
    policy.candidate_reset(generation, ANSWER, CandidateSource(utterance, QUESTION, True))


def said(policy: AnswerPolicy) -> list[str]:
    """Every line the policy hands out now, as text (its answer, phrase by phrase)."""
    lines = []
    while (line := policy.next_line(0.0)) is not None:
        lines.append(" ".join(line.words))
    return lines


# --- the policy ---------------------------------------------------------------


def test_manual_turns_wait_for_respond_and_respond_answers_once():
    policy = AnswerPolicy(manual=True, clock=FakeClock())
    policy.caller_speech_started(0.5)
    heard_final(policy, 2.0)
    answered(policy)
    assert policy.floor is Floor.LISTENING and said(policy) == []
    policy.end_turn(2.0)
    assert policy.floor is Floor.WAITING and said(policy) == [], "the answer waits for RESPOND"
    # What will be said first is ready ahead, so RESPOND is answered at once.
    speculative = policy.speculative_line()
    assert speculative is not None and speculative.words == ("Paris", "is", "the")
    policy.respond(2.0)
    assert policy.floor is Floor.ANSWERING
    assert " ".join(said(policy)) == ANSWER
    policy.respond(2.0)  # the turn is answered: a second RESPOND changes nothing
    assert policy.floor is Floor.ANSWERING and said(policy) == []


def test_respond_ends_an_open_turn_and_nothing_said_is_a_no_op():
    policy = AnswerPolicy(manual=True, clock=FakeClock())
    policy.end_turn(0.0)
    policy.respond(0.0)
    assert policy.floor is Floor.IDLE, "no caller turn: END_TURN and RESPOND do nothing"
    policy.caller_speech_started(0.5)
    heard_final(policy, 2.0)
    answered(policy)
    policy.respond(2.0)  # no END_TURN first: RESPOND ends the turn itself
    assert " ".join(said(policy)) == ANSWER


def test_auto_mode_end_turn_answers_and_respond_is_harmless():
    policy = AnswerPolicy(clock=FakeClock())
    policy.caller_speech_started(0.5)
    heard_final(policy, 2.0)
    answered(policy)
    policy.end_turn(2.0)  # the caller ends the turn before the detector's pause
    assert " ".join(said(policy)) == ANSWER
    policy.respond(2.0)
    assert policy.floor is Floor.ANSWERING and said(policy) == []


def test_cancel_stops_the_answer_and_a_held_floor_for_good():
    clock = FakeClock()
    policy = AnswerPolicy(hold_phrases=("Hmm,",), hold_max_s=2.0, clock=clock)
    policy.caller_speech_started(0.5)
    heard_final(policy, 2.0)
    policy.caller_turn_ended(2.0)
    assert [line.kind for line in [policy.next_line(0.0)]] == [LineKind.HOLD]
    policy.cancel()
    assert policy.floor is Floor.IDLE
    clock.now += 5.0
    policy.tick()
    answered(policy)  # the answer comes late: after a cancel it is not said
    assert said(policy) == []
    policy.cancel()  # nothing to stop: a no-op
    assert policy.floor is Floor.IDLE


def test_a_typed_message_is_a_turn_of_its_own():
    policy = AnswerPolicy(clock=FakeClock())
    policy.caller_speech_started(0.5)
    heard_final(policy, 2.0)
    answered(policy)
    policy.caller_turn_ended(2.0)
    assert said(policy), "the spoken question is answered"
    # Typed at 9.0 s: it cuts the answer, and only an answer to it is fresh.
    policy.typed_turn(Transcript("s-text-1", "And of Spain?", True, 9.0), at_s=9.0)
    assert policy.floor is Floor.HOLDING and said(policy) == []
    answered(policy, generation=2)  # a late candidate for the spoken question
    assert said(policy) == []
    policy.candidate_reset(2, "Madrid.", CandidateSource("s-text-1", "And of Spain?", True))
    assert said(policy) == ["Madrid."]
    # The caller speaks again: the typed message is no longer this turn's question.
    policy.caller_speech_started(12.0)
    policy.caller_turn_ended(13.0)
    policy.candidate_reset(3, "Madrid.", CandidateSource("s-text-1", "And of Spain?", True))
    assert said(policy) == []


# --- a tts session --------------------------------------------------------------


@pytest.fixture
async def engine():
    engine = TtsEngine(slots=2)
    yield engine
    await engine.close()


def speaking_frames(outputs: list[StepOutput]) -> list[int]:
    return [i for i, out in enumerate(outputs) if out.speaking]


async def test_manual_session_stays_silent_until_asked(engine, speak):
    """The caller asks, then is silent for 3 s: the answer is there, nobody asked
    for it, so the agent says nothing; END_TURN + RESPOND, and it answers."""
    session = await engine.open_session(SessionParams("ptt", manual_turns=True))
    speech = speak(QUESTION)
    caller = frames_of(np.concatenate([silence(LEAD_S), speech, silence(3.0)]))
    end = last_voiced_frame(speech) + 1
    end_s = end * FRAME_SECONDS
    heard = Transcript("u1", QUESTION, True, end_s, settled=True)
    oracle = {
        end + 2: [
            lambda s: s.user_transcript(heard),
            lambda s: s.oracle_reset(1, ANSWER, CandidateSource("u1", QUESTION, True)),
        ]
    }
    waiting = await run_session(session, caller, oracle)
    assert speaking_frames(waiting) == [], "no answer without RESPOND"
    assert all(out.turn_end_s is None for out in waiting), "no turn end of its own"
    session.end_turn()
    session.respond()
    asked = await run_session(session, frames_of(silence(4.0)), {})
    first = speaking_frames(asked)
    assert first and first[0] <= 10, f"answered {first[:1]} frames after RESPOND"
    assert "paris" in words_in(" ".join(w.text for out in asked for w in out.words))
    await session.close()


async def test_a_typed_message_is_answered_and_cancel_silences_the_agent(engine):
    typed = Transcript("typed-text-1", QUESTION, True, 0.4)
    source = CandidateSource("typed-text-1", QUESTION, True)
    oracle = {
        5: [lambda s: s.user_text(typed)],
        8: [lambda s: s.oracle_reset(1, ANSWER, source)],
    }
    session = await engine.open_session(SessionParams("typed"))
    uncut = await run_session(session, frames_of(silence(5.0)), oracle)
    await session.close()
    speaking = speaking_frames(uncut)
    assert speaking, "the typed question is answered"
    cut_at = speaking[0] + 6
    assert len([i for i in speaking if i >= cut_at]) >= 5, "the answer goes on past the cut"
    # The same call, with a CANCEL six frames into the answer.
    session = await engine.open_session(SessionParams("cancel"))
    oracle[cut_at] = [lambda s: s.cancel()]
    outputs = await run_session(session, frames_of(silence(5.0)), oracle)
    await session.close()
    speaking = speaking_frames(outputs)
    assert speaking and speaking[0] < cut_at, "it was speaking when cancelled"
    assert outputs[cut_at].barged_in and outputs[cut_at].cancelled
    assert [i for i in speaking if i >= cut_at] == [], "silent from the cancel on"
    assert not any(out.cancelled for out in uncut)


# --- through the Frontend service ----------------------------------------------------


async def test_the_service_takes_turn_controls_and_typed_messages(frontend_stub):
    typed = common_pb2.TranscriptEvent(
        utterance_id="t-text-1",
        is_final=True,
        text=QUESTION,
        span=common_pb2.AudioSpan(start_s=0.4, end_s=0.4),
    )
    answer = reset(1, ANSWER, answers=typed)
    control = common_pb2.TurnControl
    config = frontend_pb2.FrontendConfig(
        session_id=f"ptt-{uuid.uuid4().hex[:6]}", manual_turns=True
    )
    script = {
        5: [Typed(typed)],
        8: [answer],
        30: [control(action=Action.RESPOND)],
        45: [control(action=Action.CANCEL)],
    }
    call = await play_call(frontend_stub, frames_of(silence(5.0)), script, config=config)
    speaking = [i for i, a in enumerate(call.audio) if a.speaking]
    assert speaking and 30 <= speaking[0] <= 40, "typed, then answered only at RESPOND"
    assert [b.cancelled for b in call.barge_ins] == [True]
    assert 45 <= call.barge_ins[0].seq <= 47
    assert [i for i in speaking if i > call.barge_ins[0].seq] == []


# --- CANCEL for engines that take turns themselves ------------------------------------------


def lm_frame(speaking: bool, word: str = "") -> StepOutput:
    level = 0.3 if speaking else 0.0
    words = [SpokenWord(word, 0.0, 0.1)] if word else []
    return StepOutput(np.full(FRAME_SAMPLES, level, np.float32), speaking, words)


def test_cancel_silences_the_speech_lms_current_stretch_of_speech():
    mute = SpeechMute()
    mute.cancel()  # the agent is silent: nothing to cut
    assert not mute.apply(lm_frame(False)).barged_in
    assert mute.apply(lm_frame(True, "Paris")).words
    mute.cancel()
    lm = [lm_frame(True, "is")] + [lm_frame(False)] * 2 + [lm_frame(True, "the")]
    lm += [lm_frame(False)] * UNMUTE_AFTER_QUIET_FRAMES + [lm_frame(True, "Hello")]
    heard = [mute.apply(frame) for frame in lm]
    assert heard[0].barged_in and heard[0].cancelled
    assert [out.speaking for out in heard[:-1]] == [False] * (len(lm) - 1)
    assert not any(out.pcm.any() or out.words for out in heard[:-1])
    assert not any(out.barged_in for out in heard[1:])
    assert heard[-1].speaking and [w.text for w in heard[-1].words] == ["Hello"]
