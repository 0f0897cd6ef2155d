"""kyutai's own Moshi client (`moshi.client`, as `python -m moshi.client` runs
it) holds a spoken conversation with the whole stack (the e2e stack of this
folder's conftest) through the web service's /api/chat: a piper question
into its microphone, the agent's words and audio back over the Moshi
protocol, and that audio, transcribed by our STT, has the answer in it.
PortAudio is not installed here, so its sound card is the stand-in of
tests/web/test_moshi_chat.py (real time, the client's own callbacks)."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.conftest import QUESTION, latest_caller_words
from tests.support import voice_says, word_recall, words_of
from tests.web.test_moshi_chat import SoundCard, moshi_client, run_moshi_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

ANSWER_TIMEOUT_S = 90.0


async def test_moshis_client_asks_a_spoken_question_and_hears_the_answer(
    web, speak, transcribe, monkeypatch, e2e_redis_url
):
    card = SoundCard(speak(QUESTION))  # 24 kHz: the Moshi protocol's rate
    client = moshi_client(monkeypatch, card)

    said = await run_moshi_client(
        client, web.port, lambda words: "paris" in words_of(words), ANSWER_TIMEOUT_S, tail_s=3.0
    )

    heard = await asyncio.to_thread(transcribe, card.heard())
    print(f"moshi's client printed {said!r}; our STT hears {heard!r}")
    # The Moshi protocol carries no caller transcript: what our stt heard is read
    # from the call's Redis conversation; Paris is owed only if it heard France
    # (Whisper tiny heard 'friends' in a full run on a busy host).
    question = await latest_caller_words(e2e_redis_url)
    assert word_recall(QUESTION, question) >= 0.6, question
    if "france" in words_of(question):
        assert "paris" in words_of(said), said  # the agent's words, as moshi's client printed them
    assert voice_says(said, heard), (said, heard)  # ... are what its audio says
