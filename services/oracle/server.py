"""gRPC glue for Oracle.Guide: config first, then transcript events and agent
text in; oracle updates and timing events out (see protos/kamepb/oracle.proto)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import grpc
from redis.asyncio import Redis

from kame_common import store
from kame_common.metrics import start_metrics_server
from kame_common.server import ServiceRuntime, run_until_stopped, service_main
from kame_common.tracing import setup_tracing
from kamepb import oracle_pb2, oracle_pb2_grpc
from services.oracle import config as oracle_config
from services.oracle.config import ApiKeys, InvalidSessionConfig, OracleServiceConfig
from services.oracle.engine import OracleSession, SessionFactory

log = logging.getLogger(__name__)

SERVICE_NAME = "oracle"
FULL_SERVICE_NAME = oracle_pb2.DESCRIPTOR.services_by_name["Oracle"].full_name


class ProtocolError(Exception):
    """The client broke the stream protocol (-> INVALID_ARGUMENT)."""


class OracleServicer(oracle_pb2_grpc.OracleServicer):
    def __init__(self, runtime: ServiceRuntime, factory: SessionFactory) -> None:
        self.runtime = runtime
        self.factory = factory

    async def Guide(
        self,
        request_iterator: AsyncIterator[oracle_pb2.GuideRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[oracle_pb2.GuideResponse]:
        async with self.runtime.session(context):
            requests = aiter(request_iterator)
            first = await anext(requests, None)
            if first is None:
                return
            if first.WhichOneof("msg") != "config":
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the first GuideRequest must carry config, got {first.WhichOneof('msg')}",
                )
            try:
                session = await self.factory.open(first.config)
            except InvalidSessionConfig as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            feeder = asyncio.create_task(self._feed(requests, session))
            try:
                async for response in session.responses():
                    yield response
                # The responses end once the feeder closed the session; did it fail?
                (outcome,) = await asyncio.gather(feeder, return_exceptions=True)
                if isinstance(outcome, ProtocolError):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(outcome))
            finally:
                feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
                await session.close()

    @staticmethod
    async def _feed(
        requests: AsyncIterator[oracle_pb2.GuideRequest], session: OracleSession
    ) -> None:
        """Route client messages into the session; the client's half-close (or a
        protocol error) closes the session, which ends the response stream."""
        try:
            async for request in requests:
                kind = request.WhichOneof("msg")
                if kind == "user_transcript":
                    session.user_transcript(request.user_transcript)
                elif kind == "agent_text":
                    session.agent_text(request.agent_text)
                elif kind == "config":
                    raise ProtocolError("a second config arrived; send config once, first")
                else:
                    raise ProtocolError("empty GuideRequest: set user_transcript or agent_text")
        finally:
            await session.close()


class OracleRuntime(ServiceRuntime):
    """The service runtime plus the Redis client that the sessions share."""

    redis_client: Redis | None = None

    async def stop(self) -> None:
        await super().stop()
        await self.close_redis()

    async def close_redis(self) -> None:
        if self.redis_client is not None:
            await self.redis_client.aclose()
            self.redis_client = None


async def serve(config: OracleServiceConfig, api_keys: ApiKeys | None = None) -> OracleRuntime:
    """Start the Oracle service; `api_keys` default to OPENAI_API_KEY / ANTHROPIC_API_KEY.
    An empty `redis_url` runs without conversation history."""
    setup_tracing(SERVICE_NAME, config.otlp_endpoint)
    runtime = OracleRuntime(
        SERVICE_NAME,
        [FULL_SERVICE_NAME],
        host=config.host,
        port=config.port,
        max_sessions=config.max_sessions,
        grace_s=config.grace_s,
    )
    session_store = None
    if config.redis_url:
        runtime.redis_client = store.connect(config.redis_url)
        session_store = store.SessionStore(runtime.redis_client, ttl_s=config.history_ttl_s)
    keys = api_keys if api_keys is not None else ApiKeys.from_env()
    factory = SessionFactory(config, keys, session_store)
    servicer = OracleServicer(runtime, factory)
    await runtime.start(
        lambda server: oracle_pb2_grpc.add_OracleServicer_to_server(servicer, server)
    )
    return runtime


async def _run(config: OracleServiceConfig) -> None:
    metrics_port = start_metrics_server(config.metrics_port)
    runtime = await serve(config)
    log.info(
        "oracle: default backend %s model %s at %s; metrics on :%s",
        config.backend,
        config.model,
        config.base_url,
        metrics_port or "off",
    )
    await run_until_stopped(runtime)
    await runtime.close_redis()


def main(argv: Sequence[str] | None = None) -> int:
    return service_main("oracle", oracle_config.load, _run, argv)
