"""The gateway's edge against callers and upstreams that misbehave, on loopback with
the fake upstreams of test_session.py and a real gateway: input limits (idle
timeout, pace, message size), set-up deadlines against wedged upstreams, keepalive
against peers that vanish without a FIN, connection age, round-robin balancing,
and a Redis that accepts connections and never answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from kame_common.audio import FRAME_SECONDS
from kamepb import gateway_pb2, gateway_pb2_grpc, stt_pb2_grpc
from tests.gateway.fakes import FakeStt, serve_fake, sync_converse
from tests.gateway.test_session import Config, converse, frame_bytes, gateway_tasks
from tests.support import Blackhole, wait_until

AUDIO = gateway_pb2.ConverseRequest(audio=frame_bytes())


async def hold_after_config(address: str, frames: int = 0) -> tuple[grpc.StatusCode, str, float]:
    """Config, `frames` frames, then nothing (the line stays open): the status the
    gateway ends the call with and how long after the last message it came."""
    sent_last = time.monotonic()

    async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
        nonlocal sent_last
        yield gateway_pb2.ConverseRequest(config=Config())
        for _ in range(frames):
            yield AUDIO
        sent_last = time.monotonic()
        await asyncio.Event().wait()

    async with grpc.aio.insecure_channel(address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for _ in call:
                pass
        return await call.code(), await call.details() or "", time.monotonic() - sent_last


def flood(address: str, frames: int) -> tuple[grpc.StatusCode, str, int]:
    """A caller that sends `frames` frames as fast as gRPC takes them: its status and
    how many agent frames came back."""
    requests = [gateway_pb2.ConverseRequest(config=Config()), *[AUDIO] * frames]
    code, details, responses = sync_converse(address, requests)
    return code, details, sum(1 for r in responses if r.HasField("audio"))


@pytest.mark.parametrize("frames", [0, 5])
async def test_a_caller_that_stalls_is_cut_after_the_idle_timeout_and_frees_its_slot(fakes, frames):
    fakes.frontend.log.expect_cancellation()
    gateway = await fakes.gateway(idle_timeout_s=0.5, max_sessions=1)
    code, details, waited = await hold_after_config(gateway.address, frames)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert details == "no audio from the caller for 0.5 s (idle_timeout_s)"
    assert 0.4 < waited < 3.0
    await fakes.frontend.log.cancelled(5)  # the frontend slot is free
    await wait_until(lambda: gateway.active_sessions == 0, "the gateway session to close", 2)
    # The next caller is admitted (max_sessions=1). Its own status is not what is tested:
    # on a loaded machine its client thread may take more than the 0.5 s idle timeout
    # between two frames (seen once in a full run), and then it is cut the same way.
    again = await converse(gateway.address, frames=3)
    assert again.code != grpc.StatusCode.RESOURCE_EXHAUSTED, again.details
    assert again.of("started")


async def test_a_flooding_caller_is_refused_and_a_paced_caller_beside_it_is_on_time(fakes):
    gateway = await fakes.gateway(input_burst_s=1.0)

    async def paced_call() -> list[float]:
        """25 frames at real time; per agent frame, how late it came after its caller
        frame was due (kame bench's frame lag)."""
        arrivals: list[float] = []

        async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
            yield gateway_pb2.ConverseRequest(config=Config())
            for index in range(25):  # each frame once its last sample is "spoken"
                await asyncio.sleep(start + (index + 1) * FRAME_SECONDS - time.monotonic())
                yield AUDIO

        async with grpc.aio.insecure_channel(gateway.address) as channel:
            call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
            start = time.monotonic()
            async for response in call:
                if response.HasField("audio"):
                    arrivals.append(time.monotonic() - start)
                    flowing.set()
            assert await call.code() == grpc.StatusCode.OK
        return [t - (k + 1) * FRAME_SECONDS for k, t in enumerate(arrivals)]

    flowing = asyncio.Event()
    normal = asyncio.create_task(paced_call())
    # The floods start once the normal call's voice flows: what is checked is the
    # voice path during a flood (the session's opening shares this one process's
    # loop with the flooders' and the fakes').
    await asyncio.wait_for(flowing.wait(), 5)
    floods = []
    while not normal.done():  # flooders keep coming back while the normal call lasts
        floods.append(await asyncio.to_thread(flood, gateway.address, 200))
    lags = await normal
    assert len(lags) == 25
    # A voice path that waits on the flooders is late on most frames; a loaded
    # 2-core machine alone failed the old bound (at most 1) once; the bench
    # measures lateness.
    late = sum(lag > FRAME_SECONDS for lag in lags)
    assert late <= 3, f"{late} of 25 frames late: {np.round(lags, 3)}"
    assert floods
    for code, details, frames_back in floods:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "real time plus 1 s (input_burst_s)" in details
        # Cut after about the burst ahead of real time (1 s of audio and what real
        # time added while it was sent), far from its 16 s.
        assert frames_back < 40


async def test_a_message_over_a_second_of_audio_is_refused(fakes):
    gateway = await fakes.gateway()
    mulaw = gateway_pb2.AudioFormat(codec=gateway_pb2.AudioFormat.MULAW)
    config = Config(input_format=mulaw, output_format=mulaw)

    async def call_with(chunk: bytes) -> tuple[grpc.StatusCode, str]:
        async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
            yield gateway_pb2.ConverseRequest(config=config)
            yield gateway_pb2.ConverseRequest(audio=chunk)

        async with grpc.aio.insecure_channel(gateway.address) as channel:
            call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for _ in call:
                    pass
            return await call.code(), await call.details() or ""

    assert (await call_with(bytes(8000)))[0] == grpc.StatusCode.OK  # one second: allowed
    code, details = await call_with(bytes(8001))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "allows 8000 bytes (1 s, max_chunk_s) per message" in details
    # Past the largest second of any format, gRPC refuses before the message is whole.
    code, details = await call_with(bytes(1024 * 1024))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details


async def test_a_wedged_frontend_cannot_hang_call_set_up(fakes):
    """A frontend address that accepts TCP and never speaks HTTP/2: the set-up
    deadline covers connecting, sending the config and the ready."""
    wedged = Blackhole()
    try:
        gateway = await fakes.gateway(frontend_address=wedged.address, connect_timeout_s=0.5)
        started = time.monotonic()
        outcome = await converse(gateway.address, frames=3)
        assert outcome.code == grpc.StatusCode.UNAVAILABLE
        assert "did not start the session within 0.5 s" in outcome.details
        assert time.monotonic() - started < 3.0
    finally:
        wedged.close()


async def test_wedged_side_services_do_not_delay_the_call(fakes):
    """stt and oracle that accept TCP and never answer: the call starts and its
    frames come back at once (their streams open off the set-up path)."""
    wedged = Blackhole()
    try:
        gateway = await fakes.gateway(
            stt_address=wedged.address, oracle_address=wedged.address, drain_timeout_s=0.3
        )
        started = time.monotonic()
        outcome = await converse(gateway.address, frames=10, pace_s=0.02)
        assert outcome.code == grpc.StatusCode.OK, outcome.details
        assert len(outcome.of("audio")) == 10
        assert time.monotonic() - started < 3.0
    finally:
        wedged.close()


@pytest.mark.parametrize("keepalive_s", [0.5, 0.0])
async def test_a_caller_that_vanishes_is_cut_by_keepalive(fakes, keepalive_s):
    """The caller's packets stop (no FIN, no RST): with keepalive the gateway ends
    the session within about time + timeout and the frontend slot is free; without
    it (0: gRPC's default of 2 h) the session holds its slot."""
    fakes.frontend.log.expect_cancellation()
    gateway = await fakes.gateway(
        keepalive_time_s=keepalive_s, keepalive_timeout_s=0.5, idle_timeout_s=0
    )
    proxy = Blackhole(gateway.address)
    call_task = asyncio.create_task(hold_after_config(proxy.address, frames=2))
    try:
        await wait_until(lambda: gateway.active_sessions == 1, "the session to start", 5)
        await wait_until(lambda: fakes.frontend.log.opened == 1, "the frontend stream", 5)
        proxy.freeze()
        if keepalive_s:
            await wait_until(lambda: gateway.active_sessions == 0, "keepalive to cut it", 10)
            await fakes.frontend.log.cancelled(5)
        else:
            await asyncio.sleep(3.0)
            assert gateway.active_sessions == 1
    finally:
        call_task.cancel()
        proxy.close()


async def test_an_upstream_that_vanishes_is_cut_by_the_channels_keepalive(fakes):
    proxy = Blackhole(fakes.addresses["frontend"])
    try:
        gateway = await fakes.gateway(
            frontend_address=proxy.address, keepalive_time_s=0.5, keepalive_timeout_s=0.5
        )

        async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
            yield gateway_pb2.ConverseRequest(config=Config())
            for _ in range(300):
                yield AUDIO
                await asyncio.sleep(FRAME_SECONDS)

        async with grpc.aio.insecure_channel(gateway.address) as channel:
            call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
            assert (await call.read()).HasField("started")
            assert (await call.read()).HasField("audio")
            proxy.freeze()
            frozen_at = time.monotonic()
            with contextlib.suppress(grpc.aio.AioRpcError):
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert await call.code() == grpc.StatusCode.UNAVAILABLE
            assert "the frontend failed" in await call.details()
            assert time.monotonic() - frozen_at < 8.0
    finally:
        proxy.close()


async def test_calls_outlive_the_connection_age_unless_the_grace_ends_them(fakes):
    """max_connection_age_s sends GOAWAY so clients reconnect for new calls; the
    calls open on the old connection go on (grace 0 = to their end), or are cut
    when the grace is shorter."""
    # A call cut with its connection ends UNAVAILABLE, or INTERNAL ("Internal error
    # from Core") when gRPC's core sees the connection close under the stream first.
    cut = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL}
    for grace_s, expected in ((0.0, {grpc.StatusCode.OK}), (0.3, cut)):
        gateway = await fakes.gateway(max_connection_age_s=0.3, max_connection_age_grace_s=grace_s)
        outcome = await converse(gateway.address, frames=20, pace_s=FRAME_SECONDS)
        assert outcome.code in expected, (grace_s, outcome.details)
        if grace_s == 0.0:
            assert len(outcome.of("audio")) == 20
        else:
            assert len(outcome.of("audio")) < 20
        await gateway.stop()


