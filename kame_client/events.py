"""What the gateway says on a Converse call, as typed events, and their JSON.

`event_of` is the one mapping from a `ConverseResponse` to its event; every
caller of the gateway reads its call through it (kame_client.ConverseClient's
`events`) and dispatches with `match`, so that mypy checks each edge against
these classes:

    match event:
        case AgentAudio(data=data, speaking=speaking): ...
        case UserFinal(text=text): ...

A thing the gateway says has one name everywhere: each class's `TYPE` is the
name `event_json` gives it, in `kame talk`'s timeline JSON, on the web page and
in the logs. The agent's audio stays bytes (`data`; its JSON gives its length
only). The resume token is no event field (events are logged and shown): it
is in the client's `session`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from kamepb import gateway_pb2

Response = gateway_pb2.ConverseResponse


@dataclass(frozen=True)
class Event:
    """A thing that happened on a call; `TYPE` names it in JSON."""

    TYPE: ClassVar[str]


@dataclass(frozen=True)
class Started(Event):
    """The gateway started the session: audio may flow."""

    TYPE: ClassVar[str] = "started"
    session_id: str
    engine: str
    frontend_replica: str


@dataclass(frozen=True)
class Resumed(Started):
    """The session continues an earlier call's (the config's resume token)."""

    TYPE: ClassVar[str] = "resumed"


@dataclass(frozen=True)
class AgentAudio(Event):
    """One frame of the agent's audio in the output codec, one per caller frame."""

    TYPE: ClassVar[str] = "agent_audio"
    seq: int
    speaking: bool
    # The agent is paused while the caller speaks over it (silent data): its
    # answer may resume, or a barge_in ends it.
    held: bool
    data: bytes


@dataclass(frozen=True)
class UserTranscript(Event):
    """What stt heard the caller say (UserPartial or UserFinal)."""

    TYPE: ClassVar[str] = "user_transcript"
    utterance_id: str
    text: str
    stable_text: str
    stability: float
    lag_s: float
    # The audio the hypothesis covers, in seconds of the call's caller audio (the
    # session's timeline, where AgentText and Delegated are placed too).
    start_s: float = 0.0
    end_s: float = 0.0


@dataclass(frozen=True)
class UserPartial(UserTranscript):
    TYPE: ClassVar[str] = "user_partial"


@dataclass(frozen=True)
class UserFinal(UserTranscript):
    TYPE: ClassVar[str] = "user_final"


@dataclass(frozen=True)
class AgentText(Event):
    """Words the agent speaks, placed on its audio stream."""

    TYPE: ClassVar[str] = "agent_text"
    text: str
    start_s: float  # position in the agent's audio stream
    end_s: float
    generation: int  # the oracle generation the words came from, 0 if none
    filler: bool


@dataclass(frozen=True)
class OracleReset(Event):
    """The oracle's new candidate answer (include_oracle_updates)."""

    TYPE: ClassVar[str] = "oracle_reset"
    generation: int
    text: str
    source_text: str  # the transcript this candidate answers
    source_final: bool


@dataclass(frozen=True)
class OracleAppend(Event):
    """More text of the oracle's candidate `generation`."""

    TYPE: ClassVar[str] = "oracle_append"
    generation: int
    text: str


@dataclass(frozen=True)
class Turn(Event):
    """The gateway's summary of one caller turn and its answer."""

    TYPE: ClassVar[str] = "turn"
    utterance_id: str
    user_text: str
    response_latency_s: float
    stt_final_lag_s: float
    oracle_first_update_s: float
    answer_latency_s: float


@dataclass(frozen=True)
class Notice(Event):
    """Something the caller should know; the call goes on (unless it says RECONNECT)."""

    TYPE: ClassVar[str] = "notice"
    kind: str  # the Notice.Kind's name: ORACLE_UNAVAILABLE, RECONNECT, REFUSED, ...
    message: str


@dataclass(frozen=True)
class Dtmf(Event):
    """A key the gateway took (it echoes each one)."""

    TYPE: ClassVar[str] = "dtmf"
    digit: str
    duration_ms: int


@dataclass(frozen=True)
class BargeIn(Event):
    """The agent was cut: drop what is queued of its audio."""

    TYPE: ClassVar[str] = "barge_in"
    seq: int  # the caller frame on which the agent was cut
    cancelled: bool  # the caller's cancel_response() cut it, not the caller's speech


@dataclass(frozen=True)
class FunctionCall(Event):
    """Run one of the config's functions; answer with send_function_result."""

    TYPE: ClassVar[str] = "function_call"
    call_id: str
    name: str
    arguments_json: str


@dataclass(frozen=True)
class ToolCall(Event):
    """What a tool of the oracle's did (ToolStarted or ToolFinished)."""

    TYPE: ClassVar[str] = "tool"
    call_id: str
    name: str
    source: str  # the MCP server's name, or "client"
    read_only: bool
    is_error: bool
    elapsed_s: float
    reused: bool


@dataclass(frozen=True)
class ToolStarted(ToolCall):
    TYPE: ClassVar[str] = "tool_started"


