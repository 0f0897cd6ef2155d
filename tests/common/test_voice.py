"""The piper voice: the tests' callers speak without piper's random noise, so a
text always sounds the same; the agent's voice keeps it."""

from __future__ import annotations

import numpy as np

from kame_common.voice import load_voice

TEXT = "No wait, stop, I meant something else entirely."


def test_a_voice_without_noise_says_a_text_the_same_way_every_time(voice):
    first, second = voice.synthesize(TEXT), voice.synthesize(TEXT)
    assert len(first) > 0 and np.array_equal(first, second)


def test_the_default_voice_varies_from_one_synthesis_to_the_next():
    varied = load_voice()
    takes = [varied.synthesize(TEXT) for _ in range(3)]
    assert any(not np.array_equal(takes[0], take) for take in takes[1:])
