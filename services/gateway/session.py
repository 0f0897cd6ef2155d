"""One Converse session: the pump between the caller and the three upstreams.

Per session the gateway opens one bidirectional stream to each of frontend,
stt and oracle (no oracle in s2s mode) and runs these tasks:

    caller ──► _read_caller ──► frontend queue ──► _write_upstream(frontend)
                     └────────► stt queue ───────► _write_upstream(stt)
    frontend ─► _read_frontend: AgentAudio ─► client codec ─► client queue
                                AgentText ──► client queue, oracle queue
    stt ──────► _read_stt: transcripts ─► client queue, oracle queue
                           SPEECH_START/END ─► turn tracker (response latency)
    oracle ───► _read_oracle: updates ─► frontend queue (and client queue if opted in)
    client queue ─► responses() ─► the caller (the servicer yields what it yields)

Every queue is bounded and producers await `put`, so a slow consumer pushes
back up to the caller's stream (gRPC flow control). Two exceptions keep the
agent's voice independent of the side streams: agent text for the oracle is
offered without waiting (dropped and counted if the oracle stalls), and
Redis writes go through their own queue.

Failures: the frontend is essential, so its failure ends the session with
UNAVAILABLE. stt and oracle are side streams: if one fails the session goes
on without oracle (stt failing takes the oracle with it: it has nothing left
to read) and the client gets Notice ORACLE_UNAVAILABLE. A teardown that runs
however the session ends (caller done, caller gone, error) cancels every
task and every upstream call, so the upstream services see their sessions end.

End of input: the caller half-closes -> the last frames go out and the
frontend and stt streams are half-closed -> the frontend answers the last
frame and ends -> stt finalizes its open utterance and ends -> the oracle is
half-closed (it writes the last agent turn to Redis) and ends -> done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from opentelemetry import trace
from redis.exceptions import RedisError

from kame_common import tracing
from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE, Framer, float_to_pcm16, pcm16_to_float
from kame_common.store import CapacityRegistry, SessionStore
from kamepb import (
    common_pb2,
    frontend_pb2,
    frontend_pb2_grpc,
    gateway_pb2,
    oracle_pb2,
    oracle_pb2_grpc,
    stt_pb2,
    stt_pb2_grpc,
)
from services.gateway import metrics
from services.gateway.codecs import AudioFormat, CodecError, Decoder, Encoder, resolve_format
from services.gateway.config import GatewaySettings
from services.gateway.turns import Turn, TurnTracker

log = logging.getLogger(__name__)
_tracer = tracing.tracer("kame.gateway")

Mode = gateway_pb2.ConverseConfig.Mode
MODE_NAMES = {Mode.TANDEM: "tandem", Mode.CASCADE: "cascade", Mode.S2S: "s2s"}
LLM_BACKENDS = ("", "openai", "anthropic")
SIDE_SERVICES = ("stt", "oracle")

_END = object()  # queue sentinel: no more items


class SessionError(Exception):
    """Ends the session with this gRPC status; the message says what went wrong."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _now_us() -> int:
    return time.time_ns() // 1000


def ns(wall: float) -> int:
    """Wall seconds -> OpenTelemetry nanoseconds."""
    return int(wall * 1e9)


@dataclass(frozen=True)
class SessionPlan:
    """A validated ConverseConfig."""

    mode: str
    input_format: AudioFormat
    output_format: AudioFormat
    voice: str
    language: str
    llm: gateway_pb2.LlmOverride | None
    include_oracle_updates: bool
    hold_phrases: tuple[str, ...]
    hold_max_s: float

    @property
    def uses_oracle(self) -> bool:
        return self.mode != "s2s"


