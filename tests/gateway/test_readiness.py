"""The gateway is ready only while stt, the oracle and a frontend serve (readiness.py):
until then its health is NOT_SERVING and a call is refused with UNAVAILABLE and a
retry hint, while its liveness stays SERVING."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kame_common.server import LIVENESS
from kamepb import gateway_pb2, gateway_pb2_grpc, stt_pb2_grpc
from tests.gateway.fakes import FakeStt
from tests.gateway.test_session import converse
from tests.support import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def health_of(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
    return int(reply.status)


def refusal(address: str) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """A call's status, details and trailing metadata (sync API: see sync_converse)."""
    config = gateway_pb2.ConverseRequest(config=gateway_pb2.ConverseConfig())
    with grpc.insecure_channel(address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(iter([config]))
        try:
            list(call)
        except grpc.RpcError:
            pass
        return call.code(), call.details() or "", dict(call.trailing_metadata() or ())


async def test_a_call_waits_for_stt_to_serve(fakes):
    """stt still loading its model (health NOT_SERVING, as a real one says before it is
    warmed up): the call is refused with a retry hint; once stt serves, it is admitted."""
    stt_health = health.aio.HealthServicer()
    await stt_health.set("", NOT_SERVING)
    server = grpc.aio.server()
    stt_pb2_grpc.add_SttServicer_to_server(FakeStt(), server)
    health_pb2_grpc.add_HealthServicer_to_server(stt_health, server)
    stt_address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        gateway = await fakes.gateway(stt_address=stt_address, readiness_interval_s=0.1)
        assert await health_of(gateway.address) == NOT_SERVING
        assert await health_of(gateway.address, LIVENESS) == SERVING

        code, details, trailing = await asyncio.to_thread(refusal, gateway.address)
        assert code == grpc.StatusCode.UNAVAILABLE, details
        assert details == "the stack is starting: stt not serving yet; try again in 1 s"
        assert trailing["retry-after-s"] == "1"

        await stt_health.set("", SERVING)

        async def ready() -> bool:
            return await health_of(gateway.address) == SERVING

        await wait_until(ready, "the gateway to be ready", 3)
        outcome = await converse(gateway.address, frames=3)
        assert outcome.code == grpc.StatusCode.OK, outcome.details
        assert outcome.of("started")
    finally:
        await server.stop(grace=0)


async def test_an_s2s_call_needs_no_oracle(fakes):
    """The oracle down: tandem calls wait for it, an s2s call does not use it."""
    gateway = await fakes.gateway(oracle_address="127.0.0.1:1", readiness_interval_s=0.1)
    code, details, _ = await asyncio.to_thread(refusal, gateway.address)
    assert code == grpc.StatusCode.UNAVAILABLE and "oracle not serving" in details
    s2s = gateway_pb2.ConverseConfig(mode=gateway_pb2.ConverseConfig.S2S)
    outcome = await converse(gateway.address, frames=2, config=s2s)
    assert outcome.code == grpc.StatusCode.OK, outcome.details


class SlowHealth(health.aio.HealthServicer):
    """SERVING, but each answer takes `delay_s`: a busy host, or a channel still connecting."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def Check(self, request, context):  # noqa: N802  (gRPC method name)
        await asyncio.sleep(self.delay_s)
        return await super().Check(request, context)


async def test_a_slow_health_answer_still_counts_as_serving(fakes):
    """An stt whose health answer takes 0.8 s (longer than the check interval) is
    serving: the gateway waits for the answer as long as a connection may take,
    instead of refusing calls the stack can take (a full-suite CI run did)."""
    server = grpc.aio.server()
    stt_pb2_grpc.add_SttServicer_to_server(FakeStt(), server)
    health_pb2_grpc.add_HealthServicer_to_server(SlowHealth(0.8), server)
    stt_address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        gateway = await fakes.gateway(stt_address=stt_address, readiness_interval_s=0.2)
        assert await health_of(gateway.address) == SERVING
        outcome = await converse(gateway.address, frames=2)
        assert outcome.code == grpc.StatusCode.OK, outcome.details
    finally:
        await server.stop(grace=0)
