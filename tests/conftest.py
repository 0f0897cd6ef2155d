"""Fixtures shared by every test: the real Redis, the piper voice that makes
caller speech, and unique ids so tests never share Redis keys."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from kame_common import store
from kame_common.voice import Voice, load_voice

REDIS_URL = os.environ.get("KAME_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture
async def redis_client(redis_url):
    client = store.connect(redis_url)
    await client.ping()
    yield client
    await client.aclose()


@pytest.fixture
def session_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def voice() -> Voice:
    return load_voice()


@pytest.fixture(scope="session")
def speak(voice):
    """speak(text) -> float32 speech at 24 kHz, synthesized once per text."""
    cache: dict[str, np.ndarray] = {}

    def _speak(text: str) -> np.ndarray:
        if text not in cache:
            cache[text] = voice.synthesize(text)
        return cache[text]

    return _speak
