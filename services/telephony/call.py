"""One phone call bridged to one `kame.v1.Gateway/Converse` call.

Each protocol (sip.py, twilio.py, audiosocket.py) turns its wire into the same
few calls on a `PhoneCall`: caller audio, a key pressed, the caller hung up;
and gives it a `PhoneLeg` for the other way: send a 20 ms packet, drop what the
far end has queued, hang up. Everything in between is here, once:

- the Converse config (mode, the phone's codec both ways, the call's metadata);
- caller audio to the gateway as it comes, in the phone's codec (the gateway
  decodes G.711 and PCM16 itself), keys as Dtmf requests;
- agent audio through a `Playout` (20 ms packets on our clock); a BargeIn from
  the gateway flushes it and asks the leg to clear the far end's queue;
- the agent's functions (call_functions.py: the call control the operator
  enabled, declared in the config): each `function_call` runs as a task of its
  own (a transfer takes a while; the call goes on meanwhile), its answer goes
  back on the uplink, the one writer of the Converse call (call_functions.py
  answers within ANSWER_WITHIN_S, before the action is over if need be);
- the end: the caller hanging up half-closes the Converse call, so that the
  gateway finishes the session, and cancels it after HANG_UP_GRACE_S (nobody is
  listening any more); the gateway ending the call (an error, a drain, the
  length cap) hangs up the phone. The end cancels the functions still running,
  except one that ended the call itself (a hang-up, a transfer): its answer,
  if not sent already, goes out before the half-close.

The Converse call is kame_client's client, read as its events, and ended as
kame_client/status.py says (the retry-after hint a SIP refusal carries). No
conversation state lives here: the gateway and Redis hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from kame_client.client import DTMF_KEYS, ConverseClient, HalfClose, SendFunctionResult
from kame_client.events import (
    AgentAudio,
    BargeIn,
    ConverseEvent,
    Dtmf,
    FunctionCall,
    Notice,
    Started,
    Turn,
)
from kame_client.status import CallEnd
from kame_common.aio import cancel_and_wait
from kamepb import common_pb2, gateway_pb2
from services.telephony import metrics
from services.telephony.playout import PhoneCodec, Playout

log = logging.getLogger(__name__)

# What waits for the gateway (caller audio, keys) beyond this is dropped, oldest
# first (a stalled gateway must not grow the queue without bound): 2 s of 20 ms
# packets.
CALLER_QUEUE_PACKETS = 100
# After a hang-up the Converse call is half-closed, so the gateway finishes the
# session (stt's last final, the oracle's log); past this it is cancelled.
HANG_UP_GRACE_S = 3.0
# How long the half-close waits for the answer of a function that ended the call
# (a hang-up's "hung up", a transfer's outcome), so the oracle's record has it.
LAST_RESULTS_S = 1.0


class PhoneLeg(Protocol):
    """The phone's side of a call, as each protocol speaks it."""

    async def send_audio(self, packet: bytes, speaking: bool) -> None:
        """One 20 ms packet of agent audio in the call's codec (paced by the caller)."""

    async def clear(self) -> None:
        """The caller cut the agent off: drop agent audio the far end has queued."""

    async def hang_up(self, reason: str) -> None:
        """The agent's side ended the call: end it on the phone too."""


# How a function call is answered: the words for the model, and whether they are
# an error. The first answer is the result; later ones are not sent.
Answer = Callable[[str, bool], None]


class AgentFunctions(Protocol):
    """The functions a call offers the agent (call_functions.CallFunctions)."""

    @property
    def declared(self) -> Sequence[common_pb2.ClientFunction]:
        """What the Converse config declares (none: no functions)."""

    async def run(self, call: PhoneCall, name: str, arguments_json: str, answer: Answer) -> None:
        """Run a call of `name` on `call` and `answer` it (an unknown name or bad
        arguments is an error answer); the action may go on after its answer
        (a transfer that takes a minute). Never raises."""


class Ended(enum.Enum):
    CALLER_HUNG_UP = "caller_hung_up"
    AGENT_HUNG_UP = "agent_hung_up"  # the gateway ended the call normally
    GATEWAY_ERROR = "gateway_error"  # the gateway refused or broke off the call


