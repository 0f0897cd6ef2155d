"""Fixtures for the frontend tests: a real frontend server on a loopback port,
a client that plays a scripted call into it at real time, and faster-whisper
(the embedded tiny.en model) to hear what the agent said."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from kame_common.audio import (
    FRAME_SAMPLES,
    FRAME_SECONDS,
    SAMPLE_RATE,
    float_to_pcm16,
    pcm16_to_float,
    resample,
    rms_dbfs,
)
from kame_common.models import whisper_tiny_en_dir
from kamepb import common_pb2, frontend_pb2, frontend_pb2_grpc
from services.frontend.config import FrontendSettings
from services.frontend.server import FrontendRuntime, serve

# A frame quieter than this holds no speech (used to find where speech starts and ends).
SILENT_DB = -60.0


@pytest.fixture
def frontend_settings(redis_url) -> FrontendSettings:
    return FrontendSettings(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        redis_url=redis_url,
        replica_id=f"test-frontend-{uuid.uuid4().hex[:8]}",
        batch_slots=4,
    )


@pytest.fixture
async def frontend(frontend_settings) -> FrontendRuntime:
    runtime = await serve(frontend_settings)
    yield runtime
    await runtime.stop()


@pytest.fixture
async def frontend_stub(frontend):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{frontend.port}") as channel:
        yield frontend_pb2_grpc.FrontendStub(channel)


# --- building calls ---


def frames_of(signal: np.ndarray) -> list[np.ndarray]:
    """Split a signal into 80 ms frames, zero-padding the last one."""
    count = -(-len(signal) // FRAME_SAMPLES)
    padded = np.zeros(count * FRAME_SAMPLES, dtype=np.float32)
    padded[: len(signal)] = signal
    return list(padded.reshape(count, FRAME_SAMPLES))


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds / FRAME_SECONDS) * FRAME_SAMPLES, dtype=np.float32)


def speech_frames(frames: list[np.ndarray]) -> list[int]:
    """Indices of the frames that hold sound."""
    return [i for i, frame in enumerate(frames) if rms_dbfs(frame) > SILENT_DB]


def reset(generation: int) -> common_pb2.OracleUpdate:
    return common_pb2.OracleUpdate(op=common_pb2.OracleUpdate.RESET, generation=generation)


def append(generation: int, text: str) -> common_pb2.OracleUpdate:
    return common_pb2.OracleUpdate(
        op=common_pb2.OracleUpdate.APPEND, generation=generation, text=text
    )


@dataclass
class Call:
    """What came back from one Frontend.Stream."""

    ready: frontend_pb2.FrontendReady | None = None
    audio: list[frontend_pb2.AgentAudio] = field(default_factory=list)
    words: list[common_pb2.AgentText] = field(default_factory=list)

    def agent_frames(self) -> list[np.ndarray]:
        return [pcm16_to_float(a.frame.pcm) for a in self.audio]

    def agent_signal(self, from_frame: int = 0) -> np.ndarray:
        frames = self.agent_frames()[from_frame:]
        return np.concatenate(frames) if frames else np.zeros(0, dtype=np.float32)

    def sounding_frames(self) -> list[int]:
        """Indices of agent frames that carry sound (not just the speaking flag)."""
        return speech_frames(self.agent_frames())

    def words_of(self, generation: int) -> list[common_pb2.AgentText]:
        return [w for w in self.words if w.generation == generation]


async def play_call(
    stub: frontend_pb2_grpc.FrontendStub,
    caller: list[np.ndarray],
    oracle: dict[int, list[common_pb2.OracleUpdate]] | None = None,
    config: frontend_pb2.FrontendConfig | None = None,
    pace_s: float = FRAME_SECONDS,
) -> Call:
    """Send the config, then caller frame i every `pace_s` (real time by default,
    so synthesis gets the wall time it would get in a call), each preceded by the
    oracle updates scheduled for it; collect everything the frontend answers."""
    oracle = oracle or {}
    config = config or frontend_pb2.FrontendConfig(session_id=f"test-{uuid.uuid4().hex[:8]}")

    async def requests():
        yield frontend_pb2.FrontendRequest(config=config)
        started = time.monotonic()
        for i, frame in enumerate(caller):
            for update in oracle.get(i, []):
                yield frontend_pb2.FrontendRequest(oracle=update)
            yield frontend_pb2.FrontendRequest(
                audio=common_pb2.AudioFrame(
                    pcm=float_to_pcm16(frame),
                    sample_rate_hz=SAMPLE_RATE,
                    seq=i,
                    capture_time_us=time.time_ns() // 1000,
                )
            )
            await asyncio.sleep(max(0.0, started + (i + 1) * pace_s - time.monotonic()))

    call = Call()
    async for response in stub.Stream(requests()):
        kind = response.WhichOneof("msg")
        if kind == "ready":
            call.ready = response.ready
        elif kind == "audio":
            call.audio.append(response.audio)
        else:
            call.words.append(response.text)
    return call


# --- hearing the agent ---


def words_in(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


@pytest.fixture(scope="session")
def transcribe() -> Callable[[np.ndarray], str]:
    """transcribe(signal at 24 kHz) -> text, with faster-whisper tiny.en."""
    from faster_whisper import WhisperModel

    model = WhisperModel(str(whisper_tiny_en_dir()), device="cpu", compute_type="int8",
                         cpu_threads=2)

    def _transcribe(signal: np.ndarray) -> str:
        audio = resample(signal, SAMPLE_RATE, 16_000)
        segments, _ = model.transcribe(audio, language="en", beam_size=5, vad_filter=False)
        return " ".join(segment.text for segment in segments)

    return _transcribe
