"""The frontend service around its engine: stream contract errors, slots, the
capacity registry, metrics, configuration and the process entry point."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from kame_common import store
from kame_common.audio import FRAME_SAMPLES, SAMPLE_RATE, float_to_pcm16
from kame_common.config import ConfigError, load_settings
from kamepb import common_pb2, frontend_pb2, frontend_pb2_grpc
from services.frontend.config import FrontendSettings
from services.frontend.server import serve
from tests.frontend.calls import frames_of, play_call, reset, silence, transcript
from tests.support.metrics import metric

REPO = Path(__file__).resolve().parents[2]


def config_request(**fields) -> frontend_pb2.FrontendRequest:
    return frontend_pb2.FrontendRequest(config=frontend_pb2.FrontendConfig(**fields))


def audio_request(pcm: bytes, rate: int = SAMPLE_RATE) -> frontend_pb2.FrontendRequest:
    return frontend_pb2.FrontendRequest(
        audio=common_pb2.AudioFrame(pcm=pcm, sample_rate_hz=rate, seq=0)
    )


SILENT_FRAME = float_to_pcm16(np.zeros(FRAME_SAMPLES, dtype=np.float32))


async def stream_error(stub, requests: list[frontend_pb2.FrontendRequest]) -> grpc.aio.AioRpcError:
    async def feed():
        for request in requests:
            yield request

    with pytest.raises(grpc.aio.AioRpcError) as failure:
        async for _ in stub.Stream(feed()):
            pass
    return failure.value


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        (
            [frontend_pb2.FrontendRequest(oracle=reset(1))],
            "first message must be the config (FrontendConfig)",
        ),
        (
            [frontend_pb2.FrontendRequest(user_transcript=transcript("Hi.", end_s=1.0))],
            "first message must be the config (FrontendConfig)",
        ),
        ([audio_request(SILENT_FRAME)], "first message must be the config (FrontendConfig)"),
        ([config_request(), audio_request(SILENT_FRAME[:-2])], "must be 1920 samples"),
        ([config_request(), audio_request(SILENT_FRAME[:-1])], "even byte count"),
        ([config_request(), audio_request(SILENT_FRAME, rate=16_000)], "must be 24000"),
        ([config_request(), config_request()], "a second config arrived"),
        ([config_request(engine="wavenet")], "unknown engine 'wavenet'"),
        ([config_request(engine="kame")], "serves engine 'tts', not 'kame'"),
        ([config_request(voice="en_GB-alba")], "voice 'en_GB-alba' is not served"),
        ([config_request(turn_end_silence_s=-1)], "turn_end_silence_s"),
        ([config_request(hold_max_s=11)], "hold_max_s: must be 0 (the default, 5 s) to 10 seconds"),
        ([config_request(hold_delay_s=-0.1)], "hold_delay_s: must be 0 (at once) to 10 seconds"),
        ([config_request(hold_phrases=["Hmm,"] * 9)], "hold_phrases: at most 8 phrases"),
        ([config_request(hold_phrases=["Let me see " * 8])], "at most 60 characters"),
        (
            [config_request(), frontend_pb2.FrontendRequest(oracle=common_pb2.OracleUpdate())],
            "RESET or APPEND",
        ),
        (
            [config_request(), frontend_pb2.FrontendRequest(turn_control=common_pb2.TurnControl())],
            "END_TURN, RESPOND or CANCEL",
        ),
    ],
)
async def test_bad_input_is_invalid_argument(frontend_stub, requests, expected):
    error = await stream_error(frontend_stub, requests)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in error.details()


async def test_a_session_beyond_the_slots_is_resource_exhausted(frontend_settings, redis_url):
    frontend_settings.batch_slots = 1
    runtime = await serve(frontend_settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
            stub = frontend_pb2_grpc.FrontendStub(channel)
            held = stub.Stream()
            await held.write(config_request())
            assert (await held.read()).ready.engine == "tts"
            error = await stream_error(stub, [config_request()])
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await held.done_writing()
            assert await held.read() is grpc.aio.EOF
            # The slot is free again once the first session has ended.
            call = await play_call(stub, frames_of(silence(0.16)), pace_s=0.0)
            assert len(call.audio) == 2
    finally:
        await runtime.stop()


async def _replica(registry: store.CapacityRegistry, replica_id: str) -> store.Replica | None:
    return next((r for r in await registry.replicas() if r.replica_id == replica_id), None)


async def _wait_for_free_slots(registry, replica_id: str, free: int) -> store.Replica:
    for _ in range(50):
        replica = await _replica(registry, replica_id)
        if replica is not None and replica.free_slots == free:
            return replica
        await asyncio.sleep(0.05)
    raise AssertionError(f"{replica_id} never published {free} free slots: {replica}")


async def test_free_slots_are_published_and_withdrawn(frontend_settings, redis_client):
    registry = store.CapacityRegistry(redis_client, "frontend")
    frontend_settings.advertise_address = "frontend-7.test:50052"
    runtime = await serve(frontend_settings)
    replica_id = frontend_settings.replica_id
    try:
        replica = await _wait_for_free_slots(registry, replica_id, 4)
        assert replica.total_slots == 4 and replica.address == "frontend-7.test:50052"
        assert REGISTRY.get_sample_value("kame_frontend_free_slots") == 4
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
            held = frontend_pb2_grpc.FrontendStub(channel).Stream()
            await held.write(config_request())
            await held.read()
            await _wait_for_free_slots(registry, replica_id, 3)
            assert REGISTRY.get_sample_value("kame_frontend_free_slots") == 3
            await held.done_writing()
            await held.read()
        await _wait_for_free_slots(registry, replica_id, 4)
    finally:
        await runtime.stop()
    assert await _replica(registry, replica_id) is None


async def test_the_service_keeps_serving_when_redis_is_down(frontend_settings):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        frontend_settings.redis_url = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    runtime = await serve(frontend_settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
            stub = frontend_pb2_grpc.FrontendStub(channel)
            call = await play_call(stub, frames_of(silence(0.8)), pace_s=0.0)
            assert len(call.audio) == 10
    finally:
        await asyncio.wait_for(runtime.stop(), 10)


async def test_metrics_count_steps_turns_and_first_audio(frontend_stub, speak):
    steps_before = metric("kame_frontend_step_seconds_count", engine="tts")
    turns_before = metric("kame_frontend_turn_ends_total")
    first_audio_before = metric("kame_frontend_first_audio_seconds_count")
    answer_before = metric("kame_frontend_answer_seconds_count")
    holds_before = metric("kame_frontend_holds_total", outcome="answered")
    synthesis_before = metric("kame_frontend_synthesis_rtf_count")
    caller = frames_of(np.concatenate([silence(0.24), speak("Hello there."), silence(2.0)]))
    final = transcript("Hello there.", end_s=1.4)
    oracle = {3: [final, reset(1, "Hi, how can I help?", answers=final)]}
    call = await play_call(frontend_stub, caller, oracle)
    assert call.sounding_frames()
    assert metric("kame_frontend_step_seconds_count", engine="tts") - steps_before == len(caller)
    assert metric("kame_frontend_turn_ends_total") - turns_before == 1
    assert metric("kame_frontend_first_audio_seconds_count") - first_audio_before == 1
    assert metric("kame_frontend_answer_seconds_count") - answer_before == 1
    assert metric("kame_frontend_holds_total", outcome="answered") == holds_before  # no hold
    assert metric("kame_frontend_synthesis_rtf_count") > synthesis_before


def test_settings_come_from_flags_then_environment_then_defaults():
    env = {"KAME_FRONTEND_ENGINE": "moshi", "KAME_FRONTEND_BATCH_SLOTS": "8"}
    settings = load_settings(FrontendSettings, ["--batch-slots", "2"], env=env)
    assert (settings.engine, settings.batch_slots, settings.port) == ("moshi", 2, 50052)
    assert (settings.metrics_port, settings.device, settings.dtype) == (9102, "cpu", "auto")
    assert settings.resolved_advertise_address(50099) == "127.0.0.1:50099"
    assert settings.resolved_replica_id().endswith(f"-{os.getpid()}")
    with pytest.raises(ConfigError, match="engine: 'gpt' is not allowed"):
        load_settings(FrontendSettings, ["--engine", "gpt"], env={})
    with pytest.raises(ConfigError, match="dtype: 'float64' is not allowed"):
        load_settings(FrontendSettings, ["--dtype", "float64"], env={})
    with pytest.raises(ConfigError, match="batch_slots: must be at least 1"):
        load_settings(FrontendSettings, [], env={"KAME_FRONTEND_BATCH_SLOTS": "0"})


def test_a_tts_replica_never_imports_torch():
    code = (
        "import sys; from services.frontend import engines; "
        "from services.frontend.config import FrontendSettings; "
        "engine = engines.build_engine(FrontendSettings()); "
        "print(engine.name, 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split() == ["tts", "False"], result.stderr


async def _health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return (await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)).status


async def test_the_process_serves_then_drains_on_sigterm(redis_client, redis_url):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    replica_id = f"test-frontend-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "KAME_FRONTEND_PORT": str(port),
        "KAME_FRONTEND_HOST": "127.0.0.1",
        "KAME_FRONTEND_METRICS_PORT": "0",
        "KAME_FRONTEND_REDIS_URL": redis_url,
        "KAME_FRONTEND_REPLICA_ID": replica_id,
        "KAME_FRONTEND_GRACE_S": "5",
    }
    # Popen returns once the child is forked; the test then polls it.
    process = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-m", "services.frontend"],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(100):
            try:
                if await _health(port) == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the frontend never became SERVING")
        registry = store.CapacityRegistry(redis_client, "frontend")
        assert (await _wait_for_free_slots(registry, replica_id, 4)).address == f"127.0.0.1:{port}"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = await play_call(
                frontend_pb2_grpc.FrontendStub(channel), frames_of(silence(0.4)), pace_s=0.0
            )
        assert len(call.audio) == 5
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 15) == 0
        assert await _replica(registry, replica_id) is None
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stderr.close()


def test_bad_settings_exit_with_a_message():
    result = subprocess.run(
        [sys.executable, "-m", "services.frontend", "--engine", "gpt"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "engine: 'gpt' is not allowed" in result.stderr
