"""The gRPC bootstrap: health, reflection, admission and graceful drain,
with a real server on loopback (and a real SIGTERM to a real process)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kame_common.config import ServiceSettings
from kame_common.server import ServiceRuntime
from tests.support import ECHO_SERVICE, echo_handler

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class EchoSettings(ServiceSettings):
    SERVICE: ClassVar[str] = "echo"


@pytest.fixture
async def runtime():
    settings = EchoSettings(host="127.0.0.1", port=0, max_sessions=1, grace_s=5)
    runtime = ServiceRuntime(settings, [ECHO_SERVICE])
    await runtime.start(lambda server: server.add_generic_rpc_handlers([echo_handler(runtime)]))
    yield runtime
    await runtime.stop()


async def _health(channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service))).status


async def test_health_and_reflection(runtime):
    async with grpc.aio.insecure_channel(runtime.address) as channel:
        assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
        assert await _health(channel, ECHO_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request])):
            names = {s.name for s in response.list_services_response.service}
            break
    assert {ECHO_SERVICE, "grpc.health.v1.Health"} <= names


async def test_admission_limit_and_drain_waits_for_open_session(runtime):
    async with grpc.aio.insecure_channel(runtime.address) as channel:
        chat = channel.stream_stream(f"/{ECHO_SERVICE}/Chat")
        first = chat()
        await first.write(b"hello")
        assert await first.read() == b"hello"
        assert runtime.active_sessions == 1

        second = chat()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await second.read()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 1 sessions" in info.value.details()

        drain = asyncio.create_task(runtime.drain())
        await asyncio.sleep(0.2)
        assert await _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert not drain.done()  # still waiting for the open session
        await first.write(b"still served while draining")
        assert await first.read() == b"still served while draining"
        await first.done_writing()
        await asyncio.wait_for(drain, 5)
        assert runtime.active_sessions == 0


SERVER_SCRIPT = textwrap.dedent(
    """
    import asyncio
    from kame_common.config import ServiceSettings
    from kame_common.server import ServiceRuntime

    class ProbeSettings(ServiceSettings):
        SERVICE = "probe"

    async def main():
        runtime = ServiceRuntime(ProbeSettings(host="127.0.0.1", port=0, grace_s=2), [])
        await runtime.start(lambda server: None)
        print(runtime.port, flush=True)
        await runtime.serve_until_stopped()

    asyncio.run(main())
    """
)


async def test_sigterm_turns_not_serving_then_exits():
    # Popen returns once the child is forked; its output is read from a thread.
    process = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        port = int(await asyncio.to_thread(process.stdout.readline))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            os.kill(process.pid, signal.SIGTERM)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await asyncio.to_thread(process.wait, 10) == 0
    finally:
        process.kill()


async def test_a_close_hook_that_never_finishes_does_not_hold_the_shutdown(monkeypatch, caplog):
    """A hook stuck for good (a thread that never ends, a peer that never answers) is
    left behind after CLOSE_HOOK_TIMEOUT_S; the hooks registered before it still run
    and stop() returns (before, the shutdown waited for it forever)."""
    monkeypatch.setattr("kame_common.server.CLOSE_HOOK_TIMEOUT_S", 0.2)
    settings = EchoSettings(host="127.0.0.1", port=0)
    runtime = ServiceRuntime(settings, [ECHO_SERVICE])
    closed: list[str] = []

    async def release_models() -> None:
        closed.append("models")

    async def hang_forever() -> None:
        await asyncio.Event().wait()

    runtime.on_close(release_models)
    runtime.on_close(hang_forever)  # runs first: last registered
    await runtime.start(lambda server: server.add_generic_rpc_handlers([echo_handler(runtime)]))
    await asyncio.wait_for(runtime.stop(), 5)
    assert closed == ["models"]
    assert "close hook" in caplog.text and "hang_forever" in caplog.text
