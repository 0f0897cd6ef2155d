"""The engine watchdog on a real ServiceRuntime, asked over gRPC health as a
probe would: a step that does not come back turns the replica NOT_SERVING,
steps that complete turn it back, a drain is never undone."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from kame_common.server import ServiceRuntime
from services.frontend.config import FrontendSettings
from services.frontend.watchdog import EngineWatchdog
from tests.support import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STALL_S = 0.3


@pytest.fixture
async def watched():
    settings = FrontendSettings(host="127.0.0.1", port=0, metrics_port=0)
    runtime = ServiceRuntime(settings, [])
    await runtime.start(lambda server: None)
    watchdog = EngineWatchdog(runtime, STALL_S)
    watchdog.start()
    async with grpc.aio.insecure_channel(runtime.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def health() -> int:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            return reply.status

        yield runtime, watchdog, health
    await runtime.stop()


async def wedged_step(watchdog: EngineWatchdog, release: asyncio.Event) -> None:
    """A step whose engine does not answer until `release`."""
    with watchdog.step():
        await release.wait()


def stalled_gauge() -> float | None:
    return REGISTRY.get_sample_value("kame_frontend_engine_stalled")


async def test_a_step_that_does_not_come_back_turns_the_replica_not_serving(watched):
    _runtime, watchdog, health = watched
    assert await health() == SERVING
    release = asyncio.Event()
    step = asyncio.ensure_future(wedged_step(watchdog, release))

    async def not_serving() -> bool:
        return await health() == NOT_SERVING

    await wait_until(not_serving, "NOT_SERVING", 3)
    assert watchdog.oldest_step_s() > STALL_S and stalled_gauge() == 1
    release.set()
    await step

    async def serving() -> bool:
        return await health() == SERVING

    await wait_until(serving, "SERVING again", 3)
    assert stalled_gauge() == 0


async def test_steps_that_complete_keep_it_serving(watched):
    _runtime, watchdog, health = watched
    for _ in range(40):  # 1.2 s of 30 ms steps: longer than the stall time, none stalled
        with watchdog.step():
            await asyncio.sleep(0.03)
    assert not watchdog.stalled and await health() == SERVING


async def test_a_draining_replica_stays_not_serving_when_steps_resume(watched):
    runtime, watchdog, health = watched
    release = asyncio.Event()
    step = asyncio.ensure_future(wedged_step(watchdog, release))
    await wait_until(lambda: watchdog.stalled, "the stall", 3)
    runtime.draining = True  # what drain() does first
    release.set()
    await step
    await wait_until(lambda: not watchdog.stalled, "steps to resume", 3)
    assert await health() == NOT_SERVING
