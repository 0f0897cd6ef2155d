"""gRPC glue of the STT service: `Stt.Transcribe`, `serve` and `main`.

Per stream: an SttConfig first, then 80 ms AudioFrames, and an EndOfTurn
whenever the front-end's turn detector ends the caller's turn (the open
utterance is finalized at once); the client half-closing its side finalizes
the open utterance and ends the stream once every final is out. Out:
SpeechActivity and TranscriptEvents (see session.py).
A bad config or frame ends the stream with INVALID_ARGUMENT saying what was
expected; a failed final decode with INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import grpc

from kame_common import tracing
from kame_common.aio import cancel_and_wait
from kame_common.audio import check_frame
from kame_common.capacity import publish_measured_capacity
from kame_common.server import ServiceRuntime, service_main
from kame_common.streams import StreamError, aborting, dispatch, read_config
from kamepb import stt_pb2, stt_pb2_grpc
from services.stt.config import StreamSettings, SttSettings, stream_settings
from services.stt.engine import SttEngine
from services.stt.session import SessionFailed, SttSession

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

GRPC_SERVICE = stt_pb2.DESCRIPTOR.services_by_name["Stt"].full_name


class InvalidRequest(StreamError):
    """The client sent something the protocol does not allow (-> INVALID_ARGUMENT)."""

    def __init__(self, message: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, message)


class SttServicer(stt_pb2_grpc.SttServicer):
    def __init__(self, engine: SttEngine, runtime: ServiceRuntime) -> None:
        self.engine = engine
        self.runtime = runtime

    async def Transcribe(  # noqa: N802 - the gRPC method name
        self,
        request_iterator: AsyncIterator[stt_pb2.TranscribeRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[stt_pb2.TranscribeResponse]:
        async with self.runtime.session(context):
            async with aborting(context):
                first = await read_config(request_iterator, "SttConfig")
                settings = self._stream_settings(first.config)
            with _tracer.start_as_current_span(
                "stt.session", attributes={"session.id": settings.session_id}
            ):
                session = SttSession(self.engine, settings)
                reader = asyncio.create_task(self._read_audio(request_iterator, session))
                try:
                    async with aborting(context):
                        async for response in session.events():
                            yield response
                        await reader
                except SessionFailed as exc:
                    await context.abort(grpc.StatusCode.INTERNAL, str(exc))
                finally:
                    await cancel_and_wait(reader)
                    await session.aclose()

    def _stream_settings(self, config: stt_pb2.SttConfig) -> StreamSettings:
        try:
            self.engine.check_model(config.model)
            settings = stream_settings(
                config.session_id,
                config.language,
                {
                    "partial_interval_s": config.partial_interval_s,
                    "endpoint_silence_s": config.endpoint_silence_s,
                    "max_utterance_s": config.max_utterance_s,
                    "vad_threshold": config.vad_threshold,
                },
                self.engine.settings,
                config.progress_interval_s,
            )
            self.engine.check_language(settings.language)
        except ValueError as exc:
            raise InvalidRequest(f"bad SttConfig: {exc}") from None
        return settings

    async def _read_audio(
        self, request_iterator: AsyncIterator[stt_pb2.TranscribeRequest], session: SttSession
    ) -> None:
        """Feed the session until the client half-closes. A bad message ends the stream:
        the error goes to the response side, which aborts the call with it."""
        try:
            await dispatch(
                request_iterator,
                {
                    "audio": partial(self._push_audio, session),
                    "end_of_turn": lambda r: session.end_turn(_speech_end_s(r.end_of_turn)),
                },
            )
            await session.finish()
        except StreamError as exc:
            session.fail(exc)
        except Exception as exc:  # a bug: end the stream rather than leave it hanging
            log.exception("stt stream %s failed", session.settings.session_id)
            session.fail(SessionFailed(f"internal error: {exc}"))

    @staticmethod
    async def _push_audio(session: SttSession, request: stt_pb2.TranscribeRequest) -> None:
        received_at = time.monotonic()
        try:
            check_frame(request.audio.pcm, request.audio.sample_rate_hz)
        except ValueError as exc:
            raise InvalidRequest(f"audio frame seq {request.audio.seq}: {exc}") from None
        await session.push_frame(request.audio.pcm, received_at)


def _speech_end_s(end_of_turn: stt_pb2.EndOfTurn) -> float:
    value = end_of_turn.speech_end_s
    if not math.isfinite(value) or value < 0:
        raise InvalidRequest(
            f"end_of_turn.speech_end_s must be seconds into the stream (>= 0), got {value}"
        )
    return value


async def serve(settings: SttSettings, engine: SttEngine | None = None) -> ServiceRuntime:
    """Start the service, loading the models unless an engine is given (the caller
    then owns it); returns the running runtime, `runtime.port` being the bound port."""
    # faster-whisper logs every decode at INFO: twice a second per caller.
    logging.getLogger("faster_whisper").setLevel(logging.WARNING)
    runtime = ServiceRuntime(settings, [GRPC_SERVICE])
    if engine is None:
        engine = await asyncio.to_thread(SttEngine, settings)
        runtime.on_close(partial(asyncio.to_thread, engine.close))
    servicer = SttServicer(engine, runtime)
    start_publishing = publish_measured_capacity(
        runtime, settings, engine.load, engine.prior_session_load
    )
    await runtime.start(lambda server: stt_pb2_grpc.add_SttServicer_to_server(servicer, server))
    start_publishing()
    log.info("stt serving %s on %s", engine.model_dir, runtime.address)
    return runtime


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(SttSettings, serve, argv)