@dataclass(frozen=True)
class ToolFinished(ToolCall):
    TYPE: ClassVar[str] = "tool_finished"


@dataclass(frozen=True)
class Delegated(Event):
    """Client delegation: the caller's back-end is asked for the answer to
    `source_text`; answer with SendContext COMMENTARY naming `delegation_id`."""

    TYPE: ClassVar[str] = "delegation"
    delegation_id: str
    offset_s: float  # where on the session's timeline (seconds of caller audio)
    source_utterance_id: str
    source_text: str
    source_final: bool


@dataclass(frozen=True)
class Unknown(Event):
    """A response this client does not know (a newer gateway)."""

    TYPE: ClassVar[str] = "unknown"


# Every event but the agent's audio (what kame talk's timeline records).
NonAudioEvent = (
    Started
    | UserTranscript
    | AgentText
    | OracleReset
    | OracleAppend
    | Turn
    | Notice
    | Dtmf
    | BargeIn
    | FunctionCall
    | ToolCall
    | Delegated
    | Unknown
)
ConverseEvent = AgentAudio | NonAudioEvent


def _started(response: Response) -> Started:
    started = response.started
    kind = Resumed if started.resumed else Started
    return kind(started.session_id, started.engine, started.frontend_replica)


def _agent_audio(response: Response) -> AgentAudio:
    chunk = response.audio
    return AgentAudio(chunk.seq, chunk.speaking, chunk.held, chunk.data)


def _user_transcript(response: Response) -> UserTranscript:
    event = response.user_transcript
    kind = UserFinal if event.is_final else UserPartial
    return kind(
        event.utterance_id,
        event.text,
        event.stable_text,
        round(event.stability, 3),  # a float32 on the wire
        round(event.lag_s, 4),
        round(event.span.start_s, 3),
        round(event.span.end_s, 3),
    )


def _agent_text(response: Response) -> AgentText:
    words = response.agent_text
    return AgentText(
        words.text, round(words.start_s, 3), round(words.end_s, 3), words.generation, words.filler
    )


def _oracle_update(response: Response) -> OracleReset | OracleAppend:
    update = response.oracle_update
    if update.op == update.RESET:
        return OracleReset(
            update.generation, update.text, update.source.text, update.source.is_final
        )
    return OracleAppend(update.generation, update.text)


def _turn(response: Response) -> Turn:
    turn = response.turn
    return Turn(
        turn.utterance_id,
        turn.user_text,
        turn.response_latency_s,
        turn.stt_final_lag_s,
        turn.oracle_first_update_s,
        turn.answer_latency_s,
    )


def _notice(response: Response) -> Notice:
    notice = response.notice
    try:
        kind = gateway_pb2.Notice.Kind.Name(notice.kind)
    except ValueError:  # a kind this client's protos do not have yet
        kind = str(notice.kind)
    return Notice(kind, notice.message)


def _dtmf(response: Response) -> Dtmf:
    return Dtmf(response.dtmf.digit, response.dtmf.duration_ms)


def _barge_in(response: Response) -> BargeIn:
    return BargeIn(response.barge_in.seq, response.barge_in.cancelled)


def _function_call(response: Response) -> FunctionCall:
    call = response.function_call
    return FunctionCall(call.call_id, call.name, call.arguments_json)


def _tool(response: Response) -> ToolCall:
    tool = response.tool
    kind = ToolFinished if tool.phase == tool.FINISHED else ToolStarted
    return kind(
        tool.call_id,
        tool.name,
        tool.source,
        tool.read_only,
        tool.is_error,
        round(tool.elapsed_s, 4),
        tool.reused,
    )


def _delegation(response: Response) -> Delegated:
    delegation = response.delegation
    source = delegation.source
    return Delegated(
        delegation.delegation_id,
        round(delegation.offset_s, 3),
        source.utterance_id,
        source.text,
        source.is_final,
    )


# One reader per ConverseResponse kind (tests/client/test_events.py checks it has them all).
EVENT_OF: dict[str, Callable[[Response], ConverseEvent]] = {
    "started": _started,
    "audio": _agent_audio,
    "user_transcript": _user_transcript,
    "agent_text": _agent_text,
    "oracle_update": _oracle_update,
    "turn": _turn,
    "notice": _notice,
    "dtmf": _dtmf,
    "barge_in": _barge_in,
    "function_call": _function_call,
    "tool": _tool,
    "delegation": _delegation,
}


def event_of(response: Response) -> ConverseEvent:
    """The event for one gateway response."""
    reader = EVENT_OF.get(response.WhichOneof("msg") or "")
    return reader(response) if reader else Unknown()


def event_json(event: Event) -> dict[str, Any]:
    """An event as JSON: `type` (its TYPE) and its fields; bytes (the agent's
    audio) as their length, `<field>_bytes`."""
    shown: dict[str, Any] = {"type": event.TYPE}
    for field in dataclasses.fields(event):
        value = getattr(event, field.name)
        if isinstance(value, bytes):
            shown[f"{field.name}_bytes"] = len(value)
        else:
            shown[field.name] = value
    return shown
