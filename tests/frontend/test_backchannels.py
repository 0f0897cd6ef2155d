"""Caller speech over the agent, with the real tts engine at real pace and piper
speech: a backchannel pauses the answer, which then finishes; a real
interruption (long, or short with words that are not a backchannel) stops it,
silent within 200 ms of the caller's speech start; stt's final (given here as
the gateway would relay it) decides, and is asked for at the caller's pause.
The paused frames are `held` (the gateway and the Realtime endpoint keep the
answer open through them), up to the resumed answer or the BargeIn."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import REGISTRY

from kame_common.audio import FRAME_SECONDS
from services.frontend.config import FrontendSettings
from services.frontend.engines.backchannel import Backchannels
from services.frontend.engines.base import CandidateSource, SessionParams, StepOutput, Transcript
from services.frontend.engines.tts import TtsEngine
from services.frontend.engines.turns import LevelVad
from tests.frontend.calls import frames_of, silence
from tests.frontend.test_tts_engine import (
    LEAD_S,
    OracleStep,
    answer,
    heard,
    last_voiced_frame,
    run_session,
    spoken,
)

QUESTION = "What should I see in Paris?"
ANSWER = (
    "You could start with the Louvre in the morning, then walk along the river to the cathedral."
)
# After the caller's overlap: time for the rest of the answer (about 3 s) and its
# hold, at real pace.
TAIL_S = 5.0
STT_DELAY_FRAMES = 4  # stt's final comes 320 ms after the turn end asked for it
CALLER_SPEAKS_S = 1.6  # into the agent's answer, after the question's turn end


@pytest.fixture
async def engine():
    engine = TtsEngine(slots=1, backchannels=Backchannels())
    yield engine
    await engine.close()


def counted(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def talk_over_the_answer(
    engine: TtsEngine, speak, overlap_text: str, stt_text: str | None, then: str = ""
) -> tuple[list[StepOutput], int]:
    """The caller asks QUESTION, the agent answers ANSWER, and CALLER_SPEAKS_S into
    it the caller says `overlap_text`; stt's final of it (`stt_text`; None: it never
    comes) arrives STT_DELAY_FRAMES after the engine reports the caller's pause.
    `then`: a new answer to that final, given with it. Returns the outputs and
    the frame of the overlap's first voiced frame."""
    session = await engine.open_session(SessionParams("over", turn_end_silence_s=0.24))
    question = speak(QUESTION)
    last = last_voiced_frame(question)
    signal = [silence(LEAD_S), question, silence(0.24 + CALLER_SPEAKS_S), speak(overlap_text)]
    frames = frames_of(np.concatenate([*signal, silence(TAIL_S)]))
    vad = LevelVad()
    voiced = [i for i, frame in enumerate(frames) if vad.voiced(frame)]
    onset = next(i for i in voiced if i > last + 4)
    oracle = {
        last + 1: [
            heard(QUESTION, (last + 1) * FRAME_SECONDS, final=False),
            answer(1, ANSWER, QUESTION),
        ]
    }
    if then:  # the final of the whole interruption and its answer, once it ended
        final = Transcript("u2", stt_text or "", True, (voiced[-1] + 1) * FRAME_SECONDS)
        source = CandidateSource("u2", final.text, True)
        oracle[voiced[-1] + 4 + STT_DELAY_FRAMES] = [
            lambda s: s.user_transcript(final),
            lambda s: s.oracle_reset(2, then, source),
        ]
    steps = [0]

    def stt(output: StepOutput) -> list[OracleStep]:
        """stt finalizes the overlap when the engine reports the caller's pause."""
        steps[0] += 1
        if output.turn_end_s is not None and steps[0] > onset and stt_text and not then:
            final = Transcript("u2", stt_text, True, output.turn_end_s + 0.05, settled=True)
            due = steps[0] + STT_DELAY_FRAMES - 1
            oracle.setdefault(due, []).append(lambda s: s.user_transcript(final))
        return []

    outputs = await run_session(session, frames, oracle, react=stt, stall={last + 3: 1.5})
    await session.close()
    sounding = [i for i, out in enumerate(outputs) if out.speaking]
    assert set(range(onset - 5, onset)) & set(sounding), "the agent should be talking"
    return outputs, onset


