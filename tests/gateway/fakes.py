"""Scriptable stand-ins for the frontend, stt and oracle services, served by real
gRPC servers on loopback, so a gateway session can be tested alone, with no
models, in milliseconds. Each records what it received and how its stream ended."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from kame_common.answer_time import AnswerTimes
from kame_common.llm import BUDGET_SPENT_METADATA
from kame_common.server import ServiceRuntime
from kamepb import (
    common_pb2,
    frontend_pb2,
    frontend_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    oracle_pb2,
    oracle_pb2_grpc,
    stt_pb2,
    stt_pb2_grpc,
)
from services.gateway.config import GatewaySettings
from services.gateway.server import serve as serve_gateway
from tests.support import session_record

Activity = common_pb2.SpeechActivity


@dataclass
class StreamLog:
    """What one fake saw of its streams."""

    requests: list[object] = field(default_factory=list)
    opened: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: str = ""  # "finished" (the RPC ended normally) or "cancelled" (by the gateway)
    # How long the handler waits, after the last request, for a cancellation to
    # show: every normally ending stream pays it, so it is short unless a test
    # looks at the outcome (expect_normal_end, expect_cancellation).
    cancel_wait_s: float = 0.02
    _cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def of(self, kind: str) -> list:
        return [getattr(r, kind) for r in self.requests if r.WhichOneof("msg") == kind]

    def expect_normal_end(self) -> None:
        """A test that asserts this stream ended normally: its handler takes 0.2 s
        to end after the last request, so a gateway that cancels the stream
        instead of letting it end is seen doing so (grpc.aio shows a cancellation
        to the handler only, and only while it still runs)."""
        self.cancel_wait_s = 0.2

    def expect_cancellation(self) -> None:
        """A test that expects the gateway to cancel this stream: wait up to 5 s for
        it. A loaded machine can delay the cancellation past the short default,
        which every normally ending stream pays, so only such tests wait longer
        (a cancellation ends the wait at once)."""
        self.cancel_wait_s = 5.0

    def mark_cancelled(self) -> None:
        self.outcome = "cancelled"
        self._cancelled.set()

    async def cancelled(self, timeout_s: float) -> None:
        """Until the handler has seen its stream cancelled (the RPC's end can be
        reported a moment before the handler is cancelled); AssertionError if not."""
        try:
            await asyncio.wait_for(self._cancelled.wait(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"the stream was not cancelled ({self.outcome})") from None

    def watch(self, context: grpc.aio.ServicerContext) -> None:
        self.opened += 1
        if not self.outcome:
            self.outcome = "finished"  # unless the handler is cancelled (see _log_requests)
        context.add_done_callback(lambda _: self.ended.set())


async def _log_requests(requests: AsyncIterator, log: StreamLog) -> AsyncIterator:
    """The requests, recorded. A cancelled RPC also just ends the request iterator
    (grpc.aio), then cancels the handler at its next await: the pause after the
    last request is where a cancellation shows."""
    async for request in requests:
        log.requests.append(request)
        yield request
    await _pause_for_cancellation(log)


async def _pause_for_cancellation(log: StreamLog) -> None:
    try:
        # grpc.aio tells a client's half-close from its cancellation only by
        # cancelling the handler a moment after the request stream ends.
        await asyncio.sleep(log.cancel_wait_s)
    except asyncio.CancelledError:
        log.mark_cancelled()
        raise


Handler = Callable[[Any, AsyncIterator, grpc.aio.ServicerContext], AsyncIterator]


def _marks_cancellation(handler: Handler) -> Handler:
    """A fake's handler that records its stream's cancellation wherever it hits:
    during the pause after the last request (see _log_requests), while it waits
    for a request, or while grpc.aio sends one of its responses (the handler is
    then closed where it yielded it)."""

    @functools.wraps(handler)
    async def handle(fake: Any, requests: AsyncIterator, context: grpc.aio.ServicerContext):
        try:
            async for response in handler(fake, requests, context):
                yield response
        except (asyncio.CancelledError, GeneratorExit):
            fake.log.mark_cancelled()
            raise

    return handle


class FakeFrontend(frontend_pb2_grpc.FrontendServicer):
    """One agent frame per caller frame. `speak_at`: frames from this seq on are
    speaking; `held`: frames silent and `held` (the agent paused while the
    caller speaks over it); `words`: {seq: (text, generation)} agent words
    starting in that frame; `turn_end_at`: a TurnEnd after that frame;
    `barge_in_at`: a BargeIn after that frame; `fail_at`/`end_at`: abort
    UNAVAILABLE / end the stream at that frame; `mute_at`: answer no frame from
    that one on, and end normally once the input ends; `refuse`: abort at the config;
    `silent_start`: never send ready; `engine`: the engine its ready names."""

    def __init__(self) -> None:
        self.log = StreamLog()
        self.speak_at: int | None = None
        self.held = range(0)
        self.words: dict[int, tuple[str, int]] = {}
        self.turn_end_at: int | None = None
        self.barge_in_at: int | None = None
        self.fail_at: int | None = None
        self.end_at: int | None = None
        self.mute_at: int | None = None
        self.refuse: grpc.StatusCode | None = None
        self.silent_start = False
        self.engine = "fake"  # what its FrontendReady says it is

    @_marks_cancellation
    async def Stream(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        self.log.watch(context)
        requests = _log_requests(request_iterator, self.log)
        first = await anext(requests)
        assert first.WhichOneof("msg") == "config"
        if self.refuse == grpc.StatusCode.INVALID_ARGUMENT:
            await context.abort(self.refuse, "voice 'x' is not served here")
        if self.refuse is not None:
            await context.abort(self.refuse, "refused by the fake frontend at 10.9.8.7:50052")
        if self.silent_start:
            await asyncio.Event().wait()
        yield frontend_pb2.FrontendResponse(
            ready=frontend_pb2.FrontendReady(engine=self.engine, replica_id="fake-1", slot=0)
        )
        async for request in requests:
            if request.WhichOneof("msg") != "audio":
                continue
            seq = request.audio.seq
            if seq == self.fail_at:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "engine crashed at 10.9.8.7")
            if seq == self.end_at:
                return
            if self.mute_at is not None and seq >= self.mute_at:
                continue
            held = seq in self.held
            speaking = self.speak_at is not None and seq >= self.speak_at and not held
            yield frontend_pb2.FrontendResponse(
                audio=frontend_pb2.AgentAudio(frame=request.audio, speaking=speaking, held=held)
            )
            if seq in self.words:
                text, generation = self.words[seq]
                start_s = seq * 0.08 + 0.02
                yield frontend_pb2.FrontendResponse(
                    text=common_pb2.AgentText(
                        text=text, start_s=start_s, end_s=start_s + 0.2, generation=generation
                    )
                )
            if seq == self.turn_end_at:
                yield frontend_pb2.FrontendResponse(
                    turn_end=frontend_pb2.TurnEnd(speech_end_s=seq * 0.08 - 0.4, seq=seq)
                )
            if seq == self.barge_in_at:
                yield frontend_pb2.FrontendResponse(barge_in=common_pb2.BargeIn(seq=seq))


class FakeStt(stt_pb2_grpc.SttServicer):
    """`script`: {seq: [responses]} sent after that audio frame arrives; on
    half-close it sends `on_close` and ends. With the config's
    progress_interval_s set, an SttProgress follows every frame. `fail_at`:
    abort at that frame (once). `hang`: while set, take frames and answer nothing (a
    stopped process). `stall`: never read past the config."""

    def __init__(self) -> None:
        self.log = StreamLog()
        self.script: dict[int, list[stt_pb2.TranscribeResponse]] = {}
        self.on_close: list[stt_pb2.TranscribeResponse] = []
        self.fail_at: int | None = None
        self.hang = False
        self.stall = False

    @_marks_cancellation
    async def Transcribe(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        self.log.watch(context)
        requests = _log_requests(request_iterator, self.log)
        first = await anext(requests)
        assert first.WhichOneof("msg") == "config"
        progress = first.config.progress_interval_s > 0
        if self.stall:
            await asyncio.Event().wait()
        async for request in requests:
            if request.WhichOneof("msg") != "audio" or self.hang:
                continue
            seq = request.audio.seq
            if seq == self.fail_at:
                self.fail_at = None  # once: a reopened stream hears this frame again
                await context.abort(grpc.StatusCode.INTERNAL, "stt broke at 10.9.8.7")
            for response in self.script.get(seq, []):
                yield response
            if progress:
                yield stt_pb2.TranscribeResponse(progress=stt_pb2.SttProgress(audio_s=seq * 0.08))
        for response in self.on_close:
            yield response


class FakeOracle(oracle_pb2_grpc.OracleServicer):
    """Answers every final transcript with a RESET carrying `answer`, and sends a
    HEARTBEAT as often as the config asks. `reject`: INVALID_ARGUMENT at the
    config; `fail_after_first`: the next stream aborts after its first
    transcript; `stall`: never read past the config (its queue fills
    up, and it sends nothing). `function_call`: before each answer, a
    ToolActivity STARTED and this call of a client function, with call_id
    call-1, call-2, ... in the order asked; a FunctionResult gets a
    ToolActivity FINISHED. `fail_after_call`: the next stream aborts after
    sending its call. `spent`: RESOURCE_EXHAUSTED with this message at the config,
    as the real oracle says a token budget is spent. A config with client_delegation
    gets a Delegation (delegation-1, delegation-2, ... in each stream) for each
    final instead of the RESET."""

    def __init__(self) -> None:
        self.log = StreamLog()
        self.answer = "Paris is the capital."
        self.reject = False
        self.fail_after_first = False
        self.stall = False
        self.function_call: common_pb2.FunctionCall | None = None
        self.fail_after_call = False
        self.spent = ""
        self.calls_asked = 0

    @_marks_cancellation
    async def Guide(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        self.log.watch(context)
        requests = _log_requests(request_iterator, self.log)
        first = await anext(requests)
        if self.reject:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model 'x' is not allowed")
        if self.spent:
            spent = (BUDGET_SPENT_METADATA,)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.spent, spent)
        if self.stall:
            await asyncio.Event().wait()
        outbox: asyncio.Queue[oracle_pb2.GuideResponse | str | None] = asyncio.Queue()
        delegating = first.config.client_delegation
        tasks = [asyncio.create_task(self._answer(requests, outbox, delegating))]
        if first.config.heartbeat_interval_s:
            tasks.append(asyncio.create_task(_beat(first.config.heartbeat_interval_s, outbox)))
        try:
            while (item := await outbox.get()) is not None:
                if isinstance(item, str):
                    await context.abort(grpc.StatusCode.INTERNAL, item)
                yield item
            await _pause_for_cancellation(self.log)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _answer(
        self, requests: AsyncIterator, outbox: asyncio.Queue, delegating: bool = False
    ) -> None:
        """RESETs for finals into `outbox`, then None at the end (a str: abort)."""
        generation = 0
        async for request in requests:
            if request.WhichOneof("msg") == "function_result":
                result = request.function_result
                name = self.function_call.name if self.function_call else ""
                outbox.put_nowait(_tool_activity(FINISHED, result.call_id, name, result.is_error))
            if request.WhichOneof("msg") != "user_transcript":
                continue
            if self.fail_after_first:
                self.fail_after_first = False
                outbox.put_nowait("oracle broke")
                return
            event = request.user_transcript
            if event.is_final and self.function_call is not None:
                self._ask(outbox)
                if self.fail_after_call:
                    self.fail_after_call = False
                    outbox.put_nowait("oracle broke after its call")
                    return
            if event.is_final:
                generation += 1
                source = common_pb2.CandidateSource(
                    utterance_id=event.utterance_id, is_final=True, text=event.text
                )
                if delegating:
                    delegation_id = f"delegation-{generation}"
                    delegation = common_pb2.Delegation(delegation_id=delegation_id, source=source)
                    outbox.put_nowait(oracle_pb2.GuideResponse(delegation=delegation))
                    continue
                outbox.put_nowait(
                    oracle_pb2.GuideResponse(
                        update=common_pb2.OracleUpdate(
                            op=common_pb2.OracleUpdate.RESET,
                            generation=generation,
                            text=self.answer,
                            source=source,
                        )
                    )
                )
        outbox.put_nowait(None)

    def _ask(self, outbox: asyncio.Queue) -> None:
        assert self.function_call is not None
        self.calls_asked += 1
        call = common_pb2.FunctionCall()
        call.CopyFrom(self.function_call)
        call.call_id = f"call-{self.calls_asked}"
        outbox.put_nowait(_tool_activity(STARTED, call.call_id, call.name))
        outbox.put_nowait(oracle_pb2.GuideResponse(function_call=call))


STARTED, FINISHED = common_pb2.ToolActivity.STARTED, common_pb2.ToolActivity.FINISHED


def _tool_activity(
    phase: int, call_id: str, name: str, is_error: bool = False
) -> oracle_pb2.GuideResponse:
    tool = common_pb2.ToolActivity(
        phase=phase, call_id=call_id, name=name, source="client", is_error=is_error
    )
    return oracle_pb2.GuideResponse(tool=tool)


async def _beat(interval_s: float, outbox: asyncio.Queue) -> None:
    while True:
        await asyncio.sleep(interval_s)
        event = oracle_pb2.OracleEvent(kind=oracle_pb2.OracleEvent.HEARTBEAT)
        outbox.put_nowait(oracle_pb2.GuideResponse(event=event))


def transcript(utterance: str, text: str, final: bool, end_s: float) -> stt_pb2.TranscribeResponse:
    return stt_pb2.TranscribeResponse(
        transcript=common_pb2.TranscriptEvent(
            utterance_id=utterance,
            is_final=final,
            text=text,
            span=common_pb2.AudioSpan(start_s=0.0, end_s=end_s),
        )
    )


def activity(kind: int, utterance: str, at_s: float) -> stt_pb2.TranscribeResponse:
    return stt_pb2.TranscribeResponse(
        activity=common_pb2.SpeechActivity(kind=kind, utterance_id=utterance, at_s=at_s)
    )


async def serve_fake(add: object, servicer: object) -> tuple[grpc.aio.Server, str]:
    # No BDP probing: the HTTP/2 window stays small, so a fake that stops reading
    # pushes back after a few frames, as a stopped process does. Pings as often as
    # a test's gateway sends them are welcome (our servers take keepalive_time_s / 2;
    # gRPC's default answers pings more often than every 5 min with GOAWAY).
    server = grpc.aio.server(
        options=[("grpc.http2.bdp_probe", 0), ("grpc.http2.max_ping_strikes", 0)]
    )
    add(servicer, server)  # type: ignore[operator]
    # Health SERVING, as a warmed-up service says: the gateway admits calls only then.
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@dataclass
class Fakes:
    """The three fakes on loopback, and real gateways in front of them."""

    frontend: FakeFrontend
    stt: FakeStt
    oracle: FakeOracle
    addresses: dict[str, str]
    redis_url: str
    servers: list[grpc.aio.Server] = field(default_factory=list)
    gateways: list[ServiceRuntime] = field(default_factory=list)

    async def gateway(
        self, answers: AnswerTimes | None = None, **overrides: object
    ) -> ServiceRuntime:
        fields: dict[str, object] = {
            "host": "127.0.0.1",
            "port": 0,
            "metrics_port": 0,
            "redis_url": self.redis_url,
            "frontend_address": self.addresses["frontend"],
            "stt_address": self.addresses["stt"],
            "oracle_address": self.addresses["oracle"],
            "connect_timeout_s": 2.0,
            "drain_timeout_s": 2.0,
            # Calls here run faster than real time; pacing is tested in test_edge.py.
            "input_burst_s": 0.0,
            # Its own secret: a frontend another test left in this Redis db's
            # registry (a real one, since stopped) is never chosen.
            "registry_secret": "registry-secret-of-the-fake-upstreams",
        }
        settings = GatewaySettings(**{**fields, **overrides})  # type: ignore[arg-type]
        runtime = await serve_gateway(settings, answers)
        self.gateways.append(runtime)
        return runtime

    async def session_record(self, session_id: str) -> dict[str, str]:
        """The gateway's Redis record of a session."""
        return await session_record(self.redis_url, session_id)

    async def stop(self) -> None:
        for runtime in self.gateways:
            await runtime.stop()
        for server in self.servers:
            await server.stop(grace=0)


