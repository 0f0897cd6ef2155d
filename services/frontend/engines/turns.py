"""Caller turn detection from the incoming 80 ms frames: a level VAD plus a pause timer.

Why a level VAD rather than Silero: the decision is needed on every frame,
inside the frame's step, for barge-in within two frames. A level test costs a
few microseconds on the event loop thread, needs no resampling (Silero wants
16 kHz in 32 ms windows) and no thread hop per frame. The caller stream the
frontend receives holds only the caller (the gateway never mixes the agent's
voice in; echo cancellation belongs to the client), so loudness separates
speech from the line's noise well. To follow that noise, the threshold sits
`margin_db` above the noise floor, the quietest frame of the last few seconds
(minimum statistics), and never below `min_level_db`, so digital silence and
faint hiss do not count as speech.

Events: SPEECH_START when `onset_frames` voiced frames follow each other (a
click or a single loud frame does not start a turn); TURN_END when the caller
has been silent for `turn_end_silence_s` after speech (the fixed pause; the
semantic end of turn, semantic_turns.SmartTurnDetector, decides the pause
differently through `_pause_ends_turn`). With each event the
detector records where it happened in the stream (seconds from the first
frame pushed): `speech_start_s`, the start of the voiced run that started the
turn, and `speech_end_s`, the start of the silent run that ended it.
"""

from __future__ import annotations

import enum
import math
from collections import deque

from kame_common.audio import FRAME_SECONDS, Samples, rms_dbfs

# Levels below this are treated as this (digital silence is -inf dBFS).
_LEVEL_FLOOR_DB = -100.0


class TurnEvent(enum.Enum):
    NONE = enum.auto()
    SPEECH_START = enum.auto()
    TURN_END = enum.auto()


class LevelVad:
    """Decides per frame whether the caller is speaking, from its level."""

    def __init__(
        self, min_level_db: float = -50.0, margin_db: float = 12.0, floor_window_s: float = 5.0
    ) -> None:
        self.min_level_db = min_level_db
        self.margin_db = margin_db
        self._levels: deque[float] = deque(maxlen=max(1, round(floor_window_s / FRAME_SECONDS)))

    def voiced(self, frame: Samples) -> bool:
        level = max(rms_dbfs(frame), _LEVEL_FLOOR_DB)
        self._levels.append(level)
        noise_floor = min(self._levels)
        return level >= max(self.min_level_db, noise_floor + self.margin_db)


class TurnDetector:
    """Tracks whether the caller holds the turn; `push` one frame at a time."""

    def __init__(
        self, turn_end_silence_s: float, onset_frames: int = 2, vad: LevelVad | None = None
    ) -> None:
        self.vad = vad or LevelVad()
        self.onset_frames = onset_frames
        # The pause is counted in whole frames; a hair of tolerance keeps 0.16 s at 2 frames.
        self.end_frames = max(1, math.ceil(turn_end_silence_s / FRAME_SECONDS - 1e-6))
        self.caller_speaking = False
        self.speech_start_s = 0.0
        self.speech_end_s = 0.0
        self._frames = 0
        self._voiced_run = 0
        self._silent_run = 0

    def push(self, frame: Samples) -> TurnEvent:
        self._frames += 1
        if self.vad.voiced(frame):
            self._voiced_run += 1
            self._silent_run = 0
        else:
            self._voiced_run = 0
            self._silent_run += 1
        if not self.caller_speaking and self._voiced_run >= self.onset_frames:
            self.caller_speaking = True
            self.speech_start_s = (self._frames - self._voiced_run) * FRAME_SECONDS
            return TurnEvent.SPEECH_START
        if self.caller_speaking and self._pause_ends_turn():
            self.caller_speaking = False
            self.speech_end_s = (self._frames - self._silent_run) * FRAME_SECONDS
            return TurnEvent.TURN_END
        return TurnEvent.NONE

    def drop_turn(self) -> None:
        """Forget the turn in progress (the caller only said "uh-huh" over the agent):
        no TURN_END for it; the next voiced run starts a new turn."""
        if self.caller_speaking:
            self.caller_speaking = False
            self.speech_end_s = (self._frames - self._silent_run) * FRAME_SECONDS

    @property
    def silent_frames(self) -> int:
        """Silent frames since the caller's last voiced one."""
        return self._silent_run

    @property
    def frames(self) -> int:
        """Frames pushed so far."""
        return self._frames

    def _pause_ends_turn(self) -> bool:
        """Called on every frame while the caller holds the turn (silent_frames
        is 0 on a voiced frame): does the pause so far end it?"""
        return self._silent_run >= self.end_frames
