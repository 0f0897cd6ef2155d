"""What one paced call (kame_client/caller.py) brought back: `TalkResult`, the
caller and agent audio and the timeline of events, each stamped with its time.

The timeline holds the gateway's events (kame_client/events.py) but its audio,
and the caller's own: where the caller's audio starts and stops, a typed
message, where the agent starts and stops speaking, a reconnect. `timeline`
writes it as `kame talk`'s JSON, each event as events.event_json names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from kame_client.events import Event, NonAudioEvent, Notice, Started, Turn, event_json
from kame_common.audio import SAMPLE_RATE, Samples

if TYPE_CHECKING:
    from kame_client.caller import TalkOptions


@dataclass(frozen=True)
class CallerAudioStart(Event):
    TYPE: ClassVar[str] = "caller_audio_start"


@dataclass(frozen=True)
class CallerAudioStop(Event):
    """The WAV has been sent (silence follows until the agent is done)."""

    TYPE: ClassVar[str] = "caller_audio_stop"


@dataclass(frozen=True)
class CallerText(Event):
    """The caller typed `text` (kame talk --say)."""

    TYPE: ClassVar[str] = "caller_text"
    text: str


@dataclass(frozen=True)
class AgentAudioStart(Event):
    """The agent starts speaking on frame `seq`."""

    TYPE: ClassVar[str] = "agent_audio_start"
    seq: int


@dataclass(frozen=True)
class AgentAudioStop(Event):
    TYPE: ClassVar[str] = "agent_audio_stop"
    seq: int


@dataclass(frozen=True)
class Reconnect(Event):
    """The call broke off (`after`: its status) or was asked to move: continued
    on `gateway`, the caller's audio resent from `resend_from_s`."""

    TYPE: ClassVar[str] = "reconnect"
    gateway: str
    after: str
    resend_from_s: float


TimelineEvent = (
    NonAudioEvent
    | CallerAudioStart
    | CallerAudioStop
    | CallerText
    | AgentAudioStart
    | AgentAudioStop
    | Reconnect
)
E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class Timed(Generic[E]):
    """An event and when it came, in seconds since the call's stream started."""

    t: float
    event: E

    def json(self) -> dict[str, Any]:
        return {"t": self.t, **event_json(self.event)}


def fields_of(event: Event) -> dict[str, Any]:
    """An event's JSON without its type (the timeline's `turns`, `notices`)."""
    shown = event_json(event)
    del shown["type"]
    return shown


@dataclass
class TalkResult:
    caller: Samples  # what was streamed, 24 kHz
    speech_start_s: float | None
    speech_end_s: float | None
    streamed_samples: int = 0  # caller audio sent: the WAV plus the silence after
    # When each chunk of caller audio was last sent (the call's clock): after a
    # reconnect the caller is behind the WAV's own times (caller.py's doc).
    sent_t: dict[int, float] = field(default_factory=dict)
    agent: Samples = field(default_factory=lambda: np.zeros(0, np.float32))  # 24 kHz
    agent_first_chunk_t: float | None = None
    # The receive time of each agent sample, chunk by chunk.
    agent_t: list[npt.NDArray[np.float64]] = field(default_factory=list)
    events: list[Timed[TimelineEvent]] = field(default_factory=list)
    started: Started | None = None  # the last call's
    turns: list[Turn] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    finals: list[str] = field(default_factory=list)
    agent_words: list[str] = field(default_factory=list)
    status: str = "OK"
    status_details: str = ""
    retry_after_s: float | None = None  # the gateway's hint, when it refused the call for now

    def of(self, kind: type[E]) -> list[Timed[E]]:
        """The timeline's events of one kind (a class of events.py or of this
        module: UserTranscript covers partials and finals)."""
        return [
            Timed(timed.t, timed.event) for timed in self.events if isinstance(timed.event, kind)
        ]

    def first_t(self, kind: type[Event]) -> float | None:
        """When the first event of `kind` came (None if none did)."""
        return next((timed.t for timed in self.of(kind)), None)

    @property
    def user_transcript(self) -> str:
        return " ".join(t for t in self.finals if t)

    @property
    def agent_text(self) -> str:
        return " ".join(self.agent_words)

    @property
    def response_latency_s(self) -> float | None:
        """Caller's end of speech -> first agent audio at the client."""
        if self.speech_end_s is None or self.speech_start_s is None:
            return None
        starts = [timed.t for timed in self.of(AgentAudioStart) if timed.t > self.speech_start_s]
        return starts[0] - self.speech_end_s if starts else None

    def timeline(self, options: TalkOptions, paths: dict[str, str]) -> dict[str, Any]:
        """`kame talk`'s timeline JSON (kame_cli/talk.py lists its fields)."""
        gateway_latency = self.turns[0].response_latency_s if self.turns else None
        started = self.started
        return {
            "session_id": started.session_id if started else "",
            "gateway": options.gateway,
            "mode": options.mode,
            "engine": started.engine if started else "",
            "frontend_replica": started.frontend_replica if started else "",
            "status": self.status,
            "status_details": self.status_details,
            "input": {
                "wav": paths.get("wav", ""),
                "codec": options.input_codec,
                "duration_s": round(len(self.caller) / SAMPLE_RATE, 3),
                "streamed_s": round(self.streamed_samples / SAMPLE_RATE, 3),
                "speech_start_s": self.speech_start_s,
                "speech_end_s": self.speech_end_s,
            },
            "output": {
                "wav": paths.get("out", ""),
                "codec": options.output_codec,
                "duration_s": round(len(self.agent) / SAMPLE_RATE, 3),
                "first_chunk_t": self.agent_first_chunk_t,
            },
            "user_transcript": self.user_transcript,
            "agent_text": self.agent_text,
            "response_latency_s": _round(self.response_latency_s),
            "gateway_response_latency_s": _round(gateway_latency),
            "turns": [fields_of(turn) for turn in self.turns],
            "notices": [fields_of(notice) for notice in self.notices],
            "events": [timed.json() for timed in self.events],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
