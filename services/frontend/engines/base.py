"""The interface every front-end engine implements (tts, kame, moshi).

The service (server.py) owns the gRPC stream and per-frame bookkeeping; an
engine owns the models. One `EngineSession` per caller: the service feeds it
exactly one 80 ms caller frame per `step` and gets exactly one 80 ms agent
frame back. `step` is async so that a batched engine can gather the frames of
all its active sessions into one model tick; engines run their compute off
the event loop thread.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np


class SlotsExhausted(RuntimeError):
    """Every session slot of the engine is taken (-> RESOURCE_EXHAUSTED)."""


class InvalidSessionConfig(ValueError):
    """The session config names something the engine does not have (-> INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class SessionParams:
    session_id: str
    voice: str = ""
    turn_end_silence_s: float = 0.4
    filler_text: str = ""


@dataclass
class SpokenWord:
    """Agent text spoken in the stream: `start_s`/`end_s` are seconds from the
    start of the agent's audio stream (frame index * 0.08 + offset)."""

    text: str
    start_s: float
    end_s: float
    generation: int = 0


@dataclass
class StepOutput:
    pcm: np.ndarray  # float32, exactly FRAME_SAMPLES at 24 kHz
    speaking: bool  # False when the frame is silence
    words: list[SpokenWord] = field(default_factory=list)  # words that start in this frame


class EngineSession(abc.ABC):
    slot: int = -1  # the batch slot, for engines that batch sessions

    @abc.abstractmethod
    async def step(self, frame: np.ndarray) -> StepOutput:
        """Consume one caller frame (float32, FRAME_SAMPLES), return one agent frame."""

    @abc.abstractmethod
    def oracle_reset(self, generation: int) -> None:
        """Start a new oracle candidate (anchored at the next step)."""

    @abc.abstractmethod
    def oracle_append(self, generation: int, text: str) -> None:
        """Extend the current oracle candidate with whole words."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Free the session's slot and state. Idempotent."""


class Engine(abc.ABC):
    name: str

    @property
    @abc.abstractmethod
    def total_slots(self) -> int: ...

    @property
    @abc.abstractmethod
    def free_slots(self) -> int: ...

    @abc.abstractmethod
    async def open_session(self, params: SessionParams) -> EngineSession:
        """Start a session; raises SlotsExhausted or InvalidSessionConfig."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release models and threads."""
