"""One client of `kame.v1.Gateway/Converse` and one reading of its responses.

Every caller of the gateway (the web page's bridge, the phone bridge, `kame
talk`, the e2e tests' LiveCall) opens its call with `ConverseClient` and reads
the responses as the events of `converse_event`, so that a thing the gateway
says has one name everywhere: in `kame talk`'s timeline JSON, on the web page,
in the logs.

The client keeps to the order the gateway needs:

- the config first (`start`); audio, keys, turn controls and typed text only
  once the session started (`wait_started`): a write under way when the
  gateway refuses the call (a bad token, config or resume token, no
  capacity) makes grpc.aio report INTERNAL
  "Internal error from Core" instead of the gateway's status (grpc/grpc#36066);
- writes do not raise: once the call is over they return False, and reading
  (`responses`, `events`) raises the call's status, the one place that says
  how it ended.

Events are JSON-ready dicts with a `type`, except the agent's audio, whose
`data` stays bytes (each caller plays or forwards it its own way). The resume
token is no event field (events are logged and shown): it is in `session`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, TypedDict

import grpc

from kame_common.aio import wait_first
from kame_common.auth import bearer_metadata
from kame_common.grpc_options import ConnectionPolicy
from kame_common.tls import ClientTls
from kamepb import common_pb2, gateway_pb2, gateway_pb2_grpc

Response = gateway_pb2.ConverseResponse
# The keys of a phone: the only digits a Dtmf message may carry (the gateway ends
# a call that sends another).
DTMF_KEYS = frozenset("0123456789*#ABCD")
Request = gateway_pb2.ConverseRequest
TurnAction = common_pb2.TurnControl.Action
ConverseCall = grpc.aio.StreamStreamCall[Request, Response]

# What a write raises once the gateway has ended the call (or it was cancelled).
CALL_OVER = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)
# A gateway that refuses a call for now (not ready, at capacity) says when to try
# again in this trailing metadata (services/gateway/plan.py SessionError).
RETRY_AFTER_KEY = "retry-after-s"


class StartedEvent(TypedDict):
    type: Literal["started", "resumed"]  # resumed: the call continues an earlier one
    session_id: str
    engine: str
    frontend_replica: str


class AgentAudioEvent(TypedDict):
    type: Literal["agent_audio"]
    seq: int
    speaking: bool
    # The agent is paused while the caller speaks over it (silent data): its
    # answer may resume, or a barge_in ends it.
    held: bool
    data: bytes  # in the output codec


class UserTranscriptEvent(TypedDict):
    type: Literal["user_partial", "user_final"]
    utterance_id: str
    text: str
    stable_text: str
    stability: float
    lag_s: float


class AgentTextEvent(TypedDict):
    type: Literal["agent_text"]
    text: str
    start_s: float  # position in the agent's audio stream
    end_s: float
    generation: int  # the oracle generation the words came from, 0 if none
    filler: bool


class OracleResetEvent(TypedDict):
    type: Literal["oracle_reset"]
    generation: int
    text: str
    source_text: str  # the transcript this candidate answers
    source_final: bool


class OracleAppendEvent(TypedDict):
    type: Literal["oracle_append"]
    generation: int
    text: str


class TurnEvent(TypedDict):
    type: Literal["turn"]
    utterance_id: str
    user_text: str
    response_latency_s: float
    stt_final_lag_s: float
    oracle_first_update_s: float
    answer_latency_s: float


class NoticeEvent(TypedDict):
    type: Literal["notice"]
    kind: str  # the Notice.Kind's name: ORACLE_UNAVAILABLE, RECONNECT, REFUSED, ...
    message: str


class DtmfEvent(TypedDict):
    type: Literal["dtmf"]
    digit: str
    duration_ms: int


class BargeInEvent(TypedDict):
    type: Literal["barge_in"]
    seq: int  # the caller frame on which the agent was cut
    cancelled: bool  # the caller's cancel_response() cut it, not the caller's speech


class FunctionCallEvent(TypedDict):
    type: Literal[
        "function_call"
    ]  # run one of the config's functions, answer with send_function_result
    call_id: str
    name: str
    arguments_json: str


class ToolEvent(TypedDict):
    type: Literal["tool_started", "tool_finished"]  # what a tool of the oracle's did
    call_id: str
    name: str
    source: str  # the MCP server's name, or "client"
    read_only: bool
    is_error: bool
    elapsed_s: float
    reused: bool


class UnknownEvent(TypedDict):
    type: Literal["unknown"]  # a response this client does not know (a newer gateway)


ConverseEvent = (
    StartedEvent
    | AgentAudioEvent
    | UserTranscriptEvent
    | AgentTextEvent
    | OracleResetEvent
    | OracleAppendEvent
    | TurnEvent
    | NoticeEvent
    | DtmfEvent
    | BargeInEvent
    | FunctionCallEvent
    | ToolEvent
    | UnknownEvent
)


def _started(response: Response) -> StartedEvent:
    started = response.started
    return {
        "type": "resumed" if started.resumed else "started",
        "session_id": started.session_id,
        "engine": started.engine,
        "frontend_replica": started.frontend_replica,
    }


def _agent_audio(response: Response) -> AgentAudioEvent:
    chunk = response.audio
    return {
        "type": "agent_audio",
        "seq": chunk.seq,
        "speaking": chunk.speaking,
        "held": chunk.held,
        "data": chunk.data,
    }


def _user_transcript(response: Response) -> UserTranscriptEvent:
    event = response.user_transcript
    return {
        "type": "user_final" if event.is_final else "user_partial",
        "utterance_id": event.utterance_id,
        "text": event.text,
        "stable_text": event.stable_text,
        "stability": round(event.stability, 3),  # a float32 on the wire
        "lag_s": round(event.lag_s, 4),
    }


def _agent_text(response: Response) -> AgentTextEvent:
    words = response.agent_text
    return {
        "type": "agent_text",
        "text": words.text,
        "start_s": round(words.start_s, 3),
        "end_s": round(words.end_s, 3),
        "generation": words.generation,
        "filler": words.filler,
    }


def _oracle_update(response: Response) -> OracleResetEvent | OracleAppendEvent:
    update = response.oracle_update
    if update.op == update.RESET:
        return {
            "type": "oracle_reset",
            "generation": update.generation,
            "text": update.text,
            "source_text": update.source.text,
            "source_final": update.source.is_final,
        }
    return {"type": "oracle_append", "generation": update.generation, "text": update.text}


def _turn(response: Response) -> TurnEvent:
    turn = response.turn
    return {
        "type": "turn",
        "utterance_id": turn.utterance_id,
        "user_text": turn.user_text,
        "response_latency_s": turn.response_latency_s,
        "stt_final_lag_s": turn.stt_final_lag_s,
        "oracle_first_update_s": turn.oracle_first_update_s,
        "answer_latency_s": turn.answer_latency_s,
    }


def _notice(response: Response) -> NoticeEvent:
    notice = response.notice
    try:
        kind = gateway_pb2.Notice.Kind.Name(notice.kind)
    except ValueError:  # a kind this client's protos do not have yet
        kind = str(notice.kind)
    return {"type": "notice", "kind": kind, "message": notice.message}


def _dtmf(response: Response) -> DtmfEvent:
    return {"type": "dtmf", "digit": response.dtmf.digit, "duration_ms": response.dtmf.duration_ms}


def _barge_in(response: Response) -> BargeInEvent:
    barge_in = response.barge_in
    return {"type": "barge_in", "seq": barge_in.seq, "cancelled": barge_in.cancelled}


def _function_call(response: Response) -> FunctionCallEvent:
    call = response.function_call
    return {
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments_json": call.arguments_json,
    }


def _tool(response: Response) -> ToolEvent:
    tool = response.tool
    finished = tool.phase == tool.FINISHED
    return {
        "type": "tool_finished" if finished else "tool_started",
        "call_id": tool.call_id,
        "name": tool.name,
        "source": tool.source,
        "read_only": tool.read_only,
        "is_error": tool.is_error,
        "elapsed_s": round(tool.elapsed_s, 4),
        "reused": tool.reused,
    }


# One reader per ConverseResponse kind (tests/common/test_converse.py checks it has them all).
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
}


def converse_event(response: Response) -> ConverseEvent:
    """The event for one gateway response."""
    reader = EVENT_OF.get(response.WhichOneof("msg") or "")
    return reader(response) if reader else {"type": "unknown"}


def retry_after_s(exc: grpc.aio.AioRpcError) -> float | None:
    """The gateway's hint (`retry-after-s`) of when to call again, when it sent a
    readable one (a finite number of seconds, not negative)."""
    for key, value in exc.trailing_metadata() or ():
        if key != RETRY_AFTER_KEY:
            continue
        try:
            hint = float(value)
        except (TypeError, ValueError):
            return None
        return hint if math.isfinite(hint) and hint >= 0 else None
    return None


class ConverseClient:
    """One Converse call: the config, then audio (and keys) once the session
    started, and the gateway's responses until it ends the call.

    On a channel the caller keeps (a service's, shared by its calls), or on one
    of its own (`connect`), closed with the client."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        token: str = "",
        *,
        wait_for_ready: bool = False,
        own_channel: bool = False,
    ) -> None:
        self.channel = channel
        self.call: ConverseCall = gateway_pb2_grpc.GatewayStub(channel).Converse(
            metadata=bearer_metadata(token), wait_for_ready=wait_for_ready
        )
        self.started = asyncio.Event()  # set by the reader on SessionStarted
        self.session = gateway_pb2.SessionStarted()  # this call's, once started
        self._own_channel = own_channel

    @classmethod
    def connect(
        cls,
        address: str,
        token: str = "",
        tls: ClientTls | None = None,
        policy: ConnectionPolicy | None = None,
    ) -> ConverseClient:
        """A call on a channel of its own to `address` (plaintext unless `tls` says
        otherwise). Keepalive: a gateway that vanished mid-call fails the call
        instead of leaving it silent; round robin over every address the name
        resolves to."""
        options = (policy or ConnectionPolicy()).channel_options()
        channel = (tls or ClientTls()).channel(address, options=options)
        return cls(channel, token, own_channel=True)

    async def start(self, config: gateway_pb2.ConverseConfig) -> bool:
        """Send the config; False if the call is already over."""
        return await self.send(Request(config=config))

    async def wait_started(self, *alternatives: asyncio.Event | asyncio.Future[Any]) -> None:
        """Until the session started, or one of `alternatives` (the call's reader
        ending, a hang-up) came first. Only a reader (`responses`) sets it."""
        await wait_first(self.started, *alternatives)

    async def send_audio(self, data: bytes) -> bool:
        """Caller audio in the configured codec; False once the call is over."""
        return await self.send(Request(audio=data))

    async def end_turn(self) -> bool:
        """The caller's turn is over now (push-to-talk: the button is released);
        False once the call is over."""
        return await self._turn_control(TurnAction.END_TURN)

    async def respond(self) -> bool:
        """Ask for the answer to the caller's last turn now (with MANUAL turn
        detection the only way an answer starts); False once the call is over."""
        return await self._turn_control(TurnAction.RESPOND)

    async def cancel_response(self) -> bool:
        """Stop the agent's current speech (a `barge_in` event with `cancelled`
        follows if it was speaking); False once the call is over."""
        return await self._turn_control(TurnAction.CANCEL)

    async def send_text(self, text: str) -> bool:
        """A message the caller typed: a caller turn of its own, answered like a
        spoken one (keep sending audio, silence included, for the agent to speak
        in); False once the call is over. A blank or too long text gets a notice
        REFUSED and the call goes on."""
        return await self.send(Request(user_text=gateway_pb2.UserText(text=text)))

    async def send_function_result(self, call_id: str, output: str, is_error: bool = False) -> bool:
        """The answer to a `function_call` event (its `call_id`): the model reads
        `output` as the tool's result; False once the call is over."""
        result = common_pb2.FunctionResult(call_id=call_id, output=output, is_error=is_error)
        return await self.send(Request(function_result=result))

    async def _turn_control(self, action: common_pb2.TurnControl.Action.ValueType) -> bool:
        return await self.send(Request(turn_control=common_pb2.TurnControl(action=action)))

    async def send(self, request: Request) -> bool:
        """Any request (a key: `Request(dtmf=...)`); False once the call is over."""
        try:
            await self.call.write(request)
        except CALL_OVER:
            return False
        return True

    async def done_writing(self) -> None:
        """Half-close: the caller is done; the gateway ends the call when it is."""
        with contextlib.suppress(*CALL_OVER):
            await self.call.done_writing()

    async def responses(self) -> AsyncIterator[Response]:
        """The gateway's responses until it ends the call; raises its status
        (grpc.aio.AioRpcError) when that is not OK."""
        async for response in self.call:
            if response.HasField("started"):
                self.session = response.started
                self.started.set()
            yield response

    async def events(self) -> AsyncIterator[ConverseEvent]:
        """`responses`, as events."""
        async for response in self.responses():
            yield converse_event(response)

    async def code(self) -> grpc.StatusCode:
        """The call's status code, once it ended."""
        return await self.call.code()

    def cancel(self) -> None:
        self.call.cancel()

    async def close(self) -> None:
        """Cancel the call (if still open) and close the channel if it is the client's."""
        self.call.cancel()
        if self._own_channel:
            await self.channel.close()

    async def __aenter__(self) -> ConverseClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
