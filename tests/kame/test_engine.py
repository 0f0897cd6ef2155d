"""The asyncio engine: sessions join and leave a running batch, ticks gather
whoever is ready, slots run out, oracle text steers (kame) or not (moshi)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import REGISTRY

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS
from services.frontend.engines.base import (
    CandidateSource,
    SessionParams,
    SlotsExhausted,
    Transcript,
)
from services.frontend.engines.kame import metrics
from services.frontend.engines.kame.checkpoint import CheckpointError
from services.frontend.engines.kame.engine import KameEngine
from tests.support import wait_until

ANSWER = "the capital of france is paris"


@pytest.fixture(scope="module")
def callers(speak, to_frames) -> list[list[np.ndarray]]:
    sayings = [
        "What is the capital of France?",
        "How many legs does a spider have?",
        "Tell me about the moon landing.",
    ]
    return [to_frames(speak(text), 16) for text in sayings]


async def run_session(
    engine: KameEngine,
    frames,
    oracle: dict[int, list[tuple]] | None = None,
    start_delay_s: float = 0.0,
    pause_s: float = 0.0,
):
    """Play frames into a new session; ops are ("reset", gen), ("reset", gen, first
    words, source), ("append", gen, text) or ("transcript", Transcript)."""
    await asyncio.sleep(start_delay_s)
    session = await engine.open_session(SessionParams(session_id="s"))
    outputs = []
    try:
        for index, frame in enumerate(frames):
            for op in (oracle or {}).get(index, []):
                if op[0] == "reset":
                    session.oracle_reset(*op[1:])
                elif op[0] == "transcript":
                    session.user_transcript(op[1])
                else:
                    session.oracle_append(op[1], op[2])
            outputs.append(await session.step(frame))
            await asyncio.sleep(pause_s)
    finally:
        await session.close()
    return outputs


def shared_ticks() -> float:
    """Ticks of the kame engine so far that stepped more than one session."""
    labels = {"engine": "kame"}
    count = REGISTRY.get_sample_value("kame_frontend_tick_sessions_count", labels) or 0.0
    single = (
        REGISTRY.get_sample_value("kame_frontend_tick_sessions_bucket", {**labels, "le": "1.0"})
        or 0.0
    )
    return count - single


def pcm_of(outputs) -> np.ndarray:
    return np.stack([output.pcm for output in outputs])


async def test_concurrent_sessions_produce_what_each_produces_alone(make_engine, callers):
    plans = [
        dict(frames=callers[0], oracle={3: [("reset", 1), ("append", 1, ANSWER)]}),
        dict(
            frames=callers[1],
            oracle={0: [("append", 4, "a spider has eight legs")]},
            start_delay_s=0.05,
            pause_s=0.01,
        ),
        dict(frames=callers[2], start_delay_s=0.2, pause_s=0.03),
    ]
    engine = make_engine(slots=4)
    shared_ticks_before = shared_ticks()
    together = await asyncio.gather(*(run_session(engine, **plan) for plan in plans))
    assert shared_ticks() > shared_ticks_before  # sessions did share ticks
    reference = make_engine(slots=1)
    for plan, batched in zip(plans, together, strict=True):
        alone = await run_session(reference, plan["frames"], plan.get("oracle"))
        np.testing.assert_allclose(pcm_of(batched), pcm_of(alone), atol=1e-5)
        assert [o.words for o in batched] == [o.words for o in alone]
    assert not np.allclose(pcm_of(together[0]), pcm_of(together[1]), atol=1e-3)
    assert engine.free_slots == 4


async def test_every_frame_in_gives_one_frame_out(make_engine, callers):
    outputs = await run_session(make_engine(slots=1), callers[0])
    assert len(outputs) == len(callers[0])
    assert all(o.pcm.shape == (FRAME_SAMPLES,) and o.pcm.dtype == np.float32 for o in outputs)
    # The first step only fills the acoustic delay: silence; then the model speaks.
    assert not outputs[0].speaking and not outputs[0].pcm.any()
    assert any(o.pcm.any() for o in outputs[1:])


async def test_slots_run_out_and_come_back(make_engine):
    engine = make_engine(slots=2)
    first = await engine.open_session(SessionParams(session_id="a"))
    second = await engine.open_session(SessionParams(session_id="b"))
    assert (engine.free_slots, engine.total_slots) == (0, 2)
    assert {first.slot, second.slot} == {0, 1}
    with pytest.raises(SlotsExhausted, match="all 2 batch slots"):
        await engine.open_session(SessionParams(session_id="c"))
    await first.close()
    await first.close()  # idempotent
    assert engine.free_slots == 1
    third = await engine.open_session(SessionParams(session_id="d"))
    assert third.slot == first.slot
    await asyncio.gather(second.close(), third.close())


async def test_a_new_session_on_a_used_slot_gets_no_oracle(make_engine, callers):
    engine = make_engine(slots=1)
    await run_session(engine, callers[0][:6], {1: [("reset", 1), ("append", 1, ANSWER * 3)]})
    reused = await run_session(engine, callers[1])
    fresh = await run_session(make_engine(slots=1), callers[1])
    np.testing.assert_allclose(pcm_of(reused), pcm_of(fresh), atol=1e-5)


async def test_stale_appends_are_dropped(make_engine, callers):
    engine = make_engine(slots=1)
    current = [("reset", 2), ("append", 2, "paris")]
    stale_before = metrics.STALE_ORACLE_UPDATES._value.get()
    clean = await run_session(engine, callers[0][:10], {1: current})
    with_stale = await run_session(
        engine, callers[0][:10], {1: current, 2: [("append", 1, ANSWER)]}
    )
    np.testing.assert_allclose(pcm_of(clean), pcm_of(with_stale), atol=1e-5)
    assert metrics.STALE_ORACLE_UPDATES._value.get() == stale_before + 1


async def test_a_reset_with_its_first_words_is_a_reset_then_an_append(make_engine, callers):
    """The wire's RESET carries the candidate's first words; the kame engine keeps
    the reference semantics: the same oracle stream as RESET + APPEND in one step.
    Transcripts are ignored and the engine never reports a turn end."""
    engine = make_engine(slots=1)
    frames = callers[0][:12]
    split = await run_session(engine, frames, {2: [("reset", 1), ("append", 1, ANSWER)]})
    question = "What is the capital of France?"
    heard = ("transcript", Transcript("u1", question, True, 0.16))
    source = CandidateSource("u1", question, True)
    together = await run_session(engine, frames, {1: [heard], 2: [("reset", 1, ANSWER, source)]})
    np.testing.assert_allclose(pcm_of(split), pcm_of(together), atol=1e-5)
    assert [o.words for o in split] == [o.words for o in together]
    assert all(o.turn_end_s is None for o in together)
    without = await run_session(engine, frames)
    assert not np.allclose(pcm_of(without), pcm_of(together), atol=1e-3)  # the text steered


async def test_moshi_engine_ignores_oracle_text_and_kame_follows_it(make_engine, callers):
    steer = {0: [("reset", 1), ("append", 1, ANSWER * 2)]}
    moshi = make_engine(slots=1, with_oracle=False)
    assert moshi.name == "moshi"
    np.testing.assert_array_equal(
        pcm_of(await run_session(moshi, callers[2])),
        pcm_of(await run_session(moshi, callers[2], steer)),
    )
    kame = make_engine(slots=1)
    assert kame.name == "kame"
    assert not np.allclose(
        pcm_of(await run_session(kame, callers[2])),
        pcm_of(await run_session(kame, callers[2], steer)),
        atol=1e-3,
    )


async def test_from_config_loads_the_checkpoint(tiny_checkpoint, callers):
    config = SimpleNamespace(
        checkpoint=str(tiny_checkpoint),
        device="cpu",
        dtype="float32",
        batch_slots=3,
        jitter_frames=2,
        voice="",
    )
    engine = await asyncio.to_thread(KameEngine.from_config, config, True)
    try:
        assert (engine.name, engine.total_slots, engine.free_slots) == ("kame", 3, 3)
        outputs = await run_session(engine, callers[0][:3])
        assert len(outputs) == 3
    finally:
        await engine.close()
    moshi = KameEngine.from_config(config, with_oracle=False)
    assert moshi.name == "moshi"
    await moshi.close()
    with pytest.raises(CheckpointError, match="need a checkpoint"):
        KameEngine.from_config(SimpleNamespace(**{**vars(config), "checkpoint": ""}), True)


async def step_with_reset_in_flight(session, frame, generation: int):
    """Step `frame`, and once the engine has taken it into a tick with the oracle
    updates queued until then, RESET to `generation` before the tick's output."""
    assert session._oracle_ops  # what the tick takes
    step = asyncio.create_task(session.step(frame))
    await wait_until(lambda: not session._oracle_ops, "the frame taken into a tick", interval_s=0)
    session.oracle_reset(generation, "paris")
    return await step


