"""gRPC glue of the frontend: `Frontend.Stream`, capacity publishing, `serve` and `main`.

Per stream: a FrontendConfig first, then caller AudioFrames, OracleUpdates,
the caller's TranscriptEvents, TurnControls and typed messages in any order
(all but the frames go to the engine session as they arrive). Out:
FrontendReady once, then for every caller frame exactly one AgentAudio (its
seq and capture time copied, `step_s` = engine time, `received_time_us` =
when the frame arrived), followed by a TurnEnd if the engine's turn detector
ended the caller's turn on that frame, a BargeIn if caller speech or a
request of the caller's (`cancelled`) cut the agent,
and an AgentText for each word that starts in that frame. When the caller's
input ends (the client half-closes), an AgentText for each word the engine
still held back (the last word of a kame/moshi session), then the stream ends.

Capacity: the engine's free slots go to the Redis capacity registry (a
heartbeat, plus a publish whenever a session opens or closes), signed with
`registry_secret`, and to the gauge kame_frontend_free_slots. The gateway
picks replicas from the registry. If Redis is down the replica keeps serving
and the heartbeat keeps trying; on drain or stop the replica withdraws first
so the gateway stops choosing it.

Health: SERVING once the engine is loaded; NOT_SERVING while an engine step
has waited longer than engine_stall_s (watchdog.py), and from the drain on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from kame_common import tracing
from kame_common.aio import cancel_and_wait
from kame_common.audio import SAMPLE_RATE, check_frame, float_to_pcm16, pcm16_to_float
from kame_common.capacity import CapacityPublisher
from kame_common.hold import (
    DEFAULT_HOLD_MAX_S,
    check_hold_delay_s,
    check_hold_max_s,
    hold_phrases,
)
from kame_common.server import ServiceRuntime, service_main
from kame_common.streams import aborting, dispatch, read_config
from kame_common.words import normalize_words
from kamepb import common_pb2, frontend_pb2, frontend_pb2_grpc
from services.frontend import metrics
from services.frontend.config import ENGINES, FrontendSettings
from services.frontend.engines import build_engine
from services.frontend.engines.base import (
    CandidateSource,
    Engine,
    EngineSession,
    InvalidSessionConfig,
    SessionParams,
    SlotsExhausted,
    SpokenWord,
    Transcript,
)
from services.frontend.watchdog import EngineWatchdog

log = logging.getLogger(__name__)

GRPC_SERVICE = frontend_pb2.DESCRIPTOR.services_by_name["Frontend"].full_name
MAX_TURN_END_SILENCE_S = 5.0
# Caller frames a stream reads ahead of their answers (6.4 s of audio): enough for
# an engine's jitter buffer to see any backlog the gateway admits (its input
# burst, 2 s); past it the stream stops reading until answers are sent.
READ_AHEAD_FRAMES = 80


class FrontendServicer(frontend_pb2_grpc.FrontendServicer):
    def __init__(
        self,
        runtime: ServiceRuntime,
        engine: Engine,
        capacity: CapacityPublisher,
        watchdog: EngineWatchdog,
    ) -> None:
        self._runtime = runtime
        self._engine = engine
        self._capacity = capacity
        self._watchdog = watchdog

    async def Stream(  # noqa: N802 (gRPC method name)
        self,
        request_iterator: AsyncIterator[frontend_pb2.FrontendRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[frontend_pb2.FrontendResponse]:
        async with self._runtime.session(context):
            async with aborting(context):
                first = await read_config(request_iterator, "FrontendConfig")
            params = await self._session_params(first.config, context)
            session = await self._open_session(params, context)
            span = tracing.tracer(__name__).start_span(
                "frontend.session",
                attributes={"session.id": params.session_id, "engine": self._engine.name},
            )
            steps: asyncio.Queue[asyncio.Task[list[frontend_pb2.FrontendResponse]] | None]
            steps = asyncio.Queue()
            read_ahead = asyncio.Semaphore(READ_AHEAD_FRAMES)
            reader = asyncio.create_task(
                self._read_requests(request_iterator, session, context, steps, read_ahead)
            )
            try:
                yield frontend_pb2.FrontendResponse(
                    ready=frontend_pb2.FrontendReady(
                        engine=self._engine.name,
                        replica_id=self._capacity.replica_id,
                        slot=session.slot,
                    )
                )
                while (step := await steps.get()) is not None:
                    for response in await step:
                        yield response
                    read_ahead.release()
                await reader  # a bad message's abort ends the stream here
                for word in session.flush_words():
                    yield agent_text(word)
            finally:
                # The slot is given back however the teardown ends: a cancellation
                # that lands while the reader and steps are cancelled (the caller
                # hung up) must not skip it, or the replica loses a slot for good.
                try:
                    queued = [steps.get_nowait() for _ in range(steps.qsize())]
                    await cancel_and_wait([reader, *(task for task in queued if task is not None)])
                finally:
                    span.end()
                    await asyncio.shield(session.close())
                    self._capacity.changed()

    async def _read_requests(
        self,
        request_iterator: AsyncIterator[frontend_pb2.FrontendRequest],
        session: EngineSession,
        context: grpc.aio.ServicerContext[Any, Any],
        steps: asyncio.Queue[asyncio.Task[list[frontend_pb2.FrontendResponse]] | None],
        read_ahead: asyncio.Semaphore,
    ) -> None:
        """Hand the caller's messages to the session as they arrive; each frame's step
        goes in `steps`, in order, for Stream to answer (None: the input ended).

        Frames are read ahead of their answers, so that a batched engine's jitter
        buffer sees a caller's backlog (and cuts it) instead of gRPC holding it."""

        async def audio(request: frontend_pb2.FrontendRequest) -> None:
            await self._check_audio(request.audio, context)
            await read_ahead.acquire()  # released once the frame's answer is sent
            steps.put_nowait(asyncio.create_task(self._step(session, request.audio)))
            # Let the step start (an engine takes frames in the order steps
            # start) before a later message reaches the session.
            await asyncio.sleep(0)

        try:
            async with aborting(context):
                await dispatch(
                    request_iterator,
                    {
                        "audio": audio,
                        "oracle": lambda r: self._apply_oracle(session, r.oracle, context),
                        "user_transcript": lambda r: session.user_transcript(
                            transcript_of(r.user_transcript)
                        ),
                        "turn_control": lambda r: self._apply_turn_control(
                            session, r.turn_control, context
                        ),
                        "user_text": lambda r: session.user_text(transcript_of(r.user_text)),
                    },
                )
        finally:
            steps.put_nowait(None)

    async def _session_params(
        self, config: frontend_pb2.FrontendConfig, context: grpc.aio.ServicerContext[Any, Any]
    ) -> SessionParams:
        served = self._engine.name
        if config.engine and config.engine not in ENGINES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown engine {config.engine!r}; choose one of {', '.join(ENGINES)}",
            )
        if config.engine and config.engine != served:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"this replica serves engine {served!r}, not {config.engine!r}",
            )
        if not 0 <= config.turn_end_silence_s <= MAX_TURN_END_SILENCE_S:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "turn_end_silence_s must be 0 (the replica's turn-taking) to "
                f"{MAX_TURN_END_SILENCE_S} seconds, got {config.turn_end_silence_s}",
            )
        try:  # the gateway checked them too; any client may open a stream
            phrases = hold_phrases(config.hold_phrases)
            max_s = check_hold_max_s(config.hold_max_s)
            delay_s = check_hold_delay_s(config.hold_delay_s)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return SessionParams(
            session_id=config.session_id,
            voice=config.voice,
            turn_end_silence_s=config.turn_end_silence_s,  # 0: the replica's turn-taking
            hold_phrases=phrases,
            hold_max_s=max_s or DEFAULT_HOLD_MAX_S,
            hold_delay_s=delay_s,
            manual_turns=config.manual_turns,
        )

    async def _open_session(
        self, params: SessionParams, context: grpc.aio.ServicerContext[Any, Any]
    ) -> EngineSession:
        try:
            session = await self._engine.open_session(params)
        except SlotsExhausted as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except InvalidSessionConfig as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._capacity.changed()
        return session

    @staticmethod
    async def _check_audio(
        frame: common_pb2.AudioFrame, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        try:
            check_frame(frame.pcm, frame.sample_rate_hz)
        except ValueError as exc:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"audio frame seq {frame.seq}: {exc}"
            )

    async def _step(
        self, session: EngineSession, frame: common_pb2.AudioFrame
    ) -> list[frontend_pb2.FrontendResponse]:
        received_time_us = time.time_ns() // 1000
        started = time.perf_counter()
        with self._watchdog.step():
            output = await session.step(pcm16_to_float(frame.pcm))
        step_s = time.perf_counter() - started
        metrics.STEP_SECONDS.labels(engine=self._engine.name).observe(step_s)
        agent_frame = common_pb2.AudioFrame(
            pcm=float_to_pcm16(output.pcm),
            sample_rate_hz=SAMPLE_RATE,
            seq=frame.seq,
            capture_time_us=frame.capture_time_us,
        )
        responses = [
            frontend_pb2.FrontendResponse(
                audio=frontend_pb2.AgentAudio(
                    frame=agent_frame,
                    speaking=output.speaking,
                    held=output.held,
                    step_s=step_s,
                    received_time_us=received_time_us,
                )
            )
        ]
        if output.turn_end_s is not None:
            turn_end = frontend_pb2.TurnEnd(speech_end_s=output.turn_end_s, seq=frame.seq)
            responses.append(frontend_pb2.FrontendResponse(turn_end=turn_end))
        if output.barged_in:
            barge_in = common_pb2.BargeIn(seq=frame.seq, cancelled=output.cancelled)
            responses.append(frontend_pb2.FrontendResponse(barge_in=barge_in))
        responses += [agent_text(word) for word in output.words]
        return responses

    @staticmethod
    async def _apply_turn_control(
        session: EngineSession,
        control: common_pb2.TurnControl,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        action = common_pb2.TurnControl
        if control.action == action.END_TURN:
            session.end_turn()
        elif control.action == action.RESPOND:
            session.respond()
        elif control.action == action.CANCEL:
            session.cancel()
        else:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"turn_control action must be END_TURN, RESPOND or CANCEL, got {control.action}",
            )

    async def _apply_oracle(
        self,
        session: EngineSession,
        update: common_pb2.OracleUpdate,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        if update.op == common_pb2.OracleUpdate.RESET:
            source = None
            if update.HasField("source"):
                source = CandidateSource(
                    update.source.utterance_id, update.source.text, update.source.is_final
                )
            session.oracle_reset(update.generation, update.text, source)
        elif update.op == common_pb2.OracleUpdate.APPEND:
            session.oracle_append(update.generation, update.text)
        else:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"oracle update op must be RESET or APPEND, got {update.op}",
            )


