"""Fixtures for the frontend tests: a real frontend server on a loopback port
and faster-whisper (the embedded tiny.en model) to hear what the agent said.
The call-playing client lives in calls.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from kame_common.audio import SAMPLE_RATE, resample
from kame_common.models import whisper_tiny_en_dir
from kamepb import frontend_pb2_grpc
from services.frontend.config import FrontendSettings
from services.frontend.server import FrontendRuntime, serve


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