async def test_agent_words_carry_the_generation_in_effect_when_spoken(make_engine, callers):
    """Step n feeds the oracle of the RESET to generation n (sent while step n-1
    ran); a word whose first piece comes out of step n belongs to generation n,
    not to the n+1 received while step n ran."""
    engine = make_engine(slots=1)
    session = await engine.open_session(SessionParams(session_id="g"))
    session.oracle_reset(0, "paris")
    words = []
    try:
        for index, frame in enumerate(callers[0]):
            output = await step_with_reset_in_flight(session, frame, index + 1)
            words += output.words
    finally:
        await session.close()
    assert words  # the random model speaks words
    for word in words:
        assert word.generation == round(word.start_s / FRAME_SECONDS), word


async def test_the_last_word_of_a_session_is_flushed(make_engine, callers):
    """The words of a session cut right after a word's last piece are the words of
    a longer session up to that word; without the flush the last one was lost.
    (A new oracle before every step makes the random model end words often.)"""

    async def words_of(frames) -> tuple[list, list]:
        session = await make_engine(slots=1).open_session(SessionParams(session_id="w"))
        try:
            spoken = []
            for index, frame in enumerate(frames):
                session.oracle_reset(index + 1, "paris")
                spoken += (await session.step(frame)).words
            return spoken, session.flush_words()
        finally:
            await session.close()

    spoken, _ = await words_of(callers[1])
    assert spoken
    last = spoken[-1]
    cut = round(last.end_s / FRAME_SECONDS)  # the frames up to its last piece
    short_spoken, flushed = await words_of(callers[1][:cut])
    assert short_spoken == spoken[:-1]
    assert flushed == [last]
