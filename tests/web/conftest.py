"""Fixtures of the web tests: a real gateway that refuses calls because the stack is full."""

from __future__ import annotations

import pytest

from kame_common import store
from tests.gateway.test_admission import SECRET as FAKES_REGISTRY_SECRET


@pytest.fixture
async def busy_gateway(fakes):
    """The address of a real gateway (capacity admission on, its default) whose Redis
    registry says stt is full: it refuses every call with RESOURCE_EXHAUSTED and
    `retry-after-s`, as a stack still starting or at capacity does."""
    client = store.connect(fakes.redis_url)
    stt = store.CapacityRegistry(client, "stt", secret=FAKES_REGISTRY_SECRET)
    await stt.publish("stt-full", "10.0.0.1:50053", free_slots=0, total_slots=3)
    try:
        yield (await fakes.gateway()).address
    finally:
        await stt.withdraw("stt-full")
        await client.aclose()
