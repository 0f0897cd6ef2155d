"""CANCEL for an engine that takes turns itself (kame, moshi).

The speech LM decides when it speaks and cannot be told to stop, so the
caller's CANCEL silences its current stretch of speech instead: from the next
frame on the agent's frames are silence and its words are dropped (the caller
does not hear them, so the conversation does not get them), until the LM has
been quiet for UNMUTE_AFTER_QUIET_FRAMES; what it says after that is heard.
The first frame after the CANCEL reports the cut (BargeIn, cancelled). With
the agent silent, CANCEL does nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kame_common.audio import FRAME_SAMPLES
from services.frontend.engines.base import StepOutput

# 0.4 s of the LM's silence ends the stretch of speech a CANCEL silenced.
UNMUTE_AFTER_QUIET_FRAMES = 5


class SpeechMute:
    def __init__(self) -> None:
        self._speaking = False  # the LM's last frame had speech
        self._muted = False
        self._quiet_frames = 0  # frames of the LM's silence since the mute
        self._cut_due = False  # the next output reports the cut

    def cancel(self) -> None:
        if self._speaking and not self._muted:
            self._muted, self._quiet_frames, self._cut_due = True, 0, True

    def apply(self, output: StepOutput) -> StepOutput:
        """The step's output as the caller hears it."""
        self._speaking = output.speaking
        if self._muted:
            self._quiet_frames = 0 if output.speaking else self._quiet_frames + 1
            self._muted = self._quiet_frames < UNMUTE_AFTER_QUIET_FRAMES
            silence = np.zeros(FRAME_SAMPLES, dtype=np.float32)
            output = dataclasses.replace(output, pcm=silence, speaking=False, words=[])
        if self._cut_due:
            self._cut_due = False
            output = dataclasses.replace(output, barged_in=True, cancelled=True)
        return output
