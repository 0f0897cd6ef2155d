"""The tts engine without gRPC: turn detection, phrase shaping, the player's
cuts, what a session says at a turn end (a fresh answer, a hold phrase, a
same-answer replacement), late audio and slots, with the real piper voice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client import REGISTRY

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE, rms_dbfs
from services.frontend.engines.base import (
    CandidateSource,
    SessionParams,
    SlotsExhausted,
    StepOutput,
    Transcript,
)
from services.frontend.engines.commit import Line, LineKind
from services.frontend.engines.phrases import Player, shape_phrase
from services.frontend.engines.tts import TtsEngine, TtsSession
from services.frontend.engines.turns import LevelVad, TurnDetector, TurnEvent
from tests.frontend.calls import frames_of, silence

OracleStep = Callable[[TtsSession], None]
LEAD_S = 0.16  # silence before the caller's question


@pytest.fixture
async def engine():
    engine = TtsEngine(slots=2)
    yield engine
    await engine.close()


def noise(samples: int, level_db: float, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 10 ** (level_db / 20), samples).astype(np.float32)


async def run_session(
    session: TtsSession,
    frames: list[np.ndarray],
    oracle: dict[int, list[OracleStep]],
    pace_s: float = FRAME_SECONDS,
    react: Callable[[StepOutput], list[OracleStep]] | None = None,
    stall: dict[int, float] | None = None,
) -> list[StepOutput]:
    """Step the frames at `pace_s`, each preceded by the oracle steps scheduled for
    it and by those `react` returned for the previous output; `stall` delays given
    frames by extra seconds (wall time for synthesis, on a loaded machine)."""
    outputs: list[StepOutput] = []
    reactions: list[OracleStep] = []
    started = time.monotonic()
    for i, frame in enumerate(frames):
        if stall and i in stall:
            await asyncio.sleep(stall[i])
            started += stall[i]
        for update in oracle.get(i, []) + reactions:
            update(session)
        outputs.append(await session.step(frame))
        reactions = react(outputs[-1]) if react else []
        await asyncio.sleep(max(0.0, started + (i + 1) * pace_s - time.monotonic()))
    return outputs


def spoken(outputs: list[StepOutput]) -> list[tuple[str, int]]:
    return [(w.text, w.generation) for out in outputs for w in out.words]


def last_voiced_frame(speech: np.ndarray) -> int:
    """The caller call's last frame that holds the question (after LEAD_S of silence),
    as the engine's own level VAD judges it (piper's speech varies from run to run,
    and a faint last frame must count the way the turn detector counts it)."""
    lead = round(LEAD_S / FRAME_SECONDS)
    vad = LevelVad()
    frames = [np.zeros(FRAME_SAMPLES, dtype=np.float32)] * lead + frames_of(speech)
    voiced = [i for i, frame in enumerate(frames) if vad.voiced(frame)]
    return voiced[-1]


def heard(text: str, end_s: float, final: bool = True) -> OracleStep:
    """stt's hypothesis of the caller's one utterance reaches the session."""
    return lambda s: s.user_transcript(Transcript("u1", text, final, end_s, settled=True))


def answer(generation: int, text: str, question: str) -> OracleStep:
    """A RESET that carries the candidate's first words and what it answers."""
    return lambda s: s.oracle_reset(generation, text, CandidateSource("u1", question, True))


def more(generation: int, text: str) -> OracleStep:
    return lambda s: s.oracle_append(generation, text)


def test_turns_follow_speech_over_line_noise_and_ignore_clicks(speak):
    speech = speak("Good morning I need some help with my order.")
    quiet = np.zeros(round(2.0 / FRAME_SECONDS) * FRAME_SAMPLES, dtype=np.float32)
    line = np.concatenate([quiet, speech * 0.5, quiet[: 12 * FRAME_SAMPLES]])
    line += noise(len(line), -45)  # a noisy line under everything: about 20 dB below the voice
    line[8 * FRAME_SAMPLES : 8 * FRAME_SAMPLES + 200] += 0.8  # a click in one frame
    detector = TurnDetector(turn_end_silence_s=0.4)
    happened = []
    for i, frame in enumerate(frames_of(line)):
        event = detector.push(frame)
        if event is not TurnEvent.NONE:
            happened.append((i, event, detector.speech_start_s, detector.speech_end_s))
    assert [e for _, e, _, _ in happened] == [TurnEvent.SPEECH_START, TurnEvent.TURN_END]
    voiced = [i for i, f in enumerate(frames_of(speech)) if rms_dbfs(f) > -60]
    speech_start, speech_end = 25 + voiced[0], 25 + voiced[-1]
    (start_frame, _, start_s, _), (end_frame, _, _, end_s) = happened
    assert speech_start <= start_frame <= speech_start + 2
    # 0.4 s of pause = 5 frames; the faint tail of the last syllable may drown in the noise.
    assert speech_end + 1 <= end_frame <= speech_end + 5
    # Where it happened, in stream seconds: the voiced run's start (two onset frames
    # back), and the silent run's start (five frames back): the end of the speech.
    assert start_s == pytest.approx((start_frame - 1) * FRAME_SECONDS)
    assert end_s == pytest.approx((end_frame - 4) * FRAME_SECONDS)


