"""Fixtures for the frontend tests: a real frontend server on a loopback port,
the Smart Turn model and Whisper tiny.en's word times (the `transcribe`
fixture that hears the agent lives in tests/conftest.py).
The call-playing client lives in calls.py."""

from __future__ import annotations

import uuid

import grpc
import numpy as np
import pytest

from kame_common import turn_model
from kame_common.models import ModelNotInstalled
from kame_common.server import ServiceRuntime
from kame_common.turn_model import SmartTurn
from kamepb import frontend_pb2_grpc
from services.frontend.config import FrontendSettings
from services.frontend.server import serve


@pytest.fixture(scope="session")
def smart_turn() -> SmartTurn:
    try:
        path = turn_model.smart_turn_path()
    except ModelNotInstalled:
        from kame_cli import smart_turn_model

        try:
            smart_turn_model.install(turn_model.default_model_path())
        except smart_turn_model.FetchError as exc:
            pytest.skip(f"the Smart Turn model cannot be fetched here: {exc}")
        path = turn_model.smart_turn_path()
    return SmartTurn(path)


@pytest.fixture(scope="session")
def word_times():
    """word_times(audio at 16 kHz) -> [(start_s, end_s)] of each word, by Whisper
    tiny.en (the STT's embedded model): where to cut a question between words."""
    from faster_whisper import WhisperModel

    from kame_common.models import whisper_tiny_en_dir

    model = WhisperModel(
        str(whisper_tiny_en_dir()), device="cpu", compute_type="int8", cpu_threads=1
    )

    def times(audio: np.ndarray) -> list[tuple[float, float]]:
        segments, _ = model.transcribe(audio, beam_size=1, word_timestamps=True)
        return [(w.start, w.end) for s in segments for w in (s.words or [])]

    return times


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
async def frontend(frontend_settings) -> ServiceRuntime:
    runtime = await serve(frontend_settings)
    yield runtime
    await runtime.stop()


@pytest.fixture
async def frontend_stub(frontend):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{frontend.port}") as channel:
        yield frontend_pb2_grpc.FrontendStub(channel)
