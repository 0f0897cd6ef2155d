"""End to end through the gRPC frontend service running the kame engine on the
tiny random checkpoint: real speech frames in, one agent frame out per frame in,
oracle text over the wire, a burst cut back by the jitter buffer, free slots in
Redis, RESOURCE_EXHAUSTED when full."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from kame_common import store
from kame_common.audio import FRAME_BYTES, FRAME_SECONDS, SAMPLE_RATE, float_to_pcm16
from kamepb import common_pb2, frontend_pb2, frontend_pb2_grpc
from services.frontend.config import FrontendSettings
from services.frontend.server import serve
from tests.support import wait_until

SLOTS = 2
# Deep enough that no frame is dropped however fast a test sends them (the
# service reads frames ahead of their ticks).
NO_DROPS = 64


@pytest.fixture
def jitter_frames() -> int:
    return NO_DROPS


@contextlib.asynccontextmanager
async def kame_service(checkpoint_dir: Path, redis_url: str, jitter_frames: int = NO_DROPS):
    settings = FrontendSettings(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        engine="kame",
        checkpoint=str(checkpoint_dir),
        batch_slots=SLOTS,
        jitter_frames=jitter_frames,
        redis_url=redis_url,
        replica_id=f"test-kame-{uuid.uuid4().hex[:8]}",
    )
    runtime = await serve(settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
            yield runtime, settings, frontend_pb2_grpc.FrontendStub(channel)
    finally:
        await runtime.stop()


@pytest.fixture
async def kame_frontend(tiny_checkpoint, redis_url, jitter_frames):
    async with kame_service(tiny_checkpoint, redis_url, jitter_frames) as served:
        yield served


def config_request(engine: str = "kame") -> frontend_pb2.FrontendRequest:
    return frontend_pb2.FrontendRequest(
        config=frontend_pb2.FrontendConfig(session_id=f"test-{uuid.uuid4().hex[:8]}", engine=engine)
    )


def audio_request(seq: int, frame: np.ndarray) -> frontend_pb2.FrontendRequest:
    return frontend_pb2.FrontendRequest(
        audio=common_pb2.AudioFrame(
            pcm=float_to_pcm16(frame),
            sample_rate_hz=SAMPLE_RATE,
            seq=seq,
            capture_time_us=time.time_ns() // 1000 + seq,
        )
    )


def oracle_request(op, generation: int, text: str = "") -> frontend_pb2.FrontendRequest:
    return frontend_pb2.FrontendRequest(
        oracle=common_pb2.OracleUpdate(op=op, generation=generation, text=text)
    )


async def test_speech_in_one_agent_frame_out_per_frame(
    kame_frontend, speak, to_frames, redis_client
):
    _runtime, settings, stub = kame_frontend
    frames = to_frames(speak("What is the capital of France? I forgot."), 30)
    oracle_at = {
        6: oracle_request(common_pb2.OracleUpdate.RESET, 1),
        8: oracle_request(common_pb2.OracleUpdate.APPEND, 1, "the capital"),
        12: oracle_request(common_pb2.OracleUpdate.APPEND, 1, "of france is paris"),
    }

    audio_in = [audio_request(seq, frame) for seq, frame in enumerate(frames)]

    async def requests():
        yield config_request()
        for seq, request in enumerate(audio_in):
            if seq in oracle_at:
                yield oracle_at[seq]
            yield request

    responses = [response async for response in stub.Stream(requests())]
    ready = responses[0].ready
    audio = [r.audio for r in responses if r.WhichOneof("msg") == "audio"]
    assert responses[0].WhichOneof("msg") == "ready"
    assert ready.engine == "kame" and 0 <= ready.slot < SLOTS
    assert ready.replica_id == settings.replica_id
    assert [a.frame.seq for a in audio] == list(range(len(frames)))
    assert all(
        len(a.frame.pcm) == FRAME_BYTES and a.frame.sample_rate_hz == SAMPLE_RATE for a in audio
    )
    assert [a.frame.capture_time_us for a in audio] == [
        request.audio.capture_time_us for request in audio_in
    ]
    assert all(a.step_s > 0 for a in audio)
    # The first frame only fills the model's acoustic delay; after it, Mimi speaks.
    assert not audio[0].speaking and not any(audio[0].frame.pcm)
    assert sum(any(a.frame.pcm) for a in audio[1:]) == len(frames) - 1
    for text in (r.text for r in responses if r.WhichOneof("msg") == "text"):
        assert text.text and 0 <= text.start_s < text.end_s

    replicas = await store.CapacityRegistry(redis_client, "frontend").replicas()
    mine = [r for r in replicas if r.replica_id == settings.replica_id]
    assert mine and mine[0].total_slots == SLOTS


@pytest.mark.parametrize("jitter_frames", [2])
async def test_a_burst_of_frames_is_cut_back_to_the_jitter_buffer(kame_frontend, speak, to_frames):
    """Frames that come faster than the 80 ms clock (a backlog after a stall) are
    read ahead, and a full jitter buffer drops the oldest: each still gets its
    answer, in order, silent, and the call does not stay behind by the backlog."""
    _runtime, _settings, stub = kame_frontend
    frames = to_frames(speak("What is the capital of France? I forgot."), 12)
    dropped_before = dropped_frames()

    async def requests():
        yield config_request()
        for seq, frame in enumerate(frames):
            yield audio_request(seq, frame)

    responses = [response async for response in stub.Stream(requests())]
    audio = [r.audio for r in responses if r.WhichOneof("msg") == "audio"]
    assert [a.frame.seq for a in audio] == list(range(len(frames)))
    dropped = dropped_frames() - dropped_before
    # All 12 arrive within a tick or so: the buffer keeps 2, one or two more may
    # have been taken by ticks while they came in.
    assert len(frames) - 4 <= dropped <= len(frames) - 2
    assert not any(any(a.frame.pcm) for a in audio[: int(dropped)])
    # The frames kept were stepped: the session's first step fills the acoustic
    # delay (silence), the next speaks.
    assert any(audio[-1].frame.pcm)


def dropped_frames() -> float:
    labels = {"engine": "kame"}
    return REGISTRY.get_sample_value("kame_frontend_jitter_dropped_frames_total", labels) or 0.0


async def published_free_slots(redis_client, replica_id: str, want: int) -> int | None:
    """The replica's free slots in the capacity registry, once they read `want` (2 s max)."""
    registry = store.CapacityRegistry(redis_client, "frontend")
    free = None
    for _ in range(100):
        free = next(
            (r.free_slots for r in await registry.replicas() if r.replica_id == replica_id), None
        )
        if free == want:
            break
        await asyncio.sleep(0.02)
    return free


