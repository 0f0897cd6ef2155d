"""The whole stack on loopback, in this process, shared by the e2e tests of a
module: real Redis, the real llama.cpp server (a subprocess with the embedded
Gemma 3 270M), and the stt, oracle, frontend (engine tts) and gateway
services started with their own `serve(config)` on port 0.

The stack uses its own Redis database (9 unless KAME_TEST_E2E_REDIS_URL says
otherwise) so that the frontend capacity registry it reads holds only this
stack's replica, whatever other test runs share the Redis server. `web` puts
the web service (the OpenAI Realtime and Moshi-protocol endpoints) before it.
The modules that run the stack as the user does start `kame up` with
tests/e2e/kame_up.py instead.

`LiveCall` drives one Converse call (kame_client's client) the way a phone
would: audio paced at real time (kame_client/microphone.py), every event
recorded with its arrival time, so that a test can act in the middle of a turn
(disconnect, kill a service) and look at what came.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kame_cli.stack_options import free_ports
from kame_client.client import ConverseClient
from kame_client.codecs import AudioFormat, CodecError, Decoder, Encoder, resolve_format
from kame_client.events import AgentAudio, ConverseEvent, Event
from kame_client.microphone import Microphone
from kame_common import store, tracing
from kame_common.audio import SAMPLE_RATE
from kame_common.server import ServiceRuntime
from kamepb import gateway_pb2
from services.frontend.config import FrontendSettings
from services.frontend.server import serve as serve_frontend
from services.gateway.config import GatewaySettings
from services.gateway.server import serve as serve_gateway
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.server import serve as serve_oracle
from services.stt.config import SttSettings
from services.stt.server import serve as serve_stt
from tests.clients.runs import write_wav
from tests.support import conversation, wait_until
from tests.support.redis import with_db
from tests.support.web import web_before

QUESTION = "What is the capital of France?"
E2E_DB = 9
HOLD_MAX_S = 10.0  # a loaded test machine may take longer than the default 5 s to answer
PCM_24K = AudioFormat("pcm16", SAMPLE_RATE)
E = TypeVar("E", bound=Event)
SPAN_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def e2e_redis_url(redis_url) -> str:
    return os.environ.get("KAME_TEST_E2E_REDIS_URL", with_db(redis_url, E2E_DB))


@dataclass
class Services:
    """Factories for service instances on port 0; stop() stops what they made."""

    redis_url: str
    llm_url: str
    runtimes: list[ServiceRuntime] = field(default_factory=list)

    async def stt(self) -> ServiceRuntime:
        return self._keep(await serve_stt(SttSettings(host="127.0.0.1", port=0, metrics_port=0)))

    async def oracle(self, **overrides) -> ServiceRuntime:
        settings = dict(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url=self.redis_url,
            base_url=self.llm_url,
        )
        config = OracleSettings(**{**settings, **overrides})
        return self._keep(await serve_oracle(config, api_keys=ApiKeys()))

    async def frontend(self, redis_url: str = "") -> ServiceRuntime:
        settings = FrontendSettings(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url=redis_url or self.redis_url,
            replica_id=f"e2e-{uuid.uuid4().hex[:8]}",
        )
        return self._keep(await serve_frontend(settings))

    async def gateway(
        self, stt: ServiceRuntime, oracle: ServiceRuntime, frontend_address: str, **overrides
    ) -> ServiceRuntime:
        settings = dict(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url=self.redis_url,
            stt_address=stt.address,
            oracle_address=oracle.address,
            frontend_address=frontend_address,
        )
        config = GatewaySettings(**{**settings, **overrides})
        return self._keep(await serve_gateway(config))

    def _keep(self, runtime: ServiceRuntime) -> ServiceRuntime:
        self.runtimes.append(runtime)
        return runtime

    async def stop(self) -> None:
        for runtime in reversed(self.runtimes):
            await runtime.stop()


@dataclass
class Stack:
    services: Services
    stt: ServiceRuntime
    oracle: ServiceRuntime
    frontend: ServiceRuntime
    gateway: ServiceRuntime
    metrics_url: str
    redis_url: str

    @property
    def upstreams(self) -> dict[str, ServiceRuntime]:
        return {"stt": self.stt, "oracle": self.oracle, "frontend": self.frontend}


async def wait_registered(redis_url: str, address: str, timeout_s: float = 10.0) -> None:
    client = store.connect(redis_url)
    registry = store.CapacityRegistry(client, "frontend")

    async def registered() -> bool:
        return address in [r.address for r in await registry.replicas()]

    try:
        await wait_until(registered, f"frontend {address} in the registry", timeout_s)
    finally:
        await client.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(llm_url, e2e_redis_url):
    tracing.setup_tracing("e2e")
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(SPAN_EXPORTER))
    services = Services(e2e_redis_url, llm_url)
    try:
        stt, oracle, frontend = (
            await services.stt(),
            await services.oracle(),
            await services.frontend(),
        )
        frontend_address = f"127.0.0.1:{frontend.port}"
        await wait_registered(e2e_redis_url, frontend_address)
        metrics_port = free_ports(1)[0]
        # A static address that answers nothing: sessions reach the frontend only
        # through the capacity registry.
        gateway = await services.gateway(stt, oracle, "127.0.0.1:1", metrics_port=metrics_port)
        yield Stack(
            services,
            stt,
            oracle,
            frontend,
            gateway,
            f"http://127.0.0.1:{metrics_port}/metrics",
            e2e_redis_url,
        )
    finally:
        await services.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def web(stack):
    """The web service (the Realtime and Moshi-protocol endpoints) before a gateway
    of its own on the module's stack, which holds a caller up to HOLD_MAX_S."""
    gateway = await stack.services.gateway(
        stack.stt, stack.oracle, "127.0.0.1:1", hold_max_s=HOLD_MAX_S
    )
    async with web_before(gateway.address) as server:
        yield server


