"""Push-to-talk on the embedded stack (tests/e2e/conftest.py): a question typed
in MANUAL turn detection waits for RESPOND, then the agent answers it aloud,
and our STT hears Paris in the answer; a spoken one waits for END_TURN and
RESPOND."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from kame_client.events import AgentAudio, AgentText, UserFinal, UserTranscript
from kame_common.audio import SAMPLE_RATE
from kamepb import gateway_pb2
from tests.e2e.conftest import QUESTION, LiveCall, converse_config
from tests.support import conversation, wait_until, word_recall, words_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

MANUAL = gateway_pb2.ConverseConfig.TurnDetection.MANUAL


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), np.float32)


def spoken_words(call: LiveCall) -> list[str]:
    return words_of(" ".join(text.text for text in call.of(AgentText)))


async def test_a_typed_question_in_manual_mode_is_answered_when_asked(stack, transcribe):
    call = await LiveCall(stack.gateway.address, converse_config(turn_detection=MANUAL)).start()
    try:
        await call.stream(quiet(0.4))
        assert await call.client.send_text(QUESTION)
        await call.stream(quiet(3.0))
        assert [e.text for e in call.of(UserTranscript)] == [QUESTION]
        assert not any(chunk.speaking for chunk in call.of(AgentAudio)), "nobody asked yet"
        assert await call.client.respond()
        for _ in range(50):  # 20 s at most, a loaded machine included
            if "paris" in spoken_words(call):
                break
            await call.stream(quiet(0.4))
        await call.stream(quiet(2.0))  # the rest of the answer
        assert await call.finish() == grpc.StatusCode.OK
    finally:
        await call.close()
    assert "paris" in spoken_words(call), spoken_words(call)  # the agent's own text
    # Its voice said that text: most words Whisper hears in the agent's audio are in it
    # (a share with a margin, not one given word; the call may end before the answer does).
    said = " ".join(text.text for text in call.of(AgentText))
    heard = transcribe(call.agent_audio())
    assert words_of(heard) and word_recall(heard, said) >= 0.5, (said, heard)

    async def recorded() -> bool:
        turns = await conversation(stack.redis_url, call.session_id)
        return [t["role"] for t in turns][:2] == ["user", "agent"]

    await wait_until(recorded, "the typed question and its answer in Redis", 10)
    turns = await conversation(stack.redis_url, call.session_id)
    assert turns[0]["text"] == QUESTION


async def test_a_spoken_question_in_manual_mode_waits_for_end_turn_and_respond(stack, speak):
    """The real stt hears the question and finalizes it; 3 s of silence bring no
    answer; END_TURN + RESPOND do."""
    call = await LiveCall(stack.gateway.address, converse_config(turn_detection=MANUAL)).start()
    try:
        await call.stream(np.concatenate([quiet(0.3), speak(QUESTION), quiet(3.0)]))
        assert not any(chunk.speaking for chunk in call.of(AgentAudio)), "nobody asked yet"
        assert await call.client.end_turn()
        assert await call.client.respond()
        for _ in range(50):
            if spoken_words(call):
                break
            await call.stream(quiet(0.4))
        await call.stream(quiet(2.0))  # the rest of the answer
        assert await call.finish() == grpc.StatusCode.OK
    finally:
        await call.close()
    assert any(chunk.speaking for chunk in call.of(AgentAudio)), "answered at RESPOND"
    heard = " ".join(e.text for e in call.of(UserFinal))
    assert word_recall(QUESTION, heard) >= 0.6, heard  # Whisper may mishear one word
    if "france" in words_of(heard):
        assert "paris" in spoken_words(call), spoken_words(call)