async def start_fakes(redis_url: str) -> Fakes:
    """The fakes serving on loopback; gateways (`await fakes.gateway()`) use `redis_url`."""
    made = Fakes(FakeFrontend(), FakeStt(), FakeOracle(), {}, redis_url)
    for name, add, servicer in (
        ("frontend", frontend_pb2_grpc.add_FrontendServicer_to_server, made.frontend),
        ("stt", stt_pb2_grpc.add_SttServicer_to_server, made.stt),
        ("oracle", oracle_pb2_grpc.add_OracleServicer_to_server, made.oracle),
    ):
        server, made.addresses[name] = await serve_fake(add, servicer)
        made.servers.append(server)
    return made


def sync_converse(
    address: str,
    requests: Iterable[gateway_pb2.ConverseRequest],
    metadata: Sequence[tuple[str, str]] = (),
) -> tuple[grpc.StatusCode, str, list[gateway_pb2.ConverseResponse]]:
    """A whole call with the sync API: status, details and responses. Sync on
    purpose: a grpc.aio client that is still writing when the gateway ends the call
    may report INTERNAL 'Internal error from Core' instead of the gateway's status
    (grpc/grpc#36066); the sync API reports what the gateway sent."""
    responses: list[gateway_pb2.ConverseResponse] = []
    with grpc.insecure_channel(address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(iter(requests), metadata=metadata)
        with contextlib.suppress(grpc.RpcError):
            responses.extend(call)
        return call.code(), call.details() or "", responses