def test_a_phrase_is_trimmed_and_its_words_spread_over_its_sound(voice):
    words = "Sunny and mild, with a light breeze.".split()
    phrase = shape_phrase(voice.synthesize(" ".join(words)), words)
    assert [w.text for w in phrase.words] == words
    lead = phrase.words[0].start  # piper's leading silence, cut to at most 20 ms
    assert lead <= 0.02 * SAMPLE_RATE
    assert rms_dbfs(phrase.audio[lead : lead + 480]) > -40  # the sound starts right there
    for before, after in zip(phrase.words, phrase.words[1:], strict=False):
        assert before.start < before.end == after.start
    tail = phrase.audio[phrase.words[-1].end :]
    assert len(tail) == round(0.25 * SAMPLE_RATE) and not tail.any()  # the pause after "."


def test_the_player_finishes_the_current_phrase_and_drops_what_follows(voice):
    texts = ["Let me check the opening hours", "for you, it will", "only take a moment."]
    lines = [Line(LineKind.ANSWER, tuple(t.split()), generation=1) for t in texts]
    phrases = [shape_phrase(voice.synthesize(text), text.split()) for text in texts]
    player = Player()
    for line, phrase in zip(lines, phrases, strict=True):
        player.add(line, phrase)
    first_s = len(phrases[0].audio) / SAMPLE_RATE
    frames = [player.render(i * FRAME_SECONDS) for i in range(3)]
    assert frames[0].started == [lines[0]] and not frames[1].started
    player.finish_current_phrase()
    rest = [player.render((3 + i) * FRAME_SECONDS) for i in range(40)]
    said = [w.text for f in frames + rest for w in f.words]
    assert said == texts[0].split(), "the phrase ends, nothing after it starts"
    assert not any(f.started for f in rest)
    played_s = 3 * FRAME_SECONDS + sum(f.filled for f in rest) / SAMPLE_RATE
    assert played_s == pytest.approx(first_s, abs=1 / SAMPLE_RATE)  # to its very end
    assert player.queued_samples == 0
    player.add(lines[1], phrases[1])
    player.finish_current_phrase()  # a phrase not begun is dropped whole
    assert player.queued_samples == 0


async def test_a_reset_with_its_first_words_is_spoken_at_the_turn_end(engine, speak):
    session = await engine.open_session(SessionParams("fresh", turn_end_silence_s=0.24))
    question = "When does the museum open?"
    speech = speak(question)
    frames = frames_of(np.concatenate([silence(LEAD_S), speech, silence(3.0)]))
    last = last_voiced_frame(speech)
    speech_end_s = (last + 1) * FRAME_SECONDS
    # A partial that covers the end of speech, and the oracle's answer to it (the
    # RESET carries all of it, no APPEND follows) while the caller's pause goes on.
    oracle = {
        last + 1: [
            heard(question, speech_end_s, final=False),
            answer(1, "It opens at nine.", question),
        ],
    }
    # The first phrase is synthesized ahead: give that 1.5 s of wall time (the
    # machine is shared) before the turn-end frame.
    outputs = await run_session(session, frames, oracle, stall={last + 3: 1.5})
    await session.close()
    [turn_end] = [i for i, out in enumerate(outputs) if out.turn_end_s is not None]
    assert turn_end == last + 3 and outputs[turn_end].turn_end_s == pytest.approx(speech_end_s)
    assert spoken(outputs) == [("It", 1), ("opens", 1), ("at", 1), ("nine.", 1)]
    first_audio = next(i for i, out in enumerate(outputs) if out.speaking)
    assert first_audio == turn_end  # it was ready: spoken on the turn-end frame itself


