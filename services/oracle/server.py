"""gRPC glue for Oracle.Guide: config first, then transcript events and agent
text in; oracle updates and timing events out (see protos/kamepb/oracle.proto)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from kame_common import store
from kame_common.aio import cancel_and_wait
from kame_common.capacity import publish_measured_capacity
from kame_common.llm import BUDGET_SPENT_METADATA
from kame_common.server import ServiceRuntime, service_main
from kame_common.streams import StreamError, aborting, dispatch, read_config
from kamepb import oracle_pb2, oracle_pb2_grpc
from services.oracle.backends import loggable_url
from services.oracle.budget import BudgetSpent
from services.oracle.config import ApiKeys, InvalidSessionConfig, OracleSettings
from services.oracle.factory import SessionFactory
from services.oracle.session import OracleSession
from services.oracle.tools.settings import parse_allowed, parse_servers, trusted_hint_servers

log = logging.getLogger(__name__)

GRPC_SERVICE = oracle_pb2.DESCRIPTOR.services_by_name["Oracle"].full_name


class OracleServicer(oracle_pb2_grpc.OracleServicer):
    def __init__(self, runtime: ServiceRuntime, factory: SessionFactory) -> None:
        self.runtime = runtime
        self.factory = factory

    async def Guide(  # noqa: N802 (gRPC method name)
        self,
        request_iterator: AsyncIterator[oracle_pb2.GuideRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[oracle_pb2.GuideResponse]:
        async with self.runtime.session(context):
            requests = aiter(request_iterator)
            async with aborting(context):
                first = await read_config(requests, "OracleConfig")
            try:
                session = await self.factory.open(first.config)
            except InvalidSessionConfig as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except BudgetSpent as exc:
                await _abort_spent(context, exc)
            feeder = asyncio.create_task(self._feed(requests, session))
            try:
                async for response in session.responses():
                    yield response
                if session.refusal is not None:  # it ended before the client was done
                    await _abort_spent(context, session.refusal)
                # The responses end once the feeder closed the session; did it fail?
                (outcome,) = await asyncio.gather(feeder, return_exceptions=True)
                if isinstance(outcome, StreamError):
                    await context.abort(outcome.code, outcome.message)
            finally:
                await cancel_and_wait(feeder)
                await session.close()

    @staticmethod
    async def _feed(
        requests: AsyncIterator[oracle_pb2.GuideRequest], session: OracleSession
    ) -> None:
        """Route client messages into the session; the client's half-close (or a
        protocol error) closes the session, which ends the response stream."""
        try:
            await dispatch(
                requests,
                {
                    "user_transcript": lambda r: session.user_transcript(r.user_transcript),
                    "agent_text": lambda r: session.agent_text(r.agent_text),
                    "dtmf": lambda r: session.keypress(r.dtmf.digit),
                    "function_result": lambda r: session.function_result(r.function_result),
                    "speech_activity": lambda r: session.speech_activity(r.speech_activity),
                    "context": lambda r: session.context(r.context),
                },
            )
        finally:
            await session.close()


async def _abort_spent(context: grpc.aio.ServicerContext[Any, Any], spent: BudgetSpent) -> None:
    """End the stream: a token budget is spent (the gateway ends the call on it)."""
    await context.abort(
        grpc.StatusCode.RESOURCE_EXHAUSTED, str(spent), trailing_metadata=(BUDGET_SPENT_METADATA,)
    )


async def serve(settings: OracleSettings, api_keys: ApiKeys | None = None) -> ServiceRuntime:
    """Start the Oracle service; `api_keys` default to OPENAI_API_KEY / ANTHROPIC_API_KEY.
    An empty `redis_url` runs without conversation history. The default back-end is
    warmed up before the server listens, so health reports SERVING only after it; the
    operator's MCP servers are connected before it too."""
    runtime = ServiceRuntime(settings, [GRPC_SERVICE])
    session_store = None
    if settings.redis_url:
        redis_client = store.connect(settings.redis_url, settings.redis_timeout_s)
        runtime.on_close(redis_client.aclose)
        session_store = store.SessionStore(
            redis_client, ttl_s=settings.history_ttl_s, max_turns=settings.history_max_turns
        )
    keys = api_keys if api_keys is not None else ApiKeys.from_env()
    toolbox = None
    if settings.mcp_servers:
        # Imported only when used: the mcp SDK adds half a second to the start.
        from services.oracle.tools.mcp_toolbox import McpToolbox

        servers = parse_servers(settings.mcp_servers)
        toolbox = McpToolbox(
            servers,
            parse_allowed(settings.tools_allowed),
            settings.tool_timeout_s,
            settings.mcp_connect_timeout_s,
            trusted_hint_servers(settings.trust_read_only_hints, servers),
        )
        runtime.on_close(toolbox.aclose)
        await toolbox.start()
    factory = SessionFactory(settings, keys, session_store, toolbox)
    await factory.warm_up()
    servicer = OracleServicer(runtime, factory)
    start_publishing = publish_measured_capacity(
        runtime, settings, factory.llm_load, settings.session_load_prior
    )
    await runtime.start(
        lambda server: oracle_pb2_grpc.add_OracleServicer_to_server(servicer, server)
    )
    start_publishing()
    _preload_other_backends(settings)
    log.info(
        "oracle: default backend %s model %s at %s",
        settings.backend,
        settings.model,
        loggable_url(settings.base_url),
    )
    return runtime


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(OracleSettings, serve, argv)


def _preload_other_backends(settings: OracleSettings) -> None:
    """A back-end callers may choose but the service does not use itself is
    imported in a thread once the oracle serves: imported at the first session
    that chooses it, its SDK (seconds on a busy host) would stall the event
    loop, and every call on it; imported before serving, a restart would be
    that much slower."""
    others = set(settings.allowed_backends.replace(" ", "").split(",")) - {settings.backend, ""}
    if "anthropic" in others:
        module = "services.oracle.anthropic_backend"
        threading.Thread(target=importlib.import_module, args=(module,), daemon=True).start()