def agent_text(word: SpokenWord) -> frontend_pb2.FrontendResponse:
    return frontend_pb2.FrontendResponse(
        text=common_pb2.AgentText(
            text=word.text,
            start_s=word.start_s,
            end_s=word.end_s,
            generation=word.generation,
            filler=word.filler,
        )
    )


def transcript_of(event: common_pb2.TranscriptEvent) -> Transcript:
    settled = event.is_final or (
        bool(normalize_words(event.text))
        and normalize_words(event.stable_text) == normalize_words(event.text)
    )
    return Transcript(event.utterance_id, event.text, event.is_final, event.span.end_s, settled)


async def serve(settings: FrontendSettings) -> ServiceRuntime:
    """Load the engine, start serving on settings.host:port, and publish capacity."""
    runtime = ServiceRuntime(settings, [GRPC_SERVICE])
    engine = await asyncio.to_thread(build_engine, settings)
    runtime.on_close(engine.close)
    capacity = CapacityPublisher(
        "frontend",
        settings.redis_url,
        settings.resolved_replica_id(),
        engine,
        settings.registry_secret,
        settings.redis_timeout_s,
    )
    runtime.on_drain(capacity.close)  # first, so the gateway stops sending new sessions
    watchdog = EngineWatchdog(runtime, settings.engine_stall_s)
    servicer = FrontendServicer(runtime, engine, capacity, watchdog)
    try:
        await runtime.start(
            lambda server: frontend_pb2_grpc.add_FrontendServicer_to_server(servicer, server)
        )
    except BaseException:
        await runtime.stop()
        raise
    capacity.start(settings.resolved_advertise_address(runtime.port))
    watchdog.start()
    metrics.FREE_SLOTS.set_function(lambda: engine.free_slots)
    log.info(
        "frontend engine %s with %d slots, replica %s",
        engine.name,
        engine.total_slots,
        capacity.replica_id,
    )
    return runtime


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(FrontendSettings, serve, argv)