@dataclass(frozen=True)
class CallInfo:
    provider: str  # "sip", "twilio", "audiosocket"
    caller: str = ""
    callee: str = ""
    provider_call_id: str = ""

    def to_proto(self) -> gateway_pb2.CallInfo:
        return gateway_pb2.CallInfo(
            provider=self.provider,
            caller=self.caller,
            callee=self.callee,
            provider_call_id=self.provider_call_id,
        )


@dataclass(frozen=True)
class CallSettings:
    """What every phone call of this service is configured with."""

    mode: gateway_pb2.ConverseConfig.Mode.ValueType
    auth_token: str
    prebuffer_ms: int
    max_queued_ms: int
    # Keys a call may press: `dtmf_burst` at once, `dtmf_rate_per_s` sustained
    # (0 = no limit); more are dropped.
    dtmf_rate_per_s: float = 0.0
    dtmf_burst: int = 1
    # A gateway that does not answer at once (restarting, a connection in backoff)
    # is waited for this long before the phone is hung up.
    start_timeout_s: float = 5.0


class KeyRate:
    """A token bucket for a call's keys: `burst` presses at once, then `rate_per_s`
    (0 = every press passes). A caller (or a stranger on a SIP trunk, a bot) who
    floods keys must not make the gateway, the oracle and Redis take a turn per
    press."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()

    def allow(self) -> bool:
        if not self.rate_per_s:
            return True
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


# What waits for the uplink, the Converse call's one writer (grpc.aio fails a call
# written by two tasks at once): caller audio and keys, a function's answer, and
# the caller's hang-up (HalfClose), queued behind the audio that came before it.
_ToGateway = gateway_pb2.ConverseRequest | SendFunctionResult | HalfClose


class PhoneCall:
    def __init__(
        self,
        channel: grpc.aio.Channel,
        settings: CallSettings,
        info: CallInfo,
        codec: PhoneCodec,
        leg: PhoneLeg,
        functions: AgentFunctions | None = None,
    ) -> None:
        self.info = info
        self.codec = codec
        self.session_id = ""
        # Set once the gateway has started the session: a protocol that can
        # answer late (SIP) answers the phone then, not before it knows.
        self.started = asyncio.Event()
        self.ended: Ended | None = None
        self.status = ""  # the gateway's status when it ended the call ("" = OK)
        self.end: CallEnd | None = None  # how the gateway ended the call, if not OK
        self._channel = channel
        self._settings = settings
        self._leg = leg
        self._to_gateway: asyncio.Queue[_ToGateway] = asyncio.Queue(CALLER_QUEUE_PACKETS)
        self._functions = functions
        self._running: set[asyncio.Task[None]] = set()  # function calls under way
        self._keys = KeyRate(settings.dtmf_rate_per_s, settings.dtmf_burst)
        self._keys_dropped = 0  # keys over the rate limit
        self._hung_up = asyncio.Event()  # either side hung up (not the gateway)
        self._gateway_error = ""
        self._dropped = 0  # caller packets dropped (the gateway took them too slowly)
        self.playout = Playout(
            codec, leg.send_audio, settings.prebuffer_ms, settings.max_queued_ms, info.provider
        )
        self.dtmf_echoed: list[str] = []  # digits the gateway acknowledged
        self.agent_keys_sent = 0  # keys the agent pressed on this call (call_control.py)
        self.barge_ins = 0
        # What the gateway reported of each turn (its TurnSummary: latencies at the
        # gateway), for whoever measures the call (kame_cli/bench/sip_load.py).
        self.turns: list[Turn] = []

    @property
    def leg(self) -> PhoneLeg:
        """The phone's side, as its protocol speaks it (call control acts on it)."""
        return self._leg

    # ---- from the phone --------------------------------------------------------

    def caller_audio(self, payload: bytes) -> None:
        """Caller audio in the call's codec, any size; never blocks."""
        if self._hung_up.is_set() or not payload:
            return
        self._enqueue(gateway_pb2.ConverseRequest(audio=payload))

    def _enqueue(self, item: _ToGateway) -> None:
        """Queue `item` for the gateway; a full queue drops its oldest caller
        packet or key first (a result or the hang-up is kept, moved behind)."""
        queue = self._to_gateway
        for _ in range(queue.maxsize):
            if not queue.full():
                break
            oldest = queue.get_nowait()
            if isinstance(oldest, gateway_pb2.ConverseRequest):
                self._dropped_one()
            else:
                queue.put_nowait(oldest)
        if queue.full():  # nothing but results queued: the gateway has stalled
            self._dropped_one()
            return
        queue.put_nowait(item)

    def _dropped_one(self) -> None:
        metrics.DROPPED_CALLER_PACKETS.labels(self.info.provider).inc()
        if not self._dropped:
            log.warning(
                "%s call %s: the gateway takes caller audio too slowly: dropping the oldest",
                self.info.provider,
                self.info.provider_call_id,
            )
        self._dropped += 1

    def caller_dtmf(self, digit: str, duration_ms: int = 0) -> None:
        if self._hung_up.is_set():
            return
        if digit.upper() not in DTMF_KEYS:  # the gateway would end the call over it
            info = self.info
            log.warning(
                "%s call %s: %r is not a key: dropped", info.provider, info.provider_call_id, digit
            )
            return
        if not self._keys.allow():
            self._key_dropped()
            return
        metrics.DTMF_DIGITS.labels(self.info.provider).inc()
        dtmf = common_pb2.Dtmf(digit=digit.upper(), duration_ms=duration_ms)
        self._enqueue(gateway_pb2.ConverseRequest(dtmf=dtmf))

    def _key_dropped(self) -> None:
        metrics.DROPPED_DTMF.labels(self.info.provider).inc()
        if not self._keys_dropped:
            info = self.info
            log.warning(
                "%s call %s: more than %g keys a second: dropping keys",
                info.provider,
                info.provider_call_id,
                self._keys.rate_per_s,
            )
        self._keys_dropped += 1

    def caller_hung_up(self) -> None:
        """The phone hung up (BYE, a stop message, a hang-up packet, a closed socket)."""
        self._end(Ended.CALLER_HUNG_UP, "")

    def hang_up(self, reason: str) -> None:
        """Our side ends the call (the service is stopping): the phone is told."""
        self._end(Ended.AGENT_HUNG_UP, reason)

    def _end(self, how: Ended, reason: str) -> None:
        if self._hung_up.is_set():
            return
        self.ended, self.status = how, reason
        self._hung_up.set()
        self._enqueue(HalfClose())
        # The end cancels the agent's actions under way (a transfer's wait, keys),
        # not the one ending the call (it is this task), whose result still goes out.
        for task in self._running - {asyncio.current_task()}:
            task.cancel()

    # ---- the call ----------------------------------------------------------------

    async def run(self) -> Ended:
        """The call from Converse's config to either side's hang-up."""
        metrics.ACTIVE_CALLS.labels(self.info.provider).inc()
        client = ConverseClient(self._channel, self._settings.auth_token, wait_for_ready=True)
        start_timer = asyncio.get_running_loop().call_later(
            self._settings.start_timeout_s, self._start_timed_out, client
        )
        uplink = asyncio.ensure_future(self._uplink(client))
        downlink = asyncio.ensure_future(self._downlink(client))
        playout = asyncio.ensure_future(self.playout.run())
        hung_up = asyncio.ensure_future(self._hung_up.wait())
        try:
            await asyncio.wait([downlink, hung_up], return_when=asyncio.FIRST_COMPLETED)
            if self._hung_up.is_set():
                # The uplink half-closes: the gateway ends the session as finished (its
                # record says so), unless it takes longer than the grace.
                await cancel_and_wait(playout)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(downlink), HANG_UP_GRACE_S)
            else:
                self.ended = Ended.GATEWAY_ERROR if self._gateway_error else Ended.AGENT_HUNG_UP
                self.status = self._gateway_error
        finally:
            start_timer.cancel()
            await cancel_and_wait([uplink, downlink, playout, hung_up, *self._running])
            client.cancel()
            metrics.ACTIVE_CALLS.labels(self.info.provider).dec()
        assert self.ended is not None
        if self.ended is not Ended.CALLER_HUNG_UP:
            why = f"the agent's side ended the call ({self.status or 'OK'})"
            with contextlib.suppress(Exception):  # the phone may be gone already
                await self._leg.hang_up(why)
        metrics.CALLS.labels(self.info.provider, self.ended.value).inc()
        log.info(
            "%s call %s (session %s) ended: %s %s",
            self.info.provider,
            self.info.provider_call_id,
            self.session_id,
            self.ended.value,
            self.status,
        )
        return self.ended

    def _start_timed_out(self, client: ConverseClient) -> None:
        if not self.started.is_set():
            timeout_s = self._settings.start_timeout_s
            self._gateway_error = f"no session from the gateway within {timeout_s:g} s"
            client.cancel()

    def config(self) -> gateway_pb2.ConverseConfig:
        audio = gateway_pb2.AudioFormat(
            codec=self.codec.gateway_codec,  # type: ignore[arg-type]
            sample_rate_hz=self.codec.sample_rate_hz,
        )
        return gateway_pb2.ConverseConfig(
            mode=self._settings.mode,
            input_format=audio,
            output_format=audio,
            call=self.info.to_proto(),
            functions=self._functions.declared if self._functions else [],
        )

    async def _uplink(self, client: ConverseClient) -> None:
        """Config, then what the phone sends once the session started (or the phone
        hung up), until a hang-up half-closes. A write to a call that has ended
        fails: the downlink has its status."""
        if not await client.start(self.config()):
            return
        await client.wait_started(self._hung_up)
        while not isinstance(item := await self._to_gateway.get(), HalfClose):
            if not await self._send(client, item):
                return
        await self._send_last_results(client)
        await client.done_writing()

    async def _send(self, client: ConverseClient, item: _ToGateway) -> bool:
        if isinstance(item, gateway_pb2.ConverseRequest):
            return await client.send(item)
        return await client.perform(item)

    async def _send_last_results(self, client: ConverseClient) -> None:
        """After a hang-up: the result of the function that ended the call, once
        in (the others were cancelled), before the half-close."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=LAST_RESULTS_S)
        while not self._to_gateway.empty():
            item = self._to_gateway.get_nowait()
            if isinstance(item, SendFunctionResult) and not await self._send(client, item):
                return

    async def _downlink(self, client: ConverseClient) -> None:
        """The gateway's events until it ends the call; a failure is kept in
        `_gateway_error` (not one that follows our own hang-up)."""
        try:
            async for event in client.events():
                await self._on_event(event)
        except grpc.aio.AioRpcError as exc:
            if self._hung_up.is_set() or self._gateway_error:
                return  # our own hang-up, or the start timed out
            self.end = end = CallEnd.of(exc)
            self._gateway_error = end.summary()
            retry = "" if end.retry_after_s is None else f" (retry after {end.retry_after_s:g} s)"
            log.warning(
                "%s call %s: gateway: %s%s",
                self.info.provider,
                self.info.provider_call_id,
                self._gateway_error,
                retry,
            )

    async def _on_event(self, event: ConverseEvent) -> None:
        match event:
            case AgentAudio(data=data, speaking=speaking):
                self.playout.push(data, speaking)
            case BargeIn():
                self.barge_ins += 1
                self.playout.flush()
                metrics.BARGE_INS.labels(self.info.provider).inc()
                await self._leg.clear()
            case Started(session_id=session_id):  # never resumed: a phone call sends no token
                self.session_id = session_id
                self.started.set()
            case Dtmf(digit=digit):
                self.dtmf_echoed.append(digit)
            case Turn():
                self.turns.append(event)
            case FunctionCall():
                self._start_function(event)
            case Notice(kind=kind, message=notice):
                info = self.info
                log.info("%s call %s: %s: %s", info.provider, info.provider_call_id, kind, notice)

    # ---- the agent's functions ---------------------------------------------------

    def _start_function(self, event: FunctionCall) -> None:
        """Run the call as a task of its own: the call goes on meanwhile."""
        if self._hung_up.is_set():
            return  # the call is over: nothing to act on, nobody to answer
        task = asyncio.ensure_future(self._run_function(event))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run_function(self, event: FunctionCall) -> None:
        name, call_id = event.name, event.call_id
        answered = False

        def answer(output: str, is_error: bool) -> None:
            nonlocal answered
            if not answered:
                answered = True
                self._enqueue(SendFunctionResult(call_id, output, is_error))

        if self._functions is None:
            answer(f"no function {name!r} on this call (offered: none)", True)
            return
        try:
            await self._functions.run(self, name, event.arguments_json, answer)
        except Exception:  # a bug here must not leave the model waiting for its timeout
            log.exception(
                "%s call %s: function %s", self.info.provider, self.info.provider_call_id, name
            )
            answer(f"{name} failed", True)
