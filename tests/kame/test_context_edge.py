"""Long calls: past the LM's context (3000 steps, 4 minutes, in Moshi's config)
the engine keeps speaking. moshi's ring KV cache is a sliding window: each step
attends to the last `context` steps, nothing is reset at the edge. Checked at a
10-step context, 4 times past it (Mimi's transformers, 50 steps at 25 Hz,
pass their own edge too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from moshi.modules.transformer import set_attention_context

from services.frontend.engines.kame import checkpoint
from services.frontend.engines.kame.batch import SlotBatch, SlotOutput
from services.frontend.engines.kame.oracle import KameLMModel

CONTEXT = 10
STEPS = 4 * CONTEXT
JOIN = 7  # the second session joins later: its window wraps at other ticks


def short_context_lm(ckpt_dir) -> tuple[KameLMModel, checkpoint.Checkpoint]:
    ckpt = checkpoint.read(ckpt_dir)
    ckpt.lm_kwargs = {**ckpt.lm_kwargs, "context": CONTEXT}  # weights do not depend on it
    return checkpoint.load_lm(ckpt), ckpt


def short_context_batch(ckpt_dir, slots: int) -> SlotBatch:
    lm, ckpt = short_context_lm(ckpt_dir)
    return SlotBatch(lm, slots, mimi=checkpoint.load_mimi(ckpt), use_sampling=False)


@pytest.fixture(scope="module")
def long_calls(speak, to_frames) -> list[list[np.ndarray]]:
    """Two callers, each speaking for STEPS frames (sentences over and over)."""
    sayings = [
        "What is the capital of France? Tell me about the moon landing.",
        "How many legs does a spider have? Good morning, how are you?",
    ]
    return [to_frames(np.tile(speak(text), 3), STEPS) for text in sayings]


def run_alone(batch: SlotBatch, frames, oracle_at: int | None = None) -> list[SlotOutput]:
    batch.reset([0])
    outputs = []
    for step, frame in enumerate(frames):
        if step == oracle_at:
            batch.oracle_reset(0)
            batch.oracle_append(0, list(range(10, 40)))
        outputs.append(batch.step_audio({0: frame})[0])
    return outputs


def test_the_attention_window_slides_past_the_context(tiny_checkpoint):
    """Step by step, past the edge, the transformer computes exactly what a full
    forward does when each position sees the last CONTEXT positions."""
    lm, _ = short_context_lm(tiny_checkpoint)
    torch.manual_seed(0)
    inputs = torch.randn(1, 4 * CONTEXT, lm.dim)
    with torch.no_grad():
        windowed = lm.transformer(inputs)
        with lm.transformer.streaming(1):
            stepped = torch.cat(
                [lm.transformer(inputs[:, t : t + 1]) for t in range(inputs.shape[1])], dim=1
            )
        set_attention_context(lm.transformer, None)
        unlimited = lm.transformer(inputs)
    torch.testing.assert_close(stepped, windowed, atol=1e-5, rtol=1e-5)
    # The window matters: the same up to the edge, not after it.
    torch.testing.assert_close(windowed[:, :CONTEXT], unlimited[:, :CONTEXT])
    assert not torch.allclose(windowed[:, CONTEXT:], unlimited[:, CONTEXT:], atol=1e-3)


def test_sessions_keep_speaking_past_the_context(tiny_checkpoint, long_calls):
    batch = short_context_batch(tiny_checkpoint, slots=2)
    together: list[list[SlotOutput]] = [[], []]
    for tick in range(STEPS + JOIN):
        frames = {}
        if tick < STEPS:
            frames[0] = long_calls[0][tick]
        if tick >= JOIN:
            frames[1] = long_calls[1][tick - JOIN]
        for slot, output in batch.step_audio(frames).items():
            together[slot].append(output)

    for outputs in together:
        assert len(outputs) == STEPS
        assert all(out.tokens is not None and out.pcm is not None for out in outputs[1:])
        past_edge = np.stack([out.pcm for out in outputs[2 * CONTEXT :]])
        assert np.isfinite(past_edge).all() and np.abs(past_edge).max() > 1e-3
        # The model still varies what it says past the edge (no stuck state).
        assert len({tuple(out.tokens or ()) for out in outputs[2 * CONTEXT :]}) > 1
    # Past the edge each row still produces exactly what it produces alone: the
    # state there is the window of its own last CONTEXT steps, whatever its phase.
    alone = short_context_batch(tiny_checkpoint, slots=1)
    for outputs, frames in zip(together, long_calls, strict=True):
        assert [o.tokens for o in outputs] == [o.tokens for o in run_alone(alone, frames)]


def test_the_oracle_still_steers_past_the_context(tiny_checkpoint, long_calls):
    batch = short_context_batch(tiny_checkpoint, slots=1)
    start = 3 * CONTEXT + 2
    plain = run_alone(batch, long_calls[0])
    steered = run_alone(batch, long_calls[0], oracle_at=start)
    assert [o.tokens for o in plain[:start]] == [o.tokens for o in steered[:start]]
    assert [o.tokens for o in plain[start:]] != [o.tokens for o in steered[start:]]


def test_a_slot_reused_after_the_edge_starts_fresh(tiny_checkpoint, long_calls):
    """The ring cache wrapped several times; a reset still gives the next session
    exactly a new model's state."""
    used = short_context_batch(tiny_checkpoint, slots=1)
    run_alone(used, long_calls[0])
    reused = run_alone(used, long_calls[1][: 2 * CONTEXT])
    fresh = run_alone(short_context_batch(tiny_checkpoint, slots=1), long_calls[1][: 2 * CONTEXT])
    assert [o.tokens for o in reused] == [o.tokens for o in fresh]
    for a, b in zip(reused[1:], fresh[1:], strict=True):
        np.testing.assert_allclose(a.pcm, b.pcm, atol=1e-5)
