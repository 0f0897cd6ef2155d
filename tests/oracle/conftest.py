"""Fixtures for the oracle tests: the real llama.cpp server with the embedded
Gemma 3 270M, the oracle gRPC service on a loopback port, a client that drives
one Guide stream, and a small local HTTP server for back-end behaviour that
the real server cannot be made to show (Anthropic's protocol, stalls,
dropped connections, rejected keys)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kame_common import tracing
from kamepb import common_pb2, oracle_pb2, oracle_pb2_grpc
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.server import serve
from tests.support.llm import Handler, StubHttpServer

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate


SPANS = InMemorySpanExporter()


@pytest.fixture(scope="session")
def spans() -> InMemorySpanExporter:
    """Finished spans of this process (the tracer provider is global: installed once)."""
    tracing.setup_tracing("oracle-tools-test")
    provider = trace.get_tracer_provider()
    provider.add_span_processor(SimpleSpanProcessor(SPANS))  # type: ignore[attr-defined]
    return SPANS


@pytest.fixture
async def oracle_service(redis_url):
    """start(api_keys=None, **config overrides) -> a running oracle runtime with no API keys
    unless given and no start-up warm-up unless `warmup_timeout_s` is (stopped at teardown)."""
    runtimes = []

    async def start(api_keys: ApiKeys | None = None, **overrides):
        settings = dict(
            host="127.0.0.1", port=0, metrics_port=0, redis_url=redis_url, warmup_timeout_s=0
        )
        settings.update(overrides)
        runtime = await serve(OracleSettings(**settings), api_keys=api_keys or ApiKeys())
        runtimes.append(runtime)
        return runtime

    yield start
    for runtime in runtimes:
        await runtime.stop()


class GuideClient:
    """One Oracle.Guide stream: write requests, collect every response as it arrives."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.call = oracle_pb2_grpc.OracleStub(self.channel).Guide()
        self.responses: list[oracle_pb2.GuideResponse] = []
        self.arrival: list[float] = []
        self.error: grpc.aio.AioRpcError | None = None
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                async with self._changed:
                    self.responses.append(response)
                    self.arrival.append(time.monotonic())
                    self._changed.notify_all()
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        finally:
            async with self._changed:
                self._changed.notify_all()

    async def send(self, request: oracle_pb2.GuideRequest) -> None:
        await self.call.write(request)

    async def config(self, **fields) -> None:
        await self.send(oracle_pb2.GuideRequest(config=oracle_pb2.OracleConfig(**fields)))

    async def user(
        self,
        text: str,
        final: bool = False,
        utterance_id: str = "u1",
        span: tuple[float, float] | None = None,
    ) -> None:
        """A transcript event; `span` (start_s, end_s) places it in the caller's audio."""
        event = common_pb2.TranscriptEvent(
            utterance_id=utterance_id, is_final=final, text=text, stability=1.0 if final else 0.5
        )
        if span is not None:
            event.span.start_s, event.span.end_s = span
        await self.send(oracle_pb2.GuideRequest(user_transcript=event))

    async def agent(self, text: str, start_s: float = 0.0) -> None:
        """Agent words spoken at `start_s` seconds into the agent's audio."""
        await self.send(
            oracle_pb2.GuideRequest(agent_text=common_pb2.AgentText(text=text, start_s=start_s))
        )

    async def wait_for(
        self, predicate: Callable[[oracle_pb2.GuideResponse], bool], timeout_s: float = 60.0
    ) -> oracle_pb2.GuideResponse:
        """The first response (old or new) that satisfies `predicate`."""

        async def _wait():
            async with self._changed:
                while True:
                    for response in self.responses:
                        if predicate(response):
                            return response
                    if self._reader.done():
                        raise AssertionError(f"stream ended ({self.error}) before the response")
                    await self._changed.wait()

        try:
            return await asyncio.wait_for(_wait(), timeout_s)
        except TimeoutError:
            seen = [
                f"{oracle_pb2.OracleEvent.Kind.Name(r.event.kind)} g{r.event.generation} "
                f"{r.event.detail!r}"
                if r.HasField("event")
                else r.WhichOneof("msg")
                for r in self.responses
            ]
            raise AssertionError(f"no such response in {timeout_s:g} s; got: {seen}") from None

    async def wait_event(
        self, kind: int, generation: int | None = None, timeout_s: float = 60.0
    ) -> oracle_pb2.OracleEvent:
        response = await self.wait_for(
            lambda r: (
                r.HasField("event")
                and r.event.kind == kind
                and (generation is None or r.event.generation == generation)
            ),
            timeout_s,
        )
        return response.event

    async def finish(self, timeout_s: float = 30.0) -> grpc.StatusCode:
        """Half-close, wait for the server to end the stream; the final status code."""
        with contextlib.suppress(grpc.aio.UsageError, grpc.aio.AioRpcError):
            await self.call.done_writing()
        await asyncio.wait_for(asyncio.shield(self._reader), timeout_s)
        code = await self.call.code()
        await self.channel.close()
        return code

    def events(self, kind: int | None = None) -> list[oracle_pb2.OracleEvent]:
        return [
            r.event
            for r in self.responses
            if r.HasField("event") and (kind is None or r.event.kind == kind)
        ]

    def updates(self) -> list[common_pb2.OracleUpdate]:
        return [r.update for r in self.responses if r.HasField("update")]

    def assert_update_protocol(self) -> None:
        """Generations only grow; a RESET carries its candidate's first words and a
        source, every APPEND follows the RESET of its own generation; every update
        carries whole, trimmed words."""
        current = 0
        for update in self.updates():
            if update.op == Update.RESET:
                assert update.generation > current, "a RESET must carry a new, larger generation"
                assert update.HasField("source") and update.source.utterance_id
                current = update.generation
            else:
                assert update.op == Update.APPEND
                assert not update.HasField("source"), "only a RESET names its source"
                assert update.generation == current, "an APPEND must carry its RESET's generation"
            assert update.text and update.text == " ".join(update.text.split())

    def reset(self, generation: int) -> common_pb2.OracleUpdate:
        return next(
            u for u in self.updates() if u.op == Update.RESET and u.generation == generation
        )

    def answer(self, generation: int) -> str:
        """The candidate text of one generation: its RESET's and APPENDs' words."""
        return " ".join(u.text for u in self.updates() if u.generation == generation)


@pytest.fixture
async def guide_client():
    """open(port) -> GuideClient; every client's channel is closed at teardown."""
    clients: list[GuideClient] = []

    def open_client(port: int) -> GuideClient:
        clients.append(GuideClient(port))
        return clients[-1]

    yield open_client
    for client in clients:
        client.call.cancel()
        await client.channel.close()


@pytest.fixture
async def stub_http():
    """start(routes, port=0) -> (StubHttpServer, its base URL); closed at teardown."""
    servers: list[StubHttpServer] = []

    async def start(
        routes: dict[tuple[str, str], Handler], port: int = 0
    ) -> tuple[StubHttpServer, str]:
        server = StubHttpServer(routes)
        servers.append(server)
        return server, await server.start(port)

    yield start
    for server in servers:
        await server.close()
