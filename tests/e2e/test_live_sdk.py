"""The official `openai` SDK's `client.live.connect()` holds spoken conversations
with the whole stack (the e2e stack of this folder's conftest) through the web
service's GPT-Live endpoint, as README's "Use it from GPT-Live clients" shows:

- responses delegation: the stack's own oracle answers a question in piper's
  voice, PCM16 at 24 kHz;
- client delegation: the test is the back-end. It answers the stack's
  delegation with a fact only it knows, and the agent says it: the stack's own
  transcript of its speech has the fact, and our STT hears the agent's audio
  say that transcript. The caller is an espeak-ng voice at 8 kHz G.711 mu-law.

Like a microphone, the client streams audio all along (the question, then
silence): the agent speaks in the caller's frames.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from openai import AsyncOpenAI

from kame_common.audio import (
    SAMPLE_RATE,
    float_to_pcm16,
    mulaw_decode,
    mulaw_encode,
    pcm16_to_float,
    resample,
)
from tests.e2e.conftest import QUESTION
from tests.support import voice_says, word_recall, words_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

ANSWER_TIMEOUT_S = 90.0
CHUNK_S = 0.1  # of caller audio one append carries, as a microphone's
PHONE_RATE = 8000
# espeak-ng's question whose topic Whisper tiny hears at 8 kHz (tests/e2e/test_conversation.py).
ESPEAK_QUESTION = "What is the capital of Germany?"


@dataclass
class Heard:
    """What a GPT-Live client got of the session."""

    question: str = ""  # the input transcript deltas, joined
    said: str = ""  # the output transcript deltas, joined
    audio: list[bytes] = field(default_factory=list)  # output audio, decoded
    delegations: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


async def microphone(connection, audio: bytes, bytes_per_s: int) -> None:
    """`audio`, then silence, appended CHUNK_S at a time at real time until cancelled."""
    chunk = int(bytes_per_s * CHUNK_S) // 2 * 2
    silence = b"\xff" * chunk if bytes_per_s == PHONE_RATE else bytes(chunk)
    pieces = [audio[i : i + chunk] for i in range(0, len(audio), chunk)]
    loop = asyncio.get_running_loop()
    started = loop.time()
    for n in range(10**6):
        piece = pieces[n] if n < len(pieces) else silence
        await connection.session.input_audio.append(audio=base64.b64encode(piece).decode())
        await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK_S - loop.time()))


@contextlib.asynccontextmanager
async def speaking(connection, audio: bytes, bytes_per_s: int) -> AsyncIterator[None]:
    task = asyncio.ensure_future(microphone(connection, audio, bytes_per_s))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def listen(connection, heard: Heard, done, decode=lambda b: b, answer=None) -> None:
    """Server events into `heard` until `done(heard)`; `answer(connection, id)` is
    called for each client delegation."""
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        async for event in connection:
            heard.kinds.append(event.type)
            if event.type == "error":
                raise AssertionError(f"the session's error: {event.error}")
            if event.type == "session.input_transcript.delta":
                heard.question += event.delta
            elif event.type == "session.output_transcript.delta":
                heard.said += event.delta
            elif event.type == "session.output_audio.delta":
                heard.audio.append(decode(base64.b64decode(event.delta)))
            elif event.type == "session.delegation.created":
                heard.delegations.append(event.delegation.id)
                if answer is not None:
                    await answer(connection, event.delegation.id)
            if done(heard):
                return


async def more_audio(connection, heard: Heard, decode, seconds: float = 1.5) -> None:
    """The agent's audio for `seconds` more: the end of the words just said."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            async for event in connection:
                if event.type == "session.output_audio.delta":
                    heard.audio.append(decode(base64.b64decode(event.delta)))


async def start(connection, session: dict, delegation: str) -> None:
    """session.start, and session.started first, with the delegation asked for."""
    await connection.session.start(session=session)
    first = await connection.recv()
    assert first.type == "session.started", first
    assert first.session.delegation.type == delegation


def agent_speech(heard: Heard, rate: int) -> np.ndarray:
    """The agent's audio at 24 kHz, for our STT."""
    samples = pcm16_to_float(b"".join(heard.audio))
    return samples if rate == SAMPLE_RATE else resample(samples, rate, SAMPLE_RATE)


async def test_responses_delegation_the_stacks_oracle_answers(web, speak, transcribe):
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{web.port}/v1", api_key="no-auth-here")
    question = float_to_pcm16(speak(QUESTION))
    heard = Heard()
    session = {
        "model": "gpt-live-1",
        "delegation": {"type": "responses", "responses": {"model": "default"}},
    }
    async with client.live.connect() as connection:
        await start(connection, session, "responses")

        def answered(h: Heard) -> bool:
            owed = "france" in words_of(h.question)  # else the model cannot know
            return len(words_of(h.said)) >= 4 and (not owed or "paris" in words_of(h.said))

        async with speaking(connection, question, 2 * SAMPLE_RATE):
            await listen(connection, heard, answered)
            await more_audio(connection, heard, lambda b: b)
        await connection.session.close()

    assert word_recall(QUESTION, heard.question) >= 0.6, heard.question
    spoken = await asyncio.to_thread(transcribe, agent_speech(heard, SAMPLE_RATE))
    print(f"asked {heard.question!r}; said {heard.said!r}; heard {spoken!r}")
    assert voice_says(heard.said, spoken), (heard.said, spoken)
    assert "session.delegation.created" not in heard.kinds  # no client is asked


async def test_client_delegation_the_test_is_the_back_end(web, espeak_questions, transcribe):
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{web.port}/v1", api_key="no-auth-here")
    caller = next(q for q in espeak_questions if q.text == ESPEAK_QUESTION)
    phone = resample(caller.audio, SAMPLE_RATE, PHONE_RATE)
    question = mulaw_encode(float_to_pcm16(phone))
    # A fact no model knows: a made-up place, so the words must come from the back-end.
    place = f"Quorvan {uuid.uuid4().hex[:4]}"
    answer = "The capital is Quorvan, by the old river."
    heard = Heard()
    session = {
        "model": "gpt-live-1",
        "audio": {"format": {"type": "audio/pcmu", "rate": PHONE_RATE}},
        "delegation": {"type": "client", "acknowledgement_delay_ms": 0},
    }

    async def back_end(connection, delegation_id: str) -> None:
        await connection.session.thinking.append(
            content=f"Looked up {place}.", delegation_id=delegation_id
        )
        await connection.session.commentary.append(content=answer, delegation_id=delegation_id)

    async with client.live.connect() as connection:
        await start(connection, session, "client")

        def answered(h: Heard) -> bool:
            return "river" in words_of(h.said)

        async with speaking(connection, question, PHONE_RATE):
            await listen(connection, heard, answered, decode=mulaw_decode, answer=back_end)
            await more_audio(connection, heard, mulaw_decode)
        await connection.session.close()

    assert heard.delegations, heard.kinds
    # The stack's own transcript of the agent's speech says the back-end's answer...
    assert word_recall(answer, heard.said) >= 0.8, heard.said
    assert "quorvan" in words_of(heard.said)
    # ...and the agent's audio says that transcript (our STT, with a margin).
    spoken = await asyncio.to_thread(transcribe, agent_speech(heard, PHONE_RATE))
    print(f"asked {heard.question!r}; said {heard.said!r}; heard {spoken!r}")
    assert voice_says(heard.said, spoken), (heard.said, spoken)
