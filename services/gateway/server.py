"""gRPC glue of the gateway: the Converse servicer, `serve(config)` and `main`.

The client port is the edge of the cluster: every call is authenticated
first (bearer token in metadata, kame_common.auth), its audio is held to the
input limits (pacing.py: message size, real-time pace, idle timeout), and no
status message or notice leaves it naming an internal address
(`redact_addresses`); the full message stays in the gateway's log.

A config with a resume_token continues that session (resume.py). When the
gateway drains, every open call gets Notice RECONNECT first, so that its
client can move to another replica before the grace period ends.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from redis.exceptions import RedisError

from kame_common import store
from kame_common.answer_time import AnswerTimes
from kame_common.auth import BearerAuth, parse_tokens
from kame_common.redact import redact_addresses
from kame_common.server import ServiceRuntime, service_main
from kame_common.streams import StreamError, read_config
from kamepb import gateway_pb2, gateway_pb2_grpc
from services.gateway import metrics, resume
from services.gateway.admission import CapacityGate
from services.gateway.config import GatewaySettings
from services.gateway.connections import Connections
from services.gateway.pacing import InputLimits, cap_call_time, limit_input, max_message_bytes
from services.gateway.plan import SessionError, SessionPlan, plan_session
from services.gateway.readiness import Readiness
from services.gateway.session import GatewaySession

log = logging.getLogger(__name__)

GRPC_SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name


def _for_client(response: gateway_pb2.ConverseResponse) -> gateway_pb2.ConverseResponse:
    if response.WhichOneof("msg") == "notice":
        response.notice.message = redact_addresses(response.notice.message)
    return response


def _ending(code: grpc.StatusCode, details: str) -> gateway_pb2.ConverseResponse:
    return gateway_pb2.ConverseResponse(
        ending=gateway_pb2.CallEnding(code=code.name, details=details)
    )


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(
        self,
        runtime: ServiceRuntime,
        connections: Connections,
        auth: BearerAuth,
        gate: CapacityGate | None = None,
        readiness: Readiness | None = None,
        answers: AnswerTimes | None = None,
    ) -> None:
        self.runtime = runtime
        self.connections = connections
        self.settings = connections.settings
        self.auth = auth
        self.gate = gate  # None: admission does not look at stt and oracle capacity
        self.readiness = readiness  # None: no upstream health check, always ready
        self.answers = answers  # None: no answer-time bound on admission
        self.sessions: set[GatewaySession] = set()  # open calls, told to reconnect on drain

    async def Converse(  # noqa: N802 (gRPC method name)
        self,
        request_iterator: AsyncIterator[gateway_pb2.ConverseRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[gateway_pb2.ConverseResponse]:
        requests = aiter(request_iterator)
        principal = await self.auth.check(context, first_message=lambda: anext(requests))
        call: int | None = None  # its place among the calls answer time admits
        try:
            try:
                first = await read_config(
                    requests, "ConverseConfig", self.settings.connect_timeout_s
                )
                config = first.config
                plan = dataclasses.replace(plan_session(config, self.settings), caller=principal)
                self._check_ready(plan)
                resumed = await self._resumed_session(config.resume_token, plan, principal)
                if self.gate is not None:  # a resumed call takes capacity like a new one
                    await self.gate.admit(plan.side_services)
                call = self._admit_by_answer_time()
                held = await resume.hold(
                    self.connections.store,
                    self.settings.resume_secret,
                    context,
                    resumed,
                    plan,
                    principal,
                )
            except StreamError as exc:
                await context.abort(
                    exc.code, redact_addresses(exc.message), exc.trailing_metadata()
                )
            async for response in self._converse(context, requests, plan, held, resumed):
                yield response
        finally:
            if call is not None and self.answers is not None:
                self.answers.call_ended(call)

    async def _converse(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        requests: AsyncIterator[gateway_pb2.ConverseRequest],
        plan: SessionPlan,
        held: resume.HeldSession,
        resumed: tuple[str, str] | None,
    ) -> AsyncIterator[gateway_pb2.ConverseResponse]:
        """An admitted call, from its first response to its end."""
        cap_call_time(context, self.settings.max_session_s + self.settings.drain_timeout_s)
        async with self.runtime.session(context):
            session = GatewaySession(
                self.connections,
                plan,
                held.session_id,
                held.resume_token,
                bool(resumed),
                answers=self.answers,
            )
            how = "resumed" if resumed else "started"
            log.info("session %s %s (%s)", session.id, how, plan.mode.value)
            self.sessions.add(session)
            limited = limit_input(
                requests, plan.input_format, InputLimits.from_settings(self.settings)
            )
            started = False  # its SessionStarted (with its resume token) went out
            try:
                async for response in session.responses(limited):
                    started = True
                    yield _for_client(response)
                await held.hung_up()  # it ended normally: no token resumes it
            except StreamError as exc:
                log.info("session %s ended: %s: %s", session.id, exc.code.name, exc.message)
                details = redact_addresses(exc.message)
                if started:  # the caller is streaming: say it in band too (CallEnding)
                    yield _ending(exc.code, details)
                else:
                    await held.not_started()
                await context.abort(exc.code, details)
            finally:
                self.sessions.discard(session)
            log.info("session %s ended", session.id)

    def _admit_by_answer_time(self) -> int | None:
        """Holds a place for the call, or SessionError(RESOURCE_EXHAUSTED) with when
        a held call is expected to end, while one more call would push the predicted
        answer median past answer_time_factor x an unloaded call's
        (kame_common.answer_time). Synchronous: calls set up at the same moment
        each see the others' places."""
        if self.answers is None:
            return None
        if not self.answers.admits(self.answers.calls_held):
            retry_after_s = self.answers.retry_after_s()
            metrics.ANSWER_TIME_REFUSALS.inc()
            raise SessionError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"busy: one more call would answer slower than "
                f"{self.answers.factor:g}x an unloaded call; retry in {retry_after_s:g} s",
                retry_after_s=retry_after_s,
            )
        return self.answers.call_started()

    def _check_ready(self, plan: SessionPlan) -> None:
        """SessionError (UNAVAILABLE, retry hint) while an upstream the call needs is
        not serving: a call admitted then would lose the caller's first words."""
        if self.readiness is None:
            return
        needed = ("frontend", "stt", *(("oracle",) if plan.mode.uses_oracle else ()))
        if (refusal := self.readiness.refusal(needed)) is not None:
            raise refusal

    async def _resumed_session(
        self, token: str, plan: SessionPlan, principal: str
    ) -> tuple[str, str] | None:
        """The session id and nonce of the token that continues a session (None
        without a token)."""
        if not token:
            return None
        secret = self.settings.resume_secret
        resumed = resume.session_of(secret, token)
        try:
            await resume.check_resumable(
                self.connections.store,
                secret,
                resumed,
                plan,
                principal,
                self.settings.resume_ttl_s,
            )
        except (RedisError, OSError) as exc:
            log.warning("resume of session %s: Redis failed: %s", resumed[0], exc)
            raise SessionError(
                grpc.StatusCode.UNAVAILABLE, "the session store is unavailable; try again"
            ) from None
        return resumed

    async def ask_to_reconnect(self) -> None:
        """Drain: every open call is told to move to another replica."""
        for session in self.sessions:
            session.ask_to_reconnect()


