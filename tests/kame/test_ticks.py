"""The kame engine's fixed 80 ms clock: sessions whose frames arrive out of phase
share every tick, their frames keep their order and none is lost; a session with
no frame at a tick is masked out of it (underrun); a full jitter buffer drops its
oldest frame (overflow)."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS
from services.frontend.engines.base import SessionParams, StepOutput
from services.frontend.engines.kame.batch import SlotBatch
from services.frontend.engines.kame.engine import KameEngine
from tests.support.metrics import metric

SAYINGS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Tell me about the moon landing.",
]
PHASE_S = 0.027  # the callers' frames arrive 27 ms apart
FRAMES = 40
# Buffers deep enough that a slow tick on this shared CPU drops nothing: these
# tests are about sharing ticks and keeping frames; overflow has its own test.
DEEP = 8
_session_ids = itertools.count()


@pytest.fixture(scope="module")
def callers(speak, to_frames) -> list[list[np.ndarray]]:
    return [to_frames(speak(text), FRAMES) for text in SAYINGS]


def kame_metric(name: str) -> float:
    return metric(name, engine="kame")


def tick_totals() -> tuple[float, float]:
    """(ticks, session steps) of the kame engine so far."""
    return kame_metric("kame_frontend_tick_sessions_count"), kame_metric(
        "kame_frontend_tick_sessions_sum"
    )


async def feed(
    engine: KameEngine, frames: list[np.ndarray], start_at: float, gap: tuple[int, int] = (0, 0)
) -> list[StepOutput]:
    """One caller as the frontend service drives a session: it joins at `start_at`
    (event loop time) and hands in each frame at its real-time instant without
    waiting for earlier answers; gap=(index, frames): it sends nothing for that
    many frame times before frame `index`."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - loop.time()))
    session = await engine.open_session(SessionParams(session_id=f"s{next(_session_ids)}"))
    steps = []
    try:
        for index, frame in enumerate(frames):
            silent_frames = gap[1] if index >= gap[0] and gap[1] else 0
            due = start_at + (index + silent_frames) * FRAME_SECONDS
            await asyncio.sleep(max(0.0, due - loop.time()))
            steps.append(asyncio.ensure_future(session.step(frame)))
        return list(await asyncio.gather(*steps))
    finally:
        await session.close()


def lockstep(batch: SlotBatch, callers: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Each caller's agent audio with every frame stepped, in order, all callers in
    every step (silence where the model gives none)."""
    silence = np.zeros(FRAME_SAMPLES, dtype=np.float32)
    pcm: list[list[np.ndarray]] = [[] for _ in callers]
    for step in range(len(callers[0])):
        outputs = batch.step_audio({slot: frames[step] for slot, frames in enumerate(callers)})
        for slot, output in outputs.items():
            pcm[slot].append(silence if output.pcm is None else output.pcm)
    return [np.stack(frames) for frames in pcm]


def pcm_of(outputs: list[StepOutput]) -> np.ndarray:
    return np.stack([output.pcm for output in outputs])


async def test_out_of_phase_sessions_share_every_tick(
    make_engine, make_greedy_batch, tiny_checkpoint, callers
):
    engine = make_engine(slots=4, jitter_frames=DEEP)
    ticks_before, steps_before = tick_totals()
    dropped_before = kame_metric("kame_frontend_jitter_dropped_frames_total")
    start = asyncio.get_running_loop().time() + 0.05
    together = await asyncio.gather(
        *(feed(engine, frames, start + index * PHASE_S) for index, frames in enumerate(callers))
    )
    ticks_after, steps_after = tick_totals()
    steps = steps_after - steps_before
    sessions_per_tick = steps / (ticks_after - ticks_before)
    # Only the ticks while the callers join and leave can hold fewer than 3:
    # 120 steps in at most 42 ticks.
    assert sessions_per_tick >= 2.8, f"{sessions_per_tick:.2f} sessions per tick"
    assert steps == len(callers) * FRAMES
    assert kame_metric("kame_frontend_jitter_dropped_frames_total") == dropped_before
    # Order kept, nothing lost: each session heard exactly its frames, in order.
    reference = lockstep(make_greedy_batch(tiny_checkpoint, len(callers)), callers)
    for outputs, expected in zip(together, reference, strict=True):
        assert len(outputs) == FRAMES
        np.testing.assert_allclose(pcm_of(outputs), expected, atol=1e-5)


async def test_a_session_without_a_frame_is_masked_out_of_the_tick(
    make_engine, make_greedy_batch, tiny_checkpoint, callers
):
    """Underrun: caller 1 goes quiet for 5 frame times; the ticks meanwhile step
    caller 0 alone, and caller 1's state waits for its next frame."""
    engine = make_engine(slots=2, jitter_frames=DEEP)
    frames = [callers[0][:16], callers[1][:12]]
    underruns_before = kame_metric("kame_frontend_jitter_underruns_total")
    start = asyncio.get_running_loop().time() + 0.05
    steady, paused = await asyncio.gather(
        feed(engine, frames[0], start), feed(engine, frames[1], start + PHASE_S, gap=(4, 5))
    )
    assert kame_metric("kame_frontend_jitter_underruns_total") - underruns_before >= 4
    alone = make_greedy_batch(tiny_checkpoint, 1)
    for outputs, caller_frames in zip((steady, paused), frames, strict=True):
        alone.reset([0])
        np.testing.assert_allclose(pcm_of(outputs), lockstep(alone, [caller_frames])[0], atol=1e-5)


async def test_a_full_jitter_buffer_drops_its_oldest_frame(
    make_engine, make_greedy_batch, tiny_checkpoint, callers
):
    """Overflow: three frames at once into a buffer of two. The oldest is answered
    at once with silence and never reaches the model; the other two are stepped
    in order in the next two ticks."""
    engine = make_engine(slots=1, jitter_frames=2)
    session = await engine.open_session(SessionParams(session_id="burst"))
    frames = callers[0][5:8]  # speech, so that stepping it would not be silence
    dropped_before = kame_metric("kame_frontend_jitter_dropped_frames_total")
    steps = [asyncio.ensure_future(session.step(frame)) for frame in frames]
    await asyncio.sleep(0.001)
    assert [step.done() for step in steps] == [True, False, False]
    outputs = await asyncio.gather(*steps)
    await session.close()
    assert kame_metric("kame_frontend_jitter_dropped_frames_total") == dropped_before + 1
    assert not outputs[0].pcm.any() and not outputs[0].speaking and outputs[0].words == []
    expected = lockstep(make_greedy_batch(tiny_checkpoint, 1), [frames[1:]])[0]
    np.testing.assert_allclose(pcm_of(outputs[1:]), expected, atol=1e-5)
    assert expected[1].any()  # the kept frames were really stepped
