"""The interface every front-end engine implements (tts, kame, moshi).

The service (server.py) owns the gRPC stream and per-frame bookkeeping; an
engine owns the models. One `EngineSession` per caller: the service feeds it
exactly one 80 ms caller frame per `step` and gets exactly one 80 ms agent
frame back. `step` is async so that a batched engine can gather the frames of
all its active sessions into one model tick; engines run their compute off
the event loop thread.

Between steps the service hands the session what the gateway relays: oracle
updates (a RESET carries the candidate's first words and what it answers, its
`CandidateSource`), the caller's transcripts, and the caller's turn controls
and typed messages. An engine whose own turn detector ends the caller's turn
(tts) says so in the StepOutput of that frame.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from kame_common.audio import Samples
from kame_common.hold import DEFAULT_HOLD_MAX_S

# The one home of the turn-taking default: a session config that leaves it 0
# gets this (the gateway's settings default to 0, so they pass it on); the
# pause is the tts replica's in its silence mode (FrontendSettings.turn_mode).
# The hold's default and limits are kame_common/hold.py's.
DEFAULT_TURN_END_SILENCE_S = 0.4


class SlotsExhausted(RuntimeError):
    """Every session slot of the engine is taken (-> RESOURCE_EXHAUSTED)."""


class InvalidSessionConfig(ValueError):
    """The session config names something the engine does not have (-> INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class SessionParams:
    session_id: str
    voice: str = ""
    # A fixed pause that ends the caller's turn; 0: the replica's turn-taking
    # (tts: FrontendSettings.turn_*, by default Smart Turn with a fallback pause).
    turn_end_silence_s: float = 0.0
    # tts engine: what the agent says while it waits for an answer to what the
    # caller said (empty = it waits in silence), and for how long at most.
    hold_phrases: tuple[str, ...] = ()
    hold_max_s: float = DEFAULT_HOLD_MAX_S
    # ... and how long the caller waits for the answer before the hold phrase (0: at once).
    hold_delay_s: float = 0.0
    # Push-to-talk: the caller ends turns and asks for answers (TurnControl); the
    # engine never does it by itself. Engines that take turns themselves refuse it.
    manual_turns: bool = False


@dataclass(frozen=True)
class CandidateSource:
    """What an oracle candidate answers: the caller's utterance as the oracle saw it."""

    utterance_id: str
    text: str
    is_final: bool = False


@dataclass(frozen=True)
class Transcript:
    """One stt hypothesis of a caller utterance; `end_s` is where the audio it
    covers ends, in seconds from the start of the stream; `settled` when stt
    expects none of its words to change (a final, or a partial whose words are
    all stable: two consecutive hypotheses agreed on them)."""

    utterance_id: str
    text: str
    is_final: bool
    end_s: float
    settled: bool = False


@dataclass
class SpokenWord:
    """Agent text spoken in the stream: `start_s`/`end_s` are seconds from the
    start of the agent's audio stream (frame index * 0.08 + offset)."""

    text: str
    start_s: float
    end_s: float
    generation: int = 0
    filler: bool = False  # a hold phrase or a repair, not content


@dataclass
class StepOutput:
    pcm: Samples  # exactly FRAME_SAMPLES at 24 kHz
    speaking: bool  # False when the frame is silence
    words: list[SpokenWord] = field(default_factory=list)  # words that start in this frame
    # Set when the engine's turn detector ended the caller's turn on this frame:
    # where the caller's speech ended, in seconds from the start of the stream.
    turn_end_s: float | None = None
    # Set when caller speech cut agent speech on this frame (the client drops the
    # agent audio it has queued) ...
    barged_in: bool = False
    # ... and this too when a request of the caller's (CANCEL, a typed message)
    # cut it rather than its speech.
    cancelled: bool = False
    # Set while the agent is paused because the caller speaks over it (silent
    # frames): its answer may resume, or a frame with `barged_in` stops it.
    held: bool = False


class EngineSession(abc.ABC):
    slot: int = -1  # the batch slot, for engines that batch sessions

    @abc.abstractmethod
    async def step(self, frame: Samples) -> StepOutput:
        """Consume one caller frame (float32, FRAME_SAMPLES), return one agent frame."""

    @abc.abstractmethod
    def oracle_reset(
        self, generation: int, text: str = "", source: CandidateSource | None = None
    ) -> None:
        """Start a new oracle candidate (anchored at the next step) with its first
        words, if any; `source` is what it answers (None when the update named none)."""

    @abc.abstractmethod
    def oracle_append(self, generation: int, text: str) -> None:
        """Extend the current oracle candidate with whole words."""

    def user_transcript(self, transcript: Transcript) -> None:  # noqa: B027 (optional hook)
        """A caller transcript event, in stt order. Engines that do not check
        candidates against what the caller said ignore it."""

    # The caller's turn controls and typed messages (TurnControl, UserText in
    # frontend.proto). Engines that take turns themselves ignore all but cancel.

    def end_turn(self) -> None:  # noqa: B027 (optional hook)
        """The caller's turn is over now."""

    def respond(self) -> None:  # noqa: B027 (optional hook)
        """Answer the caller's last turn now."""

    def cancel(self) -> None:  # noqa: B027 (optional hook)
        """Stop the agent's current speech (the next StepOutput says `cancelled`)."""

    def user_text(self, transcript: Transcript) -> None:  # noqa: B027 (optional hook)
        """A message the caller typed: a whole caller turn, its text a final."""

    def flush_words(self) -> list[SpokenWord]:
        """The caller's input ended: the words the engine still holds back (one
        that reports a word only once it is complete has the last one open)."""
        return []

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