@pytest.fixture(scope="module")
def question_wav(speak, tmp_path_factory) -> Path:
    """QUESTION in piper's voice, as the WAV file the examples of examples/ read."""
    return write_wav(tmp_path_factory.mktemp("question") / "question.wav", speak(QUESTION))


def converse_config(
    mode: int = gateway_pb2.ConverseConfig.TANDEM, codec: int = 1, rate: int = 0, **fields
) -> gateway_pb2.ConverseConfig:
    audio = gateway_pb2.AudioFormat(codec=codec, sample_rate_hz=rate)
    return gateway_pb2.ConverseConfig(
        mode=mode, input_format=audio, output_format=audio, include_oracle_updates=True, **fields
    )


class LiveCall:
    """One Converse call (kame_client's client): config, audio at real time,
    every event recorded with its arrival time."""

    def __init__(self, address: str, config: gateway_pb2.ConverseConfig) -> None:
        self.client = ConverseClient.connect(address)
        self.config = config
        encoder, self.decoder = Encoder(PCM_24K), Decoder(PCM_24K)
        with contextlib.suppress(CodecError):  # tests of bad formats send them anyway
            encoder = Encoder(resolve_format(config.input_format, "input_format"))
            self.decoder = Decoder(resolve_format(config.output_format, "output_format"))
        self.microphone = Microphone(self.client, encoder)
        self.events: list[tuple[float, ConverseEvent]] = []
        self.error: grpc.aio.AioRpcError | None = None
        self.frames_sent = 0
        self._arrived = asyncio.Event()
        self._reader: asyncio.Task | None = None

    async def start(self, send_config: bool = True) -> LiveCall:
        if send_config:
            await self.client.start(self.config)
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        try:
            async for event in self.client.events():
                self.events.append((time.monotonic(), event))
                self._arrived.set()
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        finally:
            self._arrived.set()

    async def stream(self, samples: np.ndarray) -> None:
        """Send 80 ms chunks, each once its audio has been 'spoken' (real time)."""
        self.frames_sent += await self.microphone.stream(samples)

    async def send_raw(self, request: gateway_pb2.ConverseRequest) -> bool:
        """Any request, even one the gateway refuses; False once the call is over."""
        return await self.client.send(request)

    async def wait_for(self, kind: type[E], timeout_s: float = 30.0, speaking: bool = False) -> E:
        """The first event of `kind` (with `speaking`: agent audio that is speech)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.of(kind):
                if not speaking or (isinstance(event, AgentAudio) and event.speaking):
                    return event
            if self._reader.done():
                raise AssertionError(f"the call ended ({self.error}) before the event came")
            self._arrived.clear()
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out waiting for {kind.__name__}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def finish(self, timeout_s: float = 30.0) -> grpc.StatusCode:
        """Half-close and wait until the gateway ends the call; its status."""
        await self.client.done_writing()
        await asyncio.wait_for(asyncio.shield(self._reader), timeout_s)
        return await self.client.code()

    async def close(self) -> None:
        self.client.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.client.close()

    def of(self, kind: type[E]) -> list[E]:
        """The events of `kind` so far, in order."""
        return [event for _, event in self.events if isinstance(event, kind)]

    @property
    def session_id(self) -> str:
        return self.client.session.session_id

    def agent_audio(self) -> np.ndarray:
        parts = [self.decoder.decode(chunk.data) for chunk in self.of(AgentAudio)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def session_tasks(session_id: str) -> list[asyncio.Task]:
    """The gateway's pump tasks of one session still alive (named gateway-<id>-<role>)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(f"gateway-{session_id}-")]


async def latest_caller_words(redis_url: str) -> str:
    """The caller's words in the conversation of the session that started last."""
    client = store.connect(redis_url)
    try:
        sessions = {}
        async for key in client.scan_iter(match=f"{store.PREFIX}:session:*"):
            record = await client.hgetall(key)
            if "started_at" in record:
                sessions[key.rsplit(":", 1)[1]] = float(record["started_at"])
    finally:
        await client.aclose()
    assert sessions, "no session in the stack's Redis"
    latest = max(sessions, key=sessions.__getitem__)
    turns = await conversation(redis_url, latest)
    return " ".join(turn["text"] for turn in turns if turn["role"] == "user")
