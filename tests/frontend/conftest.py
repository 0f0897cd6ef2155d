"""Fixtures for the frontend tests: a real frontend server on a loopback port
(the `transcribe` fixture that hears the agent lives in tests/conftest.py).
The call-playing client lives in calls.py."""

from __future__ import annotations

import uuid

import grpc
import pytest

from kame_common.server import ServiceRuntime
from kamepb import frontend_pb2_grpc
from services.frontend.config import FrontendSettings
from services.frontend.server import serve


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