async def test_all_slots_busy_is_resource_exhausted(kame_frontend, redis_client):
    _runtime, settings, stub = kame_frontend
    release = asyncio.Event()

    async def held_open():
        yield config_request()
        await release.wait()

    holders = [stub.Stream(held_open()) for _ in range(SLOTS)]
    for call in holders:
        assert (await call.read()).WhichOneof("msg") == "ready"
    assert REGISTRY.get_sample_value("kame_frontend_free_slots") == 0
    assert REGISTRY.get_sample_value("kame_frontend_free_slots") == 0
    assert await published_free_slots(redis_client, settings.replica_id, 0) == 0

    async def one_more():
        yield config_request()

    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _ in stub.Stream(one_more()):
            pass
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "batch slots" in error.value.details()
    release.set()
    for call in holders:
        while await call.read() != grpc.aio.EOF:
            pass
    await wait_until(
        lambda: REGISTRY.get_sample_value("kame_frontend_free_slots") == SLOTS, "free slots", 1
    )
    assert await published_free_slots(redis_client, settings.replica_id, SLOTS) == SLOTS


async def words_around_the_end(stub, frames) -> tuple[list, list]:
    """The AgentText of a stream of `frames`: those before its last agent frame,
    and those after it (sent once the input ended). Each frame is sent once the
    one before it has its agent frame: the service reads frames ahead of the
    engine's ticks, so oracle updates sent ahead would overtake them."""
    call = stub.Stream()
    await call.write(config_request())
    responses = []
    for seq, frame in enumerate(frames):
        # A new oracle before every frame makes the random model end words often.
        await call.write(oracle_request(common_pb2.OracleUpdate.RESET, seq + 1, "paris"))
        await call.write(audio_request(seq, frame))
        while (response := await call.read()).WhichOneof("msg") != "audio":
            responses.append(response)
        responses.append(response)
    await call.done_writing()
    while (response := await call.read()) != grpc.aio.EOF:
        responses.append(response)
    kinds = [response.WhichOneof("msg") for response in responses]
    last_audio = len(kinds) - 1 - kinds[::-1].index("audio")
    texts = [(index, r.text) for index, r in enumerate(responses) if kinds[index] == "text"]
    return (
        [text for index, text in texts if index < last_audio],
        [text for index, text in texts if index > last_audio],
    )


async def test_the_last_word_is_sent_when_the_input_ends(
    tiny_checkpoint, tmp_path, redis_url, speak, to_frames
):
    """A stream cut right after a word's last piece still sends that word, after
    its last agent frame. Sampling only the top token makes the engine
    deterministic, so a longer stream shows which word that is."""
    directory = tmp_path / "top-1"
    shutil.copytree(tiny_checkpoint, directory)
    config = json.loads((directory / "config.json").read_text())
    config["lm_gen_config"] = {"top_k": 1, "top_k_text": 1}
    (directory / "config.json").write_text(json.dumps(config))
    frames = to_frames(speak("Tell me about the moon landing."), 16)
    async with kame_service(directory, redis_url) as (_runtime, _settings, stub):
        during, _after = await words_around_the_end(stub, frames)
        assert during
        last = during[-1]
        cut = round(last.end_s / FRAME_SECONDS)  # the frames up to its last piece
        short_during, short_after = await words_around_the_end(stub, frames[:cut])
    assert short_during == during[:-1]
    assert short_after == [last]
