"""The gateway's edge against callers and upstreams that misbehave, on loopback with
the fake upstreams of test_session.py and a real gateway: input limits (idle
timeout, pace, message size, the call's cap, keys pressed), set-up deadlines
against wedged upstreams, keepalive against peers that vanish without a FIN,
connection age, round-robin balancing, a Redis that accepts connections and
never answers, and resume tokens (bound to their caller and llm override, one
call at a time, expiring)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from kame_common import store
from kame_common.audio import FRAME_SECONDS
from kame_common.auth import bearer_metadata
from kamepb import common_pb2, gateway_pb2, gateway_pb2_grpc, stt_pb2_grpc
from services.gateway import resume
from tests.gateway.fakes import FakeStt, serve_fake, sync_converse
from tests.gateway.test_resume import broken_off
from tests.gateway.test_session import Config, converse, frame_bytes, gateway_tasks, held_open
from tests.support import Blackhole, conversation, wait_until

TOKEN_A = "alpha-token-of-the-edge-tests-0123456789"
TOKEN_B = "bravo-token-of-the-edge-tests-0123456789"

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


@pytest.fixture
def frozen_heap():
    """The suite's heap out of the garbage collector's reach for one test: here the
    gateway, the fakes and the callers share one process with everything the suite
    loaded (torch, the models), whose full collection alone stalled the loop for
    0.9 s in a CI run. A gateway process of its own has a small heap."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


async def test_a_flooding_caller_is_refused_and_a_paced_caller_beside_it_is_on_time(
    fakes, frozen_heap
):
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
        gateway = await fakes.gateway(
            frontend_address=wedged.address, connect_timeout_s=0.5, readiness_interval_s=0
        )
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
            stt_address=wedged.address,
            oracle_address=wedged.address,
            drain_timeout_s=0.3,
            readiness_interval_s=0,  # the readiness check would refuse the call
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


# -- resume tokens -------------------------------------------------------------------------------

RESUME = {"resume_secret": "resume-secret-of-the-edge-tests-0123"}


def call_with_token(
    address: str,
    token: str,
    llm: gateway_pb2.LlmOverride | None = None,
    bearer: str = "",
) -> tuple[grpc.StatusCode, str, list[gateway_pb2.ConverseResponse]]:
    config = Config(resume_token=token, llm=llm)
    requests = [gateway_pb2.ConverseRequest(config=config), AUDIO]
    return sync_converse(address, requests, bearer_metadata(bearer))


@pytest.fixture
def quick_takeover(monkeypatch):
    """A resume waits 0.3 s for the call it takes over from (3 s in service)."""
    monkeypatch.setattr(resume, "TAKEOVER_WAIT_S", 0.3)


async def test_a_resume_token_cannot_join_the_call_that_still_holds_it(fakes, quick_takeover):
    """The attack: a second party with the token (a copy of the first caller's)
    used to get the same session, its conversation, beside the live call."""
    gateway = await fakes.gateway(**RESUME)
    release = asyncio.Event()
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        live = gateway_pb2_grpc.GatewayStub(channel).Converse(held_open(release, frames=0))
        token = (await live.read()).started.resume_token
        await wait_until(lambda: fakes.frontend.log.opened == 1, "the first call's frontend", 5)
        code, details, _ = await asyncio.to_thread(call_with_token, gateway.address, token)
        assert code == grpc.StatusCode.UNAVAILABLE, details
        assert "the session is live in another call" in details
        assert fakes.frontend.log.opened == 1  # refused before any upstream
        live.cancel()  # the first call breaks off
    # Once that call has ended, the token continues the session.
    code, details, responses = await asyncio.to_thread(call_with_token, gateway.address, token)
    assert code == grpc.StatusCode.OK, details
    assert responses[0].started.resumed


async def test_a_resume_takes_over_from_a_call_whose_gateway_died(fakes, quick_takeover):
    """A dead gateway cannot release its lease: it expires (here: written by hand
    with 0.2 s left) and the resume waits for that, up to its takeover wait."""
    gateway = await fakes.gateway(**RESUME)
    started = await broken_off(fakes, gateway.address)
    client = store.connect(fakes.redis_url)
    try:
        sessions = store.SessionStore(client)
        await take_lease(sessions, started.session_id, ttl_s=0.2)
        resumed = await broken_off(
            fakes, gateway.address, Config(resume_token=started.resume_token)
        )
        assert resumed.resumed
        await take_lease(sessions, started.session_id, ttl_s=60)
        code, details, _ = await asyncio.to_thread(
            call_with_token, gateway.address, resumed.resume_token
        )
        assert code == grpc.StatusCode.UNAVAILABLE and "retry in" in details
    finally:
        await client.delete(f"kame:lease:{started.session_id}")
        await client.aclose()


