"""The gateway's input limits (services/gateway/pacing.py) alone: the real-time
budget on a hand-driven clock, audio durations of every input format (Opus
packets made by the real encoder), the size and pace checks and their
messages, the idle timeout and call cap of the wrapped request stream, and the
rate of keys pressed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from kame_client.codecs import AudioFormat, Encoder
from kame_common.audio import SAMPLE_RATE
from kamepb import common_pb2, gateway_pb2
from services.gateway.pacing import (
    OPUS_MAX_BYTES_PER_S,
    InputGuard,
    InputLimits,
    KeyRate,
    RealTimeBudget,
    audio_seconds,
    limit_input,
    max_message_bytes,
    opus_packet_seconds,
)
from services.gateway.plan import SessionError
from tests.support.clock import FakeClock

PCM_16K = AudioFormat("pcm16", 16_000)
MULAW = AudioFormat("mulaw", 8_000)
OPUS = AudioFormat("opus", 48_000)
LIMITS = InputLimits(idle_timeout_s=10.0, input_burst_s=2.0, max_chunk_s=1.0)


def test_the_budget_admits_real_time_plus_the_burst_and_no_more():
    clock = FakeClock()
    budget = RealTimeBudget(burst_s=2.0, clock=clock)
    assert budget.admit(1.5)  # the first chunk starts the clock
    assert budget.admit(0.5)  # 2.0 s at t=0: the whole burst
    assert not budget.admit(0.08)  # a frame more is ahead of real time
    assert budget.received_s == pytest.approx(2.0)  # a refused chunk counts nothing
    clock.now += 1.0
    assert budget.admit(1.0)
    assert not budget.admit(0.01)


def test_a_backlog_after_a_stall_is_admitted_and_a_steady_flood_is_not():
    """After the gateway stalled for 5 s the caller's backlog arrives at once: that is
    real time, not a flood. Twice real time is refused once it is the burst ahead."""
    clock = FakeClock()
    steady = RealTimeBudget(burst_s=2.0, clock=clock)
    assert steady.admit(0.08)
    clock.now += 5.0
    assert all(steady.admit(0.08) for _ in range(62))  # 5 s of backlog

    clock = FakeClock()
    flood = RealTimeBudget(burst_s=2.0, clock=clock)
    refused_at = None
    for _ in range(200):
        if not flood.admit(0.08):
            refused_at = clock.now - 100.0
            break
        clock.now += 0.04  # a frame every 40 ms: twice real time
    assert refused_at == pytest.approx(2.0, abs=0.05)  # 4 s of audio in 2 s


def opus_packets(seconds: float) -> list[bytes]:
    encoder = Encoder(OPUS)
    tone = 0.3 * np.sin(np.arange(int(seconds * SAMPLE_RATE)) * 2 * np.pi * 440 / SAMPLE_RATE)
    return encoder.encode(tone.astype(np.float32)) + encoder.flush()


def test_audio_seconds_of_every_format():
    assert audio_seconds(bytes(32_000), PCM_16K) == pytest.approx(1.0)
    assert audio_seconds(bytes(800), MULAW) == pytest.approx(0.1)
    assert audio_seconds(bytes(800), AudioFormat("alaw", 8_000)) == pytest.approx(0.1)
    packets = opus_packets(1.6)
    assert sum(audio_seconds(p, OPUS) for p in packets) == pytest.approx(1.6, abs=0.2)
    assert {opus_packet_seconds(p) for p in packets[:-1]} == {0.08}


@pytest.mark.parametrize(
    ("packet", "seconds"),
    [
        (bytes([0b11111_000]), 0.02),  # CELT 20 ms, one frame
        (bytes([0b00011_001]), 0.12),  # SILK 60 ms, two frames
        (bytes([0b10000_011, 48]), 0.12),  # CELT 2.5 ms, 48 frames
        (bytes([0b00011_011, 3]), 0.0),  # 3 x 60 ms: over 120 ms, cannot be valid
        (bytes([0b11111_011, 0]), 0.0),  # no frames
        (bytes([0b11111_011]), 0.0),  # the frame count byte is missing
        (b"", 0.0),
    ],
)
def test_opus_durations_from_the_toc(packet, seconds):
    assert opus_packet_seconds(packet) == pytest.approx(seconds)


def test_the_size_cap_is_one_second_of_the_input_format():
    assert InputGuard(PCM_16K, LIMITS).max_chunk_bytes == 32_000
    assert InputGuard(MULAW, LIMITS).max_chunk_bytes == 8_000
    assert InputGuard(OPUS, LIMITS).max_chunk_bytes == OPUS_MAX_BYTES_PER_S
    # The client port's gRPC limit fits the largest format's second, and no more.
    assert 2 * 192_000 < max_message_bytes(1.0) < 2 * 192_000 + 4096
    guard = InputGuard(MULAW, LIMITS, FakeClock())
    guard.check(bytes(8_000))
    with pytest.raises(SessionError) as refused:
        guard.check(bytes(8_001))
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.message == (
        "audio chunk 1 has 8001 bytes; mulaw at 8000 Hz allows 8000 bytes "
        "(1 s, max_chunk_s) per message"
    )


def test_a_flood_is_refused_naming_the_burst_and_pacing_can_be_off():
    clock = FakeClock()
    guard = InputGuard(PCM_16K, LIMITS, clock)
    second = bytes(32_000)
    guard.check(second)
    guard.check(second)
    with pytest.raises(SessionError) as refused:
        guard.check(second)
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "faster than real time: 3.00 s of audio in 0.00 s" in refused.value.message
    assert "real time plus 2 s (input_burst_s)" in refused.value.message
    unpaced = InputGuard(PCM_16K, InputLimits(10.0, 0.0, 1.0), clock)
    for _ in range(100):
        unpaced.check(second)


async def test_the_idle_timeout_ends_a_stalled_stream_and_spares_a_flowing_one():
    async def stalls_after(count: int) -> AsyncIterator[gateway_pb2.ConverseRequest]:
        for _ in range(count):
            yield gateway_pb2.ConverseRequest(audio=bytes(1600))
            await asyncio.sleep(0.01)
        await asyncio.Event().wait()

    limits = InputLimits(idle_timeout_s=0.2, input_burst_s=2.0, max_chunk_s=1.0)
    received = []
    with pytest.raises(SessionError) as idle:
        async for request in limit_input(stalls_after(5), PCM_16K, limits):
            received.append(request)
    assert len(received) == 5
    assert idle.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert idle.value.message == "no audio from the caller for 0.2 s (idle_timeout_s)"

    async def ends() -> AsyncIterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest()  # not audio: passed on for the session to judge
        yield gateway_pb2.ConverseRequest(audio=bytes(1600))

    passed = [r async for r in limit_input(ends(), PCM_16K, limits)]
    assert [r.WhichOneof("msg") for r in passed] == [None, "audio"]


KEY = gateway_pb2.ConverseRequest(dtmf=common_pb2.Dtmf(digit="1"))


async def every(interval_s: float, request: gateway_pb2.ConverseRequest, first: int = 0):
    """`first` frames of real audio, then `request` every `interval_s`, forever."""
    for _ in range(first):
        yield gateway_pb2.ConverseRequest(audio=bytes(2560))  # 80 ms at 16 kHz
    while True:
        await asyncio.sleep(interval_s)
        yield request


async def run_limited(requests, limits: InputLimits) -> tuple[SessionError, int]:
    """How the limits end an endless stream (within 3 s), and how many requests passed."""
    passed = 0
    with pytest.raises(SessionError) as ended:
        async with asyncio.timeout(3.0):
            async for _ in limit_input(requests, PCM_16K, limits):
                passed += 1
    return ended.value, passed


@pytest.mark.parametrize(
    "keepalive",
    [
        gateway_pb2.ConverseRequest(audio=b""),  # no samples
        gateway_pb2.ConverseRequest(audio=bytes(2)),  # one sample
        KEY,
    ],
    ids=["empty", "one-sample", "dtmf"],
)
async def test_empty_audio_tiny_audio_and_keys_do_not_keep_a_call_alive(keepalive):
    """The attack: a message far more often than the idle timeout, none with a
    frame of audio. It used to reset the timeout each time, holding the call
    (and its frontend slot) forever."""
    limits = InputLimits(idle_timeout_s=0.3, input_burst_s=2.0, max_chunk_s=1.0, dtmf_per_s=50)
    error, passed = await run_limited(every(0.05, keepalive, first=2), limits)
    assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert passed < 2 + 12  # cut after about 0.3 s of them (6), not fed forever


async def test_a_call_ends_at_max_session_s_whatever_it_sends():
    """Real audio all along (the idle timeout is no help): the wall-clock cap ends it."""
    frame = gateway_pb2.ConverseRequest(audio=bytes(2560))
    limits = InputLimits(idle_timeout_s=0.2, input_burst_s=0.0, max_chunk_s=1.0, max_session_s=0.4)
    loop = asyncio.get_running_loop()
    started = loop.time()
    error, _ = await run_limited(every(0.02, frame), limits)
    assert error.code == grpc.StatusCode.OUT_OF_RANGE
    assert error.message == "the session reached its cap of 0.4 s (max_session_s)"
    assert 0.35 < loop.time() - started < 1.0


async def test_keys_beyond_the_rate_are_dropped_not_refused():
    async def flood():
        yield gateway_pb2.ConverseRequest(audio=bytes(2560))
        for _ in range(200):
            yield KEY
        await asyncio.sleep(0.5)  # the bucket refills: 5 keys a second
        for _ in range(10):
            yield KEY

    limits = InputLimits(10.0, 2.0, 1.0, dtmf_per_s=5.0, dtmf_burst=10)
    passed = [r.WhichOneof("msg") async for r in limit_input(flood(), PCM_16K, limits)]
    assert passed.count("dtmf") in (12, 13)  # the burst, then about 2.5 more


def test_the_key_bucket_refills_at_its_rate():
    clock = FakeClock()
    keys = KeyRate(per_s=2.0, burst=3, clock=clock)
    assert [keys.admit() for _ in range(4)] == [True, True, True, False]
    clock.now += 1.0
    assert [keys.admit() for _ in range(3)] == [True, True, False]
    assert all(KeyRate(per_s=0, burst=1, clock=clock).admit() for _ in range(100))
