"""stt publishes what it can serve (kame_common.capacity) and a real gateway reads it:
the real stt service, the real Redis registry, the fake frontend and oracle."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import grpc
import pytest

from kame_common import store
from kamepb import gateway_pb2, gateway_pb2_grpc, stt_pb2, stt_pb2_grpc
from services.stt.server import serve
from tests.gateway.test_admission import SECRET, refused_call
from tests.gateway.test_session import frame_bytes
from tests.stt.conftest import loopback_settings
from tests.support import wait_until

Config = gateway_pb2.ConverseConfig


def test_the_engine_measures_what_a_session_costs_at_start(stt_engine):
    """A positive share of the decode workers, small enough that a replica takes
    more than one caller on this machine (the windowed decoder costs ~0.05 s)."""
    assert 0 < stt_engine.prior_session_load < 0.5


@pytest.fixture
async def publishing_stt(fakes, stt_engine):
    """A real stt replica publishing at most one session into the fakes' registry."""
    runtime = await serve(
        loopback_settings(
            publish_capacity=True,
            redis_url=fakes.redis_url,
            registry_secret=SECRET,
            replica_id="stt-capacity-test",
            max_sessions=1,
        ),
        stt_engine,
    )
    client = store.connect(fakes.redis_url)
    registry = store.CapacityRegistry(client, "stt", secret=SECRET)
    yield runtime, registry
    await runtime.stop()
    await client.aclose()


async def _record(registry: store.CapacityRegistry) -> store.Replica | None:
    return next((r for r in await registry.replicas() if r.replica_id == "stt-capacity-test"), None)


async def test_stt_publishes_its_free_sessions_and_withdraws_on_stop(publishing_stt):
    runtime, registry = publishing_stt
    await wait_until(lambda: _record(registry), "the stt record")
    record = await _record(registry)
    assert record is not None
    assert (record.free_slots, record.total_slots) == (1, 1)
    assert record.address == f"127.0.0.1:{runtime.port}"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
        call = stt_pb2_grpc.SttStub(channel).Transcribe()
        await call.write(stt_pb2.TranscribeRequest(config=stt_pb2.SttConfig(session_id="cap")))

        async def taken() -> bool:
            now = await _record(registry)
            return now is not None and now.free_slots == 0

        await wait_until(taken, "the open session counted in the record", 5)
        await call.done_writing()
        async for _ in call:
            pass

        async def freed() -> bool:
            now = await _record(registry)
            return now is not None and now.free_slots == 1

        await wait_until(freed, "the session's end counted in the record", 5)
    await runtime.stop()
    assert await _record(registry) is None


async def test_a_gateway_refuses_a_call_the_real_stt_has_no_room_for(fakes, publishing_stt):
    runtime, registry = publishing_stt
    await wait_until(lambda: _record(registry), "the stt record")
    gateway = await fakes.gateway(stt_address=f"127.0.0.1:{runtime.port}")
    hang_up = threading.Event()
    started = threading.Event()

    def open_call() -> grpc.StatusCode:
        def requests() -> Iterator[gateway_pb2.ConverseRequest]:
            yield gateway_pb2.ConverseRequest(config=Config(mode=Config.CASCADE))
            yield gateway_pb2.ConverseRequest(audio=frame_bytes())
            hang_up.wait(10)

        with grpc.insecure_channel(gateway.address) as channel:
            call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
            for response in call:
                if response.HasField("started"):
                    started.set()
            return call.code()

    first = asyncio.ensure_future(asyncio.to_thread(open_call))
    try:
        await wait_until(started.is_set, "the first call to start")

        async def taken() -> bool:
            now = await _record(registry)
            return now is not None and now.free_slots == 0

        await wait_until(taken, "stt to publish that it is full", 5)
        code, details, trailing = await asyncio.to_thread(
            refused_call, gateway.address, Config(mode=Config.CASCADE)
        )
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "stt is at capacity" in details and trailing.get("retry-after-s")
    finally:
        hang_up.set()
    assert await first == grpc.StatusCode.OK