async def test_sessions_spread_over_every_address_of_an_upstream(fakes):
    """Round robin: a target with two stt addresses gets sessions on both (the
    default pick_first would send every session to the first)."""
    second = FakeStt()
    server, address = await serve_fake(stt_pb2_grpc.add_SttServicer_to_server, second)
    try:
        target = f"ipv4:{fakes.addresses['stt']},{address}"
        gateway = await fakes.gateway(stt_address=target)
        for _ in range(4):
            assert (await converse(gateway.address, frames=2)).code == grpc.StatusCode.OK
        assert fakes.stt.log.opened >= 1 and second.log.opened >= 1
        assert fakes.stt.log.opened + second.log.opened == 4
    finally:
        await server.stop(grace=0)


async def seconds_to_start(address: str) -> float:
    """From sending the config to SessionStarted; then the caller hangs up."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse()
        began = time.monotonic()
        await call.write(gateway_pb2.ConverseRequest(config=Config()))
        assert (await call.read()).HasField("started")
        took = time.monotonic() - began
        call.cancel()
        return took


async def test_a_redis_that_never_answers_does_not_stall_the_call(fakes):
    hung = Blackhole()
    try:
        gateway = await fakes.gateway(redis_url=f"redis://{hung.address}/0")
        started = time.monotonic()
        outcome = await converse(gateway.address, frames=25, pace_s=0.02)
        took = time.monotonic() - started
        assert outcome.code == grpc.StatusCode.OK, outcome.details
        assert len(outcome.of("audio")) == 25
        # Set-up waited for the registry (1 s at most), the end for the records' flush
        # (2 s at most).
        assert took < 0.5 + 1.0 + 2.0 + 1.5, took
        assert hung.accepted  # the gateway did try its Redis
        # The registry failed: the next set-ups skip it for a while.
        assert await seconds_to_start(gateway.address) < 0.5
        await wait_until(lambda: not gateway_tasks(), "the session's tasks to end", 5)
    finally:
        hung.close()