async def test_a_replacement_that_says_the_same_thing_goes_on_without_repeating(engine, speak):
    session = await engine.open_session(SessionParams("same", turn_end_silence_s=0.24))
    question = "When does the museum open?"
    speech = speak(question)
    frames = frames_of(np.concatenate([silence(LEAD_S), speech, silence(5.0)]))
    last = last_voiced_frame(speech)
    first = "The museum opens at nine"
    second = "The museum opens at nine and closes at six in the evening."
    oracle = {
        4: [heard("When does the", 1.0, final=False)],
        last + 1: [heard(question, (last + 1) * FRAME_SECONDS + 0.16)],
        last + 2: [answer(1, first, question)],
    }

    def restart_on_museum(output: StepOutput) -> list[OracleStep]:
        # A restarted oracle, the same answer so far, while "The museum opens" plays.
        said = [w.text for w in output.words if w.generation == 1]
        return [answer(2, second, question)] if "museum" in said else []

    outputs = await run_session(session, frames, oracle, react=restart_on_museum)
    await session.close()
    words = spoken(outputs)
    assert [text for text, _ in words] == second.split()  # one sentence, nothing twice
    assert [generation for _, generation in words] == [1] * 3 + [2] * 9


async def test_a_stale_candidate_is_held_with_a_hold_phrase_then_answered(engine, speak):
    params = SessionParams("hold", turn_end_silence_s=0.24, hold_phrases=("Let me see.",))
    session = await engine.open_session(params)
    question = "Is it open today?"
    speech = speak(question)
    frames = frames_of(np.concatenate([silence(LEAD_S), speech, silence(4.0)]))
    last = last_voiced_frame(speech)
    answered_before = REGISTRY.get_sample_value(
        "kame_frontend_holds_total", {"outcome": "answered"}
    )
    late = last + 25  # the final and the answer to it come 2 s after the turn end
    oracle = {
        4: [heard("Is it", 0.8, final=False), answer(1, "It is Monday.", "Is it")],
        late: [
            heard(question, (last + 1) * FRAME_SECONDS + 0.16),
            answer(2, "Yes it is.", question),
        ],
    }
    outputs = await run_session(session, frames, oracle)
    await session.close()
    assert spoken(outputs) == [
        ("Let", 0),
        ("me", 0),
        ("see.", 0),
        ("Yes", 2),
        ("it", 2),
        ("is.", 2),
    ]
    assert (
        REGISTRY.get_sample_value("kame_frontend_holds_total", {"outcome": "answered"})
        == (answered_before or 0.0) + 1
    )


async def test_a_turn_end_before_the_audio_is_ready_gives_counted_silence(engine, speak):
    session = await engine.open_session(SessionParams("late", turn_end_silence_s=0.16))
    frames = frames_of(np.concatenate([silence(LEAD_S), speak("Hi."), silence(4.0)]))
    last = last_voiced_frame(speak("Hi."))
    turn_end = last + 2
    # Cascade style: the final and the answer to it arrive on the turn-end frame,
    # so nothing is synthesized ahead.
    oracle = {
        turn_end: [
            heard("Hi.", (last + 1) * FRAME_SECONDS + 0.16),
            answer(1, "Hello, nice to meet you.", "Hi."),
        ]
    }
    late_before = REGISTRY.get_sample_value("kame_frontend_late_audio_frames_total")
    outputs = await run_session(session, frames, oracle, pace_s=0.01)  # 8x real time
    await session.close()
    assert not outputs[turn_end].speaking  # the step did not wait for the synthesis
    assert REGISTRY.get_sample_value("kame_frontend_late_audio_frames_total") > late_before
    assert any(out.speaking for out in outputs[turn_end:])


async def test_sessions_beyond_the_slots_are_refused(engine):
    sessions = [await engine.open_session(SessionParams(f"s{i}")) for i in range(2)]
    assert engine.free_slots == 0 and engine.total_slots == 2
    with pytest.raises(SlotsExhausted):
        await engine.open_session(SessionParams("s3"))
    await sessions[0].close()
    await sessions[0].close()  # idempotent
    assert engine.free_slots == 1
    await sessions[1].close()