def held_frames(outputs: list[StepOutput], onset: int) -> list[int]:
    """The frames the agent was paused on: one stretch of silent `held` frames
    from the caller's speech start (its second voiced frame)."""
    held = [i for i, out in enumerate(outputs) if out.held]
    assert held and held == list(range(onset + 1, onset + 1 + len(held))), held
    assert not any(outputs[i].speaking for i in held)
    return held


@pytest.mark.parametrize("nod", ["Uh-huh.", "Yeah.", "Okay.", "Right."])
async def test_a_backchannel_pauses_the_answer_which_then_finishes(engine, speak, nod):
    nods_before = counted("kame_frontend_backchannels_total")
    outputs, onset = await talk_over_the_answer(engine, speak, nod, stt_text=nod)
    # Paused from the caller's second voiced frame, then the whole answer, once.
    assert not any(out.speaking for out in outputs[onset + 1 : onset + 4])
    assert spoken(outputs) == [(word, 1) for word in ANSWER.split()]
    assert not any(out.barged_in for out in outputs)
    assert any(out.speaking for out in outputs[onset + 4 :]), "the answer goes on"
    held = held_frames(outputs, onset)
    assert outputs[held[-1] + 1].speaking, "the answer resumes after the hold"
    assert counted("kame_frontend_backchannels_total") == nods_before + 1


async def test_a_question_over_the_agent_stops_it_within_200_ms(engine, speak):
    interruption = "Wait, what is the capital of Spain?"
    outputs, onset = await talk_over_the_answer(
        engine, speak, interruption, stt_text=interruption, then="Madrid."
    )
    sounding = [i for i, out in enumerate(outputs) if out.speaking]
    # The caller's speech starts at frame `onset`: silent from the next frame
    # (80-160 ms later) until the answer to the interruption (it may pause after
    # "Wait,": speaking again after a pause is a barge-in too).
    silent_until = next(i for i in sounding if i > onset)
    assert silent_until > onset + round(1.0 / FRAME_SECONDS)
    # One BargeIn, once the speech outlasted backchannel_max_s or went on after a pause.
    [barge_in] = [i for i, out in enumerate(outputs) if out.barged_in]
    assert onset < barge_in <= onset + 2 + round(Backchannels().max_speech_s / FRAME_SECONDS)
    assert held_frames(outputs, onset)[-1] == barge_in - 1, "held up to the BargeIn"
    words = spoken(outputs)
    said_of_first = [w for w, generation in words if generation == 1]
    assert 0 < len(said_of_first) < len(ANSWER.split()), "the first answer was cut"
    assert words[-1] == ("Madrid.", 2), "the interruption is answered"


async def test_a_short_stop_is_a_barge_in_by_its_words(engine, speak):
    outputs, onset = await talk_over_the_answer(engine, speak, "Stop.", stt_text="Stop.")
    assert not any(out.speaking for out in outputs[onset + 1 :])
    [barge_in] = [i for i, out in enumerate(outputs) if out.barged_in]
    [pause_reported] = [i for i, o in enumerate(outputs) if o.turn_end_s and i > onset]
    assert barge_in == pause_reported + STT_DELAY_FRAMES  # on the frame the final came
    assert held_frames(outputs, onset)[-1] == barge_in - 1, "held up to the BargeIn"
    assert len(spoken(outputs)) < len(ANSWER.split())


async def test_without_words_in_time_the_overlap_is_a_barge_in(engine, speak):
    outputs, onset = await talk_over_the_answer(engine, speak, "Uh-huh.", stt_text=None)
    assert not any(out.speaking for out in outputs[onset + 1 :])
    assert sum(out.barged_in for out in outputs) == 1


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"backchannel_max_s": -1.0}, "backchannel_max_s"),
        ({"backchannel_wait_s": 0.0}, "backchannel_wait_s"),
        ({"backchannel_phrases": " , "}, "backchannel_phrases"),
    ],
)
def test_backchannel_settings_are_checked(settings, named):
    with pytest.raises(Exception, match=named):
        FrontendSettings(**settings).validate()
