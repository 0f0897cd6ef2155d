"""The tts engine without gRPC: turn detection, phrase shaping, cuts, RESET
continuation, filler, late audio and slots, with the real piper voice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client import REGISTRY

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE, rms_dbfs
from services.frontend.engines.base import SessionParams, SlotsExhausted, StepOutput
from services.frontend.engines.tts import (
    Candidate,
    Player,
    TtsEngine,
    TtsSession,
    normalize_word,
    shape_phrase,
)
from services.frontend.engines.turns import TurnDetector, TurnEvent
from tests.frontend.calls import frames_of, silence

OracleStep = Callable[[TtsSession], None]


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
) -> list[StepOutput]:
    outputs = []
    started = time.monotonic()
    for i, frame in enumerate(frames):
        for update in oracle.get(i, []):
            update(session)
        outputs.append(await session.step(frame))
        await asyncio.sleep(max(0.0, started + (i + 1) * pace_s - time.monotonic()))
    return outputs


def spoken(outputs: list[StepOutput]) -> list[tuple[str, int]]:
    return [(w.text, w.generation) for out in outputs for w in out.words]


def test_turns_follow_speech_over_line_noise_and_ignore_clicks(speak):
    speech = speak("Good morning I need some help with my order.")
    quiet = np.zeros(round(2.0 / FRAME_SECONDS) * FRAME_SAMPLES, dtype=np.float32)
    line = np.concatenate([quiet, speech * 0.5, quiet[: 12 * FRAME_SAMPLES]])
    line += noise(len(line), -45)  # a noisy line under everything: about 20 dB below the voice
    line[8 * FRAME_SAMPLES : 8 * FRAME_SAMPLES + 200] += 0.8  # a click in one frame
    detector = TurnDetector(turn_end_silence_s=0.4)
    events = [(i, detector.push(f)) for i, f in enumerate(frames_of(line))]
    happened = [(i, e) for i, e in events if e is not TurnEvent.NONE]
    assert [e for _, e in happened] == [TurnEvent.SPEECH_START, TurnEvent.TURN_END]
    voiced = [i for i, f in enumerate(frames_of(speech)) if rms_dbfs(f) > -60]
    speech_start, speech_end = 25 + voiced[0], 25 + voiced[-1]
    assert speech_start <= happened[0][0] <= speech_start + 2
    # 0.4 s of pause = 5 frames; the faint tail of the last syllable may drown in the noise.
    assert speech_end + 1 <= happened[1][0] <= speech_end + 5


def test_a_phrase_is_trimmed_and_its_words_spread_over_its_sound(voice):
    words = "Sunny and mild, with a light breeze.".split()
    phrase = shape_phrase(voice.synthesize(" ".join(words)), words, generation=4)
    assert [w.text for w in phrase.words] == words and phrase.generation == 4
    lead = phrase.words[0].start  # piper's leading silence, cut to at most 20 ms
    assert lead <= 0.02 * SAMPLE_RATE
    assert rms_dbfs(phrase.audio[lead : lead + 480]) > -40  # the sound starts right there
    for before, after in zip(phrase.words, phrase.words[1:], strict=False):
        assert before.start < before.end == after.start
    tail = phrase.audio[phrase.words[-1].end :]
    assert len(tail) == round(0.25 * SAMPLE_RATE) and not tail.any()  # the pause after "."


def test_finishing_the_current_word_drops_what_follows(voice):
    words = "Let me check the opening hours for you.".split()
    player = Player()
    player.add(shape_phrase(voice.synthesize(" ".join(words)), words, generation=1))
    player.add(shape_phrase(voice.synthesize("And more."), ["And", "more."], generation=1))
    said = []
    for frame in range(4):
        said += player.render(frame * FRAME_SECONDS)[1]
    current = said[-1]
    player.finish_current_word()
    rest = [player.render((4 + i) * FRAME_SECONDS) for i in range(20)]
    assert not any(words for _, words, _ in rest), "no further word may start"
    played_s = sum(filled for _, _, filled in rest) / SAMPLE_RATE
    assert abs(4 * FRAME_SECONDS + played_s - current.end_s) <= 0.06
    assert player.queued_samples == 0


def test_a_new_candidate_skips_the_words_already_said():
    candidate = Candidate(2, echo=["the", "museum", "opens"])
    candidate.words = ["The", "museum"]
    candidate.skip_echo()
    assert candidate.next_phrase(3) == ([], False)  # is the third word "opens" again?
    candidate.words += ["opens", "late", "today."]
    candidate.skip_echo()
    assert candidate.said == ["the", "museum", "opens"]
    assert candidate.next_phrase(3) == (["late", "today."], True)
    other = Candidate(3, echo=["the", "museum"], words=["A", "museum"])
    other.skip_echo()
    assert other.next_phrase(3) == (["A", "museum"], False)
    assert normalize_word("Today,") == "today"


async def test_reset_mid_answer_continues_without_repeating_itself(engine, speak):
    session = await engine.open_session(SessionParams("echo", turn_end_silence_s=0.24))
    question = speak("When does the museum open?")
    frames = frames_of(np.concatenate([silence(0.16), question, silence(5.0)]))
    turn_end = 2 + [i for i, f in enumerate(frames_of(question)) if rms_dbfs(f) > -60][-1] + 3
    first = "The museum opens at nine and closes at six in the evening."
    second = "The museum opens at nine and closes at five on Sundays."
    oracle = {
        4: [lambda s: s.oracle_reset(1), lambda s: s.oracle_append(1, first)],
        turn_end + 12: [lambda s: s.oracle_reset(2), lambda s: s.oracle_append(2, second)],
    }
    outputs = await run_session(session, frames, oracle)
    await session.close()
    words = spoken(outputs)
    assert [text for text, _ in words] == second.split()  # one sentence, nothing twice
    generations = [generation for _, generation in words]
    assert generations[0] == 1 and generations[-1] == 2
    assert generations == sorted(generations)


async def test_the_filler_covers_a_turn_end_without_oracle_text(engine, speak):
    params = SessionParams("filler", turn_end_silence_s=0.24, filler_text="Let me see.")
    session = await engine.open_session(params)
    question = speak("Is it open?")
    frames = frames_of(np.concatenate([silence(0.16), question, silence(4.0)]))
    turn_end = 2 + [i for i, f in enumerate(frames_of(question)) if rms_dbfs(f) > -60][-1] + 3
    late = turn_end + 25  # the oracle answers 2 s after the turn end, after the filler
    oracle = {late: [lambda s: s.oracle_reset(1), lambda s: s.oracle_append(1, "Yes it is.")]}
    outputs = await run_session(session, frames, oracle)
    await session.close()
    assert spoken(outputs) == [
        ("Let", 0),
        ("me", 0),
        ("see.", 0),
        ("Yes", 1),
        ("it", 1),
        ("is.", 1),
    ]


async def test_a_turn_end_before_the_audio_is_ready_gives_counted_silence(engine, speak):
    session = await engine.open_session(SessionParams("late", turn_end_silence_s=0.16))
    frames = frames_of(np.concatenate([silence(0.16), speak("Hi."), silence(4.0)]))
    turn_end = 2 + [i for i, f in enumerate(frames_of(speak("Hi."))) if rms_dbfs(f) > -60][-1] + 2
    # Cascade style: the text arrives on the turn-end frame, so nothing is synthesized ahead.
    oracle = {
        turn_end: [
            lambda s: s.oracle_reset(1),
            lambda s: s.oracle_append(1, "Hello, nice to meet you."),
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