async def take_lease(sessions: store.SessionStore, session_id: str, ttl_s: float) -> None:
    """Hold the session's lease as a gateway that then died would (once the call
    before has released it: that happens just after the call's end)."""
    for _ in range(50):
        if await sessions.hold_lease(session_id, "a-dead-gateway", ttl_s):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the lease was never released")


async def test_a_resume_token_works_only_for_the_caller_it_was_issued_to(fakes):
    """The attack: a token leaked from one customer's calls (logs, a shared
    client) used to resume that customer's conversation on another token."""
    gateway = await fakes.gateway(auth_tokens=f"{TOKEN_A},{TOKEN_B}", **RESUME)
    started = await broken_off(fakes, gateway.address, bearer=TOKEN_A)
    token = started.resume_token
    await wait_until_bound(fakes, started.session_id)
    code, details, _ = await asyncio.to_thread(
        call_with_token, gateway.address, token, bearer=TOKEN_B
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "started by another caller" in details
    code, details, _ = await asyncio.to_thread(
        call_with_token, gateway.address, token, bearer=TOKEN_A
    )
    assert code == grpc.StatusCode.OK, details


async def test_a_resume_cannot_switch_the_llm_override(fakes):
    """The attack: resume a session with an override naming another endpoint, so
    the conversation so far goes there."""
    gateway = await fakes.gateway(**RESUME)
    first = await converse(gateway.address, frames=1)
    started = first.of("started")[0]
    await wait_until_bound(fakes, started.session_id)
    elsewhere = gateway_pb2.LlmOverride(base_url="https://collector.example/v1", api_key="sk-x")
    code, details, _ = await asyncio.to_thread(
        call_with_token, gateway.address, started.resume_token, elsewhere
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "keeps the llm override it started with" in details
    assert fakes.oracle.log.opened == 1  # the oracle never saw the new endpoint


async def test_a_token_expires_resume_ttl_s_after_its_session_was_last_alive(fakes):
    gateway = await fakes.gateway(resume_ttl_s=0.3, **RESUME)
    first = await converse(gateway.address, frames=1)
    await asyncio.sleep(0.5)
    code, details, _ = await asyncio.to_thread(
        call_with_token, gateway.address, first.of("started")[0].resume_token
    )
    assert code == grpc.StatusCode.NOT_FOUND and "expired" in details


async def wait_until_bound(fakes, session_id: str) -> None:
    """A new session's binding is written in the background: wait for it."""
    record: dict[str, str] = {}

    async def bound() -> bool:
        record.update(await fakes.session_record(session_id))
        return resume.PRINCIPAL_FIELD in record

    for _ in range(50):
        if await bound():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"session {session_id} was never bound: {record}")


# -- holding a slot without talking --------------------------------------------------------------


async def test_a_caller_that_never_reads_is_cut_at_max_session_s(fakes):
    """The attack: send audio, never read the answers. The session blocks on its
    output, where no input limit looks, and used to hold its frontend slot forever."""
    fakes.frontend.log.expect_cancellation()
    gateway = await fakes.gateway(max_session_s=2.0, drain_timeout_s=0.5, idle_timeout_s=0)
    # The largest answers there are (192 kHz PCM16, 30 KB a frame) fill the flow
    # control windows toward the caller at once.
    large = gateway_pb2.AudioFormat(codec=gateway_pb2.AudioFormat.PCM16, sample_rate_hz=192_000)

    async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest(config=Config(output_format=large))
        for _ in range(24):  # 1.92 s of audio: under the cap of caller audio
            yield AUDIO
        await asyncio.Event().wait()

    # No BDP probing: the window toward the caller stays at 64 KB and fills at once.
    options = [("grpc.http2.bdp_probe", 0)]
    async with grpc.aio.insecure_channel(gateway.address, options=options) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
        await wait_until(lambda: gateway.active_sessions == 1, "the session to start", 5)
        started = time.monotonic()
        await wait_until(lambda: gateway.active_sessions == 0, "the cap to end the call", 6)
        assert time.monotonic() - started < 4.0
        await fakes.frontend.log.cancelled(5)
        call.cancel()


async def test_a_key_flood_is_dropped_bounded_and_masked(fakes):
    """The attack: thousands of keys pressed. They used to be echoed, kept in the
    record digit by digit (PINs included) and logged one turn each."""
    gateway = await fakes.gateway()

    async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest(config=Config(mode=Config.S2S))
        yield AUDIO
        for _ in range(2000):
            yield gateway_pb2.ConverseRequest(dtmf=common_pb2.Dtmf(digit="7"))
        yield AUDIO

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
        responses = [response async for response in call]
    echoed = [r for r in responses if r.HasField("dtmf")]
    assert 10 <= len(echoed) <= 15  # the burst of 10, then 5 a second
    session_id = responses[0].started.session_id
    record = await fakes.session_record(session_id)
    assert record["dtmf"] == "*" * len(echoed)
    turns = await conversation(fakes.redis_url, session_id)
    assert [(t["role"], t["text"]) for t in turns] == [("user", f"(pressed {len(echoed)} keys)")]