def plan_session(config: gateway_pb2.ConverseConfig, settings: GatewaySettings) -> SessionPlan:
    """Check the client's config; raise SessionError naming the bad field."""
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    if config.mode == Mode.MODE_UNSPECIFIED:
        mode = settings.default_mode
    elif config.mode in MODE_NAMES:
        mode = MODE_NAMES[config.mode]
    else:
        raise SessionError(
            invalid, f"mode: unknown mode {config.mode}; choose TANDEM, CASCADE or S2S"
        )
    try:
        input_format = resolve_format(config.input_format, "input_format")
        output_format = resolve_format(config.output_format, "output_format")
    except CodecError as exc:
        raise SessionError(invalid, str(exc)) from None
    llm = config.llm if config.HasField("llm") else None
    if llm is not None and llm.backend not in LLM_BACKENDS:
        raise SessionError(
            invalid,
            f"llm.backend: unknown back-end {llm.backend!r}; choose 'openai' or 'anthropic'",
        )
    return SessionPlan(
        mode=mode,
        input_format=input_format,
        output_format=output_format,
        voice=config.voice,
        language=config.language or "en",
        llm=llm,
        include_oracle_updates=config.include_oracle_updates,
        hold_phrases=_hold_phrases(config.hold, mode, settings),
        hold_max_s=config.hold.max_s or settings.hold_max_s,
    )


def _hold_phrases(
    hold: gateway_pb2.HoldConfig, mode: str, settings: GatewaySettings
) -> tuple[str, ...]:
    """The client's phrases; else the gateway's defaults in tandem mode (the one
    that speculates), silence otherwise."""
    if hold.silent:
        return ()
    if hold.phrases:
        return tuple(p.strip() for p in hold.phrases if p.strip())
    if mode != "tandem":
        return ()
    return tuple(p.strip() for p in settings.hold_phrases.split("|") if p.strip())


class Upstreams:
    """What every session of one gateway shares: channels, Redis store and registry."""

    def __init__(self, settings: GatewaySettings, redis_client: Any) -> None:
        self.settings = settings
        self.store = SessionStore(redis_client, ttl_s=settings.session_ttl_s)
        self.registry = CapacityRegistry(redis_client, "frontend")
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = grpc.aio.insecure_channel(
                address, interceptors=tracing.client_interceptors()
            )
        return self._channels[address]

    async def frontend_candidates(self) -> list[str]:
        """The registry's replica with most free slots, then the static address."""
        try:
            replica = await asyncio.wait_for(self.registry.choose(), timeout=1.0)
        except (TimeoutError, RedisError, OSError) as exc:
            log.warning(
                "frontend registry unavailable (%s); using %s", exc, self.settings.frontend_address
            )
            replica = None
        addresses = [replica.address] if replica is not None else []
        if self.settings.frontend_address not in addresses:
            addresses.append(self.settings.frontend_address)
        return addresses

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


@dataclass
class _AgentAudioOut:
    """One agent frame, encoded, on its way to the client."""

    seq: int
    speaking: bool
    chunks: list[bytes]


