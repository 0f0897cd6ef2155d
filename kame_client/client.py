"""One client of `kame.v1.Gateway/Converse`.

Every caller of the gateway (the web service's bridge, the phone bridge, `kame
talk`, the benchmarks, the e2e tests) opens its call with `ConverseClient` and
reads the responses as kame_client/events.py's events.

The client keeps to the order the gateway needs:

- the config first (`start`); audio, keys, turn controls and typed text only
  once the session started (`wait_started`): a write under way when the
  gateway refuses the call (a bad token, config or resume token, no
  capacity) makes grpc.aio report INTERNAL
  "Internal error from Core" instead of the gateway's status (grpc/grpc#36066);
- writes do not raise: once the call is over they return False, and reading
  (`responses`, `events`) raises the call's status, the one place that says
  how it ended (kame_client/status.py says it in each edge's words).

What a caller asks of the call besides audio is a `CallerRequest` (end the
turn, respond, cancel, typed text, a function's result, context for the agent
(a delegation's answer, thinking, instructions), half-close), sent with
`perform`, so that an endpoint can decide it without a network and send it later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc

from kame_client.events import ConverseEvent, event_of
from kame_client.status import CORE_INTERNAL_DETAILS
from kame_common.aio import wait_first
from kame_common.auth import bearer_metadata
from kame_common.grpc_options import ConnectionPolicy
from kame_common.tls import ClientTls
from kamepb import common_pb2, gateway_pb2, gateway_pb2_grpc

Response = gateway_pb2.ConverseResponse
Request = gateway_pb2.ConverseRequest
TurnAction = common_pb2.TurnControl.Action
ConverseCall = grpc.aio.StreamStreamCall[Request, Response]
# The keys of a phone: the only digits a Dtmf message may carry (the gateway ends
# a call that sends another).
DTMF_KEYS = frozenset("0123456789*#ABCD")

# What a write raises once the gateway has ended the call (or it was cancelled).
CALL_OVER = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)


@dataclass(frozen=True)
class EndTurn:
    """The caller's turn is over now (push-to-talk: the button is released)."""

    URGENT: ClassVar[bool] = False


@dataclass(frozen=True)
class Respond:
    """Answer the caller's last turn now (with MANUAL turn detection the only way
    an answer starts)."""

    URGENT: ClassVar[bool] = False


@dataclass(frozen=True)
class CancelResponse:
    """Stop the agent's current speech: about now, so it goes before any caller
    audio still waiting to be sent."""

    URGENT: ClassVar[bool] = True


@dataclass(frozen=True)
class SendText:
    """A message the caller typed: a caller turn of its own."""

    URGENT: ClassVar[bool] = False
    text: str


@dataclass(frozen=True)
class SendFunctionResult:
    """The answer to a function_call event (its `call_id`)."""

    URGENT: ClassVar[bool] = False
    call_id: str
    output: str
    is_error: bool = False


@dataclass(frozen=True)
class SendContext:
    """Commentary (a delegation's answer), thinking or instructions for the agent
    (gateway.proto AgentContext): not caller speech, so it need not wait for the
    caller audio before it."""

    URGENT: ClassVar[bool] = True
    kind: common_pb2.AgentContext.Kind.ValueType
    text: str
    delegation_id: str = ""


@dataclass(frozen=True)
class HalfClose:
    """The caller is done; the gateway ends the call when it is."""

    URGENT: ClassVar[bool] = False


CallerRequest = (
    EndTurn | Respond | CancelResponse | SendText | SendFunctionResult | SendContext | HalfClose
)


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

    async def send_context(
        self, kind: common_pb2.AgentContext.Kind.ValueType, text: str, delegation_id: str = ""
    ) -> bool:
        """Commentary, thinking or instructions (AgentContext); with client delegation
        commentary naming a `delegation` event's id is its answer, said by the agent.
        False once the call is over; what the gateway cannot take gets a notice
        REFUSED and the call goes on."""
        context = common_pb2.AgentContext(kind=kind, text=text, delegation_id=delegation_id)
        return await self.send(Request(context=context))

    async def perform(self, request: CallerRequest) -> bool:
        """One CallerRequest; False once the call is over."""
        match request:
            case EndTurn():
                return await self.end_turn()
            case Respond():
                return await self.respond()
            case CancelResponse():
                return await self.cancel_response()
            case SendText(text=text):
                return await self.send_text(text)
            case SendFunctionResult(call_id=call_id, output=output, is_error=is_error):
                return await self.send_function_result(call_id, output, is_error)
            case SendContext(kind=kind, text=text, delegation_id=delegation_id):
                return await self.send_context(kind, text, delegation_id)
            case HalfClose():
                await self.done_writing()
                return True

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
        (grpc.aio.AioRpcError) when that is not OK: the one its CallEnding
        announced, which grpc.aio may have replaced with INTERNAL."""
        ending: gateway_pb2.CallEnding | None = None
        try:
            async for response in self.call:
                if response.HasField("ending"):
                    ending = response.ending
                    continue
                if response.HasField("started"):
                    self.session = response.started
                    self.started.set()
                yield response
        except grpc.aio.AioRpcError as error:
            if ending is None or not _lost_to_a_write(error):
                raise
            raise _announced(ending, error) from None

    async def events(self) -> AsyncIterator[ConverseEvent]:
        """`responses`, as events (kame_client/events.py)."""
        async for response in self.responses():
            yield event_of(response)

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


def _lost_to_a_write(error: grpc.aio.AioRpcError) -> bool:
    """The status grpc.aio reports when a write failed as the call ended (grpc/grpc#36066)."""
    return error.code() == grpc.StatusCode.INTERNAL and error.details() == CORE_INTERNAL_DETAILS


def _announced(ending: gateway_pb2.CallEnding, error: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """The call's status as the gateway's CallEnding said it."""
    code = grpc.StatusCode.__members__.get(ending.code, grpc.StatusCode.UNKNOWN)
    return grpc.aio.AioRpcError(
        code, error.initial_metadata(), error.trailing_metadata(), ending.details
    )