async def serve(settings: GatewaySettings, answers: AnswerTimes | None = None) -> ServiceRuntime:
    """Start the gateway; returns its runtime (`.port` is the bound port). `answers`:
    answer times measured already (None: a fresh AnswerTimes, when
    settings.answer_time_factor is set)."""
    runtime = ServiceRuntime(
        settings, [GRPC_SERVICE], max_message_bytes=max_message_bytes(settings.max_chunk_s)
    )
    redis_client = store.connect(settings.redis_url, settings.redis_timeout_s)
    runtime.on_close(redis_client.aclose)
    connections = Connections(settings, redis_client)
    runtime.on_close(connections.close)
    auth = BearerAuth(parse_tokens(settings.auth_tokens))
    if not auth.enabled:
        log.warning("gateway: no auth_tokens, every caller is admitted")
    if answers is None and settings.answer_time_factor:
        answers = AnswerTimes(settings.answer_time_factor)
    gate = (
        CapacityGate(
            redis_client,
            connections.registry_reads,
            settings.registry_secret,
            retry_after_s=answers.retry_after_s if answers else None,
        )
        if settings.capacity_admission
        else None
    )
    readiness = None
    if settings.readiness_interval_s:
        readiness = Readiness(connections, settings.readiness_interval_s, runtime.set_ready)
        await readiness.check()  # upstreams that already serve: ready from the first call
    servicer = GatewayServicer(runtime, connections, auth, gate, readiness, answers)
    runtime.on_drain(servicer.ask_to_reconnect)
    await runtime.start(
        lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server),
        serving=readiness is None or readiness.ready,
    )
    if readiness is not None:
        runtime.on_close(readiness.stop)  # runs before connections.close (last first)
        readiness.start()
    return runtime


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(GatewaySettings, serve, argv)