class GatewaySession:
    def __init__(self, upstreams: Upstreams, plan: SessionPlan, session_id: str = "") -> None:
        self.up = upstreams
        self.settings = upstreams.settings
        self.plan = plan
        self.id = session_id or uuid.uuid4().hex
        size = self.settings.queue_frames
        self._frontend_q: asyncio.Queue = asyncio.Queue(size)
        self._stt_q: asyncio.Queue = asyncio.Queue(size)
        self._oracle_q: asyncio.Queue = asyncio.Queue(size * 4)
        self._client_q: asyncio.Queue = asyncio.Queue(size)
        self._store_q: asyncio.Queue = asyncio.Queue(256)
        self._calls: dict[str, grpc.aio.Call] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._alive = {"stt": False, "oracle": False}  # side streams still in the session
        self._input_closed = {"frontend": False, "stt": False, "oracle": False}
        self._abort: asyncio.Future = asyncio.get_running_loop().create_future()
        self._capture_us: list[int] = []  # capture time of every caller frame, by seq
        self._tracker = TurnTracker()
        self._speaking = False
        self._agent_words: list[tuple[float, str]] = []  # s2s: (wall, word) not yet logged
        self._encoder = Encoder(plan.output_format)
        self.frontend_address = ""
        self.ready = frontend_pb2.FrontendReady()
        self._span: trace.Span = _tracer.start_span(
            "session", attributes={"kame.session_id": self.id, "kame.mode": plan.mode}
        )

    # ---- public -------------------------------------------------------------

    async def responses(
        self, requests: AsyncIterator[gateway_pb2.ConverseRequest]
    ) -> AsyncIterator[gateway_pb2.ConverseResponse]:
        """The session's output to the caller, until the caller is done and every
        upstream has finished; raises SessionError for a status the caller
        should get. Closing the generator (the caller went away) tears down."""
        outcome = "cancelled"
        try:
            await self._open()
            yield gateway_pb2.ConverseResponse(
                started=gateway_pb2.SessionStarted(
                    session_id=self.id,
                    frontend_replica=self.frontend_address,
                    engine=self.ready.engine,
                )
            )
            self._start_pumps(requests)
            supervisor = self._tasks["supervisor"] = self._spawn("supervisor", self._supervise())
            while (item := await self._next_output(supervisor)) is not _END:
                for response in self._to_client(item):
                    yield response
            outcome = "ok"
        except SessionError as exc:
            outcome = exc.code.name
            self._span.set_status(trace.StatusCode.ERROR, exc.message)
            raise
        except Exception as exc:
            outcome = "INTERNAL"
            self._span.record_exception(exc)
            raise
        finally:
            await self._teardown(outcome)

    # ---- opening --------------------------------------------------------------

    async def _open(self) -> None:
        with trace.use_span(self._span, end_on_exit=False):
            await self._open_frontend()
            self._open_side("stt")
            if self.plan.uses_oracle:
                self._open_side("oracle")
        self._tasks["store"] = self._spawn("store", self._write_store())
        self._store(
            self.up.store.put_session,
            {
                "mode": self.plan.mode,
                "replica": self.frontend_address,
                "replica_id": self.ready.replica_id,
                "engine": self.ready.engine,
                "input_codec": self.plan.input_format.codec,
                "output_codec": self.plan.output_format.codec,
                "started_at": time.time(),
                "state": "active",
            },
        )

    def _frontend_config(self) -> frontend_pb2.FrontendRequest:
        return frontend_pb2.FrontendRequest(
            config=frontend_pb2.FrontendConfig(
                session_id=self.id,
                engine=self.settings.s2s_engine if self.plan.mode == "s2s" else "",
                voice=self.plan.voice,
                turn_end_silence_s=self.settings.turn_end_silence_s,
                hold_phrases=self.plan.hold_phrases,
                hold_max_s=self.plan.hold_max_s,
            )
        )

    async def _open_frontend(self) -> None:
        """Send the config to the chosen replica and wait for FrontendReady;
        on a refusal, try the next candidate."""
        error = SessionError(grpc.StatusCode.UNAVAILABLE, "no frontend address configured")
        for address in await self.up.frontend_candidates():
            call = frontend_pb2_grpc.FrontendStub(self.up.channel(address)).Stream()
            try:
                await call.write(self._frontend_config())
                first = await asyncio.wait_for(call.read(), self.settings.connect_timeout_s)
            except TimeoutError:
                call.cancel()
                error = SessionError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"frontend {address} sent no ready within {self.settings.connect_timeout_s} s",
                )
                continue
            except grpc.aio.AioRpcError as exc:
                call.cancel()
                error = _frontend_open_error(address, exc)
                if error.code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise error from None
                continue
            if first is grpc.aio.EOF or first.WhichOneof("msg") != "ready":
                call.cancel()
                error = SessionError(
                    grpc.StatusCode.UNAVAILABLE, f"frontend {address} did not start the session"
                )
                continue
            self._calls["frontend"] = call
            self.frontend_address, self.ready = address, first.ready
            self._span.set_attribute("kame.frontend", address)
            return
        raise error

    def _side_config(self, service: str) -> Any:
        if service == "stt":
            return stt_pb2.TranscribeRequest(
                config=stt_pb2.SttConfig(session_id=self.id, language=self.plan.language)
            )
        llm = self.plan.llm or gateway_pb2.LlmOverride()
        return oracle_pb2.GuideRequest(
            config=oracle_pb2.OracleConfig(
                session_id=self.id,
                backend=llm.backend,
                model=llm.model,
                base_url=llm.base_url,
                api_key=llm.api_key,
                policy=oracle_pb2.OraclePolicy(name=self.plan.mode),
            )
        )

    def _open_side(self, service: str) -> None:
        """Open the stt or oracle stream; its config goes first in its queue, so
        a service that is down shows up as a side failure, not a session error."""
        channel = self.up.channel(getattr(self.settings, f"{service}_address"))
        if service == "stt":
            self._calls[service] = stt_pb2_grpc.SttStub(channel).Transcribe()
        else:
            self._calls[service] = oracle_pb2_grpc.OracleStub(channel).Guide()
        self._queue(service).put_nowait(self._side_config(service))
        self._alive[service] = True

    # ---- pumps -----------------------------------------------------------------

    def _spawn(self, role: str, coro: Coroutine) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(coro, name=f"gateway-{self.id}-{role}")

    def _start_pumps(self, requests: AsyncIterator[gateway_pb2.ConverseRequest]) -> None:
        self._tasks["caller"] = self._spawn("caller", self._read_caller(requests))
        self._tasks["frontend-in"] = self._spawn(
            "frontend-in", self._frontend_guard(self._write_upstream("frontend"))
        )
        self._tasks["frontend-out"] = self._spawn(
            "frontend-out", self._frontend_guard(self._read_frontend())
        )
        readers = {"stt": self._read_stt, "oracle": self._read_oracle}
        for service in SIDE_SERVICES:
            if self._alive[service]:
                self._tasks[f"{service}-in"] = self._spawn(
                    f"{service}-in", self._side_guard(service, self._write_upstream(service))
                )
                self._tasks[f"{service}-out"] = self._spawn(
                    f"{service}-out", self._side_guard(service, readers[service]())
                )

    async def _supervise(self) -> None:
        """Wait until the frontend's output ends, then finish; re-raise the first
        failure of an essential task (caller input, frontend) or an abort."""
        essential = ("caller", "frontend-in", "frontend-out")
        watched: set[asyncio.Future] = {self._tasks[name] for name in essential}
        watched.add(self._abort)
        while self._tasks["frontend-out"] in watched:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                if future.exception() is not None:
                    raise future.exception()
                watched.discard(future)
        await self._finish()

    async def _finish(self) -> None:
        """The frontend answered every caller frame: let stt finalize, then
        close the oracle, then end the output."""
        timeout = self.settings.drain_timeout_s
        await self._wait_side("stt", timeout)
        await self._close_input("oracle")  # it logs the last agent turn, then ends
        await self._wait_side("oracle", timeout)
        self._log_agent_turn()
        await self._client_q.put(_END)

    async def _next_output(self, supervisor: asyncio.Task) -> Any:
        """The next item for the caller; raises the supervisor's failure at once."""
        if supervisor.done():
            supervisor.result()
            return await self._client_q.get()
        getter = asyncio.ensure_future(self._client_q.get())
        await asyncio.wait({getter, supervisor}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        return await self._next_output(supervisor)

    def _to_client(self, item: Any) -> list[gateway_pb2.ConverseResponse]:
        """What leaves the gateway for one queued item; the first audio of an
        agent answer is the moment that ends the turn's response latency."""
        if not isinstance(item, _AgentAudioOut):
            return [item]
        responses = [
            gateway_pb2.ConverseResponse(
                audio=gateway_pb2.AgentAudioChunk(data=chunk, seq=item.seq, speaking=item.speaking)
            )
            for chunk in item.chunks
        ]
        started = item.speaking and not self._speaking
        self._speaking = item.speaking
        if started and (turn := self._tracker.on_agent_audio_start(time.time())):
            responses.append(self._summarize(turn))
        return responses

    async def _wait_side(self, service: str, timeout: float) -> None:
        tasks = [t for name, t in self._tasks.items() if name.startswith(f"{service}-")]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    def _queue(self, service: str) -> asyncio.Queue:
        return {"frontend": self._frontend_q, "stt": self._stt_q, "oracle": self._oracle_q}[service]

    async def _write_upstream(self, service: str) -> None:
        call, queue = self._calls[service], self._queue(service)
        while True:
            item = await queue.get()
            if item is _END:
                await call.done_writing()
                return
            await call.write(item)

    async def _close_input(self, service: str) -> None:
        self._input_closed[service] = True
        if service == "frontend" or self._alive[service]:
            await self._queue(service).put(_END)

    async def _read_caller(self, requests: AsyncIterator[gateway_pb2.ConverseRequest]) -> None:
        decoder, framer = Decoder(self.plan.input_format), Framer()
        chunk_index = 0
        async for request in requests:
            kind = request.WhichOneof("msg")
            if kind == "config":
                raise SessionError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "a second config arrived: send the config once, first",
                )
            if kind != "audio":
                raise SessionError(
                    grpc.StatusCode.INVALID_ARGUMENT, "a request carries neither config nor audio"
                )
            arrival_us = _now_us()
            try:
                samples = await asyncio.to_thread(decoder.decode, request.audio)
            except CodecError as exc:
                raise SessionError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"audio chunk {chunk_index}: {exc}"
                ) from None
            chunk_index += 1
            for frame in framer.push(samples):
                await self._send_caller_frame(frame, arrival_us)
        frames = framer.push(decoder.flush())
        if (tail := framer.flush()) is not None:
            frames.append(tail)
        for frame in frames:
            await self._send_caller_frame(frame, _now_us())
        await self._close_input("frontend")
        await self._close_input("stt")

    async def _send_caller_frame(self, samples: np.ndarray, capture_us: int) -> None:
        seq = len(self._capture_us)
        if (seq + 1) * FRAME_SECONDS > self.settings.max_session_s:
            raise SessionError(
                grpc.StatusCode.OUT_OF_RANGE,
                f"the session reached its cap of {self.settings.max_session_s} s of caller audio",
            )
        self._capture_us.append(capture_us)
        frame = common_pb2.AudioFrame(
            pcm=float_to_pcm16(samples),
            sample_rate_hz=SAMPLE_RATE,
            seq=seq,
            capture_time_us=capture_us,
        )
        await self._frontend_q.put(frontend_pb2.FrontendRequest(audio=frame))
        if self._alive["stt"]:
            await self._stt_q.put(stt_pb2.TranscribeRequest(audio=frame))

    async def _read_frontend(self) -> None:
        call = self._calls["frontend"]
        while (response := await call.read()) is not grpc.aio.EOF:
            kind = response.WhichOneof("msg")
            if kind == "audio":
                await self._on_agent_audio(response.audio)
            elif kind == "text":
                await self._on_agent_text(response.text)
        if not self._input_closed["frontend"]:
            raise SessionError(
                grpc.StatusCode.UNAVAILABLE,
                f"the frontend {self.frontend_address} ended the stream before the caller finished",
            )

    async def _on_agent_audio(self, audio: frontend_pb2.AgentAudio) -> None:
        frame = audio.frame
        round_trip = (_now_us() - frame.capture_time_us) / 1e6
        metrics.FRAME_ROUND_TRIP.labels(self.plan.mode).observe(round_trip)
        metrics.FRAME_TRANSPORT.labels(self.plan.mode).observe(max(0.0, round_trip - audio.step_s))
        chunks = await asyncio.to_thread(self._encoder.encode, pcm16_to_float(frame.pcm))
        await self._client_q.put(_AgentAudioOut(frame.seq, audio.speaking, chunks))

    async def _on_agent_text(self, text: common_pb2.AgentText) -> None:
        await self._client_q.put(gateway_pb2.ConverseResponse(agent_text=text))
        if self.plan.uses_oracle:
            self._offer_oracle(oracle_pb2.GuideRequest(agent_text=text))
        else:
            self._agent_words.append((time.time(), text.text))

    def _offer_oracle(self, request: oracle_pb2.GuideRequest) -> None:
        """Agent text must not wait on the oracle: the agent's voice comes first."""
        if not self._alive["oracle"] or self._input_closed["oracle"]:
            return
        try:
            self._oracle_q.put_nowait(request)
        except asyncio.QueueFull:
            metrics.DROPPED_MESSAGES.labels("oracle").inc()

    async def _read_stt(self) -> None:
        call = self._calls["stt"]
        while (response := await call.read()) is not grpc.aio.EOF:
            if response.WhichOneof("msg") == "transcript":
                await self._on_transcript(response.transcript)
            else:
                await self._on_activity(response.activity)
        if not self._input_closed["stt"]:
            raise RuntimeError("stt ended its stream before the caller finished")

    async def _on_transcript(self, event: common_pb2.TranscriptEvent) -> None:
        turn = self._tracker.on_transcript(event, time.time())
        if event.is_final and turn.summarized:
            self._trace_turn(turn)  # the final came after the answer started
        await self._client_q.put(gateway_pb2.ConverseResponse(user_transcript=event))
        if self._alive["oracle"] and not self._input_closed["oracle"]:
            await self._oracle_q.put(oracle_pb2.GuideRequest(user_transcript=event))
        if event.is_final and not self.plan.uses_oracle and event.text.strip():
            self._log_agent_turn(before=turn.started_wall)
            self._store(self.up.store.append_turn, "user", event.text.strip())

    async def _on_activity(self, activity: common_pb2.SpeechActivity) -> None:
        wall = self._wall_at(activity.at_s)
        if activity.kind == common_pb2.SpeechActivity.SPEECH_START:
            self._tracker.on_speech_start(activity.utterance_id, wall)
        elif activity.kind == common_pb2.SpeechActivity.SPEECH_END:
            turn = self._tracker.on_speech_end(activity.utterance_id, wall)
            if turn is not None:
                await self._client_q.put(self._summarize(turn))

    def _wall_at(self, at_s: float) -> float:
        """Wall time at which the caller's audio at stream position `at_s` reached
        the gateway: the capture time of its frame, less the rest of that frame."""
        if not self._capture_us:
            return time.time()
        seq = min(max(int(at_s / FRAME_SECONDS), 0), len(self._capture_us) - 1)
        return self._capture_us[seq] / 1e6 - ((seq + 1) * FRAME_SECONDS - at_s)

    async def _read_oracle(self) -> None:
        call = self._calls["oracle"]
        while (response := await call.read()) is not grpc.aio.EOF:
            if response.WhichOneof("msg") == "update":
                await self._on_oracle_update(response.update)
            elif response.event.kind == oracle_pb2.OracleEvent.ERROR:
                await self._client_q.put(
                    self._notice(
                        gateway_pb2.Notice.ORACLE_ERROR,
                        f"oracle LLM error: {response.event.detail}",
                    )
                )
        if not self._input_closed["oracle"]:
            raise RuntimeError("oracle ended its stream before the caller finished")

    async def _on_oracle_update(self, update: common_pb2.OracleUpdate) -> None:
        self._tracker.on_oracle_update(time.time())
        if not self._input_closed["frontend"]:
            await self._frontend_q.put(frontend_pb2.FrontendRequest(oracle=update))
        if self.plan.include_oracle_updates:
            await self._client_q.put(gateway_pb2.ConverseResponse(oracle_update=update))

    # ---- failures ----------------------------------------------------------------

    async def _frontend_guard(self, coro: Coroutine) -> None:
        try:
            await coro
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # InvalidStateError: a write to a call that the frontend already ended.
            detail = (
                f"{exc.code().name}: {exc.details()}"
                if isinstance(exc, grpc.aio.AioRpcError)
                else str(exc)
            )
            metrics.UPSTREAM_FAILURES.labels("frontend").inc()
            raise SessionError(
                grpc.StatusCode.UNAVAILABLE,
                f"the frontend {self.frontend_address} failed: {detail}",
            ) from None

    async def _side_guard(self, service: str, coro: Coroutine) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._lose_side(service, exc)

    async def _lose_side(self, service: str, exc: Exception) -> None:
        """Go on without oracle: stop the failed stream (stt takes oracle along)."""
        if not self._alive[service]:
            return
        detail = (
            f"{exc.code().name}: {exc.details()}"
            if isinstance(exc, grpc.aio.AioRpcError)
            else str(exc)
        )
        if (
            service == "oracle"
            and self.plan.llm is not None
            and isinstance(exc, grpc.aio.AioRpcError)
            and exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        ):
            self._fail(
                SessionError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the oracle rejected the llm override: {exc.details()}",
                )
            )
            return
        log.warning("session %s: %s failed (%s); going on without oracle", self.id, service, detail)
        metrics.UPSTREAM_FAILURES.labels(service).inc()
        oracle_was_alive = self._alive["oracle"]
        for lost in ("stt", "oracle") if service == "stt" else ("oracle",):
            self._stop_side(lost)
        if oracle_was_alive or not self.plan.uses_oracle:
            await self._client_q.put(
                self._notice(
                    gateway_pb2.Notice.ORACLE_UNAVAILABLE,
                    f"{service} failed ({detail}); the call goes on without oracle",
                )
            )

    def _stop_side(self, service: str) -> None:
        if not self._alive[service]:
            return
        self._alive[service] = False
        self._calls[service].cancel()
        for name, task in self._tasks.items():
            if name.startswith(f"{service}-") and task is not asyncio.current_task():
                task.cancel()
        queue = self._queue(service)  # unblock producers waiting on a full queue
        while not queue.empty():
            queue.get_nowait()

    def _fail(self, error: SessionError) -> None:
        if not self._abort.done():
            self._abort.set_exception(error)

    @staticmethod
    def _notice(kind: int, message: str) -> gateway_pb2.ConverseResponse:
        return gateway_pb2.ConverseResponse(notice=gateway_pb2.Notice(kind=kind, message=message))

    # ---- turns, Redis, teardown ------------------------------------------------------

    def _summarize(self, turn: Turn) -> gateway_pb2.ConverseResponse:
        """Record a finished turn (metrics, spans) and make its TurnSummary."""
        latency = turn.response_latency_s
        if latency is not None and latency >= 0:
            metrics.RESPONSE_LATENCY.labels(self.plan.mode).observe(latency)
        elif latency is not None:
            metrics.EARLY_RESPONSES.labels(self.plan.mode).inc()
        if turn.first_oracle_update_wall is not None:
            metrics.ORACLE_FIRST_UPDATE.labels(self.plan.mode).observe(turn.oracle_first_update_s)
        if turn.final_wall is not None:
            self._trace_turn(turn)
        return gateway_pb2.ConverseResponse(turn=turn.summary())

    def _trace_turn(self, turn: Turn) -> None:
        """A turn span under the session with its stt, oracle and frontend
        phases as children, placed at the times they happened. Written once the
        turn is summarized and its final transcript arrived (or the session ends)."""
        if turn.traced:
            return
        turn.traced = True
        end = max(t for t in (turn.answered_wall, turn.speech_end_wall, turn.final_wall) if t)
        attributes = {
            "kame.utterance_id": turn.last_utterance_id,
            "kame.response_latency_s": turn.response_latency_s or 0.0,
        }
        if tracing.TRANSCRIPTS_IN_SPANS:
            attributes["kame.user_text"] = turn.user_text
        turn_span = _tracer.start_span(
            "turn",
            context=trace.set_span_in_context(self._span),
            start_time=ns(turn.started_wall),
            attributes=attributes,
        )
        parent = trace.set_span_in_context(turn_span)
        phases = {
            "stt": (turn.speech_end_wall, turn.final_wall),
            "oracle": (turn.first_partial_wall, turn.first_oracle_update_wall),
            "frontend": (turn.speech_end_wall, turn.answered_wall),
        }
        for name, (start, stop) in phases.items():
            if start is not None and stop is not None:
                first, last = sorted((start, stop))
                _tracer.start_span(name, context=parent, start_time=ns(first)).end(ns(last))
        turn_span.end(ns(end))

    def _log_agent_turn(self, before: float = float("inf")) -> None:
        """s2s: the gateway writes the conversation (no oracle does it). The
        agent's words spoken before `before` (the start of the caller turn whose
        final just came) are its previous turn; later ones answer this caller
        turn and wait for the next final or the end of the session."""
        spoken = [word for wall, word in self._agent_words if wall < before]
        self._agent_words = [(wall, word) for wall, word in self._agent_words if wall >= before]
        if spoken:
            self._store(self.up.store.append_turn, "agent", " ".join(spoken))

    def _store(self, operation: Callable[..., Awaitable[None]], *args: Any) -> None:
        try:
            self._store_q.put_nowait((operation, (self.id, *args)))
        except asyncio.QueueFull:
            metrics.DROPPED_MESSAGES.labels("redis").inc()

    async def _write_store(self) -> None:
        """Redis writes in order, off the audio path; a Redis outage costs
        records, never the call."""
        while (item := await self._store_q.get()) is not _END:
            operation, args = item
            try:
                await operation(*args)
            except (RedisError, OSError) as exc:
                log.warning("session %s: Redis write failed: %s", self.id, exc)

    async def _teardown(self, outcome: str) -> None:
        for turn in self._tracker.turns:
            if turn.summarized:
                self._trace_turn(turn)
        for call in self._calls.values():
            call.cancel()
        store_task = self._tasks.pop("store", None)
        pumps = list(self._tasks.values())
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        if self._abort.done() and not self._abort.cancelled():
            self._abort.exception()  # retrieved: it was raised already or lost to an earlier one
        if store_task is not None:
            self._store(
                self.up.store.put_session,
                {
                    "state": "ended" if outcome == "ok" else "failed",
                    "outcome": outcome,
                    "ended_at": time.time(),
                    "turns": len(self._tracker.turns),
                },
            )
            with contextlib.suppress(asyncio.QueueFull):
                self._store_q.put_nowait(_END)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(store_task), timeout=2.0)
            store_task.cancel()
            await asyncio.gather(store_task, return_exceptions=True)
        metrics.SESSIONS.labels(self.plan.mode, outcome).inc()
        self._span.set_attribute("kame.outcome", outcome)
        self._span.end()


def _frontend_open_error(address: str, exc: grpc.aio.AioRpcError) -> SessionError:
    code = exc.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return SessionError(code, f"no front-end slot is free ({address}: {exc.details()})")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return SessionError(code, f"the frontend rejected the session config: {exc.details()}")
    return SessionError(
        grpc.StatusCode.UNAVAILABLE,
        f"the frontend {address} is unavailable: {code.name}: {exc.details()}",
    )
