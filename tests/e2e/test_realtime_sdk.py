"""The official `openai` SDK holds a spoken conversation with the whole stack (the
e2e stack of this folder's conftest) through the web service's OpenAI Realtime
endpoint, as README's "Use it from the OpenAI SDK" shows: a question (in
piper's voice, and in an espeak-ng voice that does not sound like the agent)
appended at once, the agent's answer back as responses, and that audio,
transcribed by our STT, has the answer in it."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass

import numpy as np
import pytest
from openai import AsyncOpenAI

from kame_common.audio import float_to_pcm16, pcm16_to_float
from tests.e2e.conftest import QUESTION
from tests.support import word_recall, words_of

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

ANSWER_TIMEOUT_S = 90.0
# Whisper tiny hears "Washington" in piper's voice; it took "Berlin" for "Roland".
ESPEAK_QUESTION = "Who was the first president of the United States?"
TYPED_QUESTION = "What is the capital of Germany?"
# The silence between two responses is not sent: put some back, so that the STT
# does not hear a hold phrase run into the answer ("Hmm,Paris" heard as "eris").
BETWEEN_RESPONSES = bytes(2 * 24000 * 3 // 10)


@dataclass(frozen=True)
class Caller:
    """A spoken question, the word of it the agent needs to hear, and its answer."""

    text: str
    audio: np.ndarray  # float32 at 24 kHz
    topic: str
    answer: str


@pytest.fixture(params=["piper", "espeak-ng"])
def caller(request, speak, espeak_questions) -> Caller:
    if request.param == "piper":
        return Caller(QUESTION, speak(QUESTION), "france", "Paris")
    question = next(q for q in espeak_questions if q.text == ESPEAK_QUESTION)
    return Caller(question.text, question.audio, "president", "Washington")


async def test_the_openai_sdk_asks_a_spoken_question_and_hears_the_answer(web, caller, transcribe):
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{web.port}/v1", api_key="no-auth-here")
    question = float_to_pcm16(caller.audio)  # PCM16 at 24 kHz: the session's default
    heard_question, said, audio = "", [], []
    async with client.realtime.connect(model="kame-tandem") as connection:
        await connection.input_audio_buffer.append(audio=base64.b64encode(question).decode())
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            async for event in connection:
                if event.type == "conversation.item.input_audio_transcription.completed":
                    heard_question = event.transcript
                elif event.type == "response.created":
                    audio.append(BETWEEN_RESPONSES)
                elif event.type == "response.output_audio.delta":
                    audio.append(base64.b64decode(event.delta))
                elif event.type == "response.done":
                    said.append(event.response.output[0].content[0].transcript)
                if answered(caller, heard_question, " ".join(said)):
                    break

    assert word_recall(caller.text, heard_question) >= 0.6, heard_question
    agent = pcm16_to_float(b"".join(audio))
    heard = await asyncio.to_thread(transcribe, agent)
    print(f"asked {heard_question!r}; said {said}; heard {heard!r}")
    assert word_recall(" ".join(said), heard) >= 0.5, (said, heard)
    if caller.topic in words_of(heard_question):  # else the model cannot know
        # In the agent's words, which its voice says (above): Whisper tiny alone may
        # mishear one name under load.
        assert caller.answer.lower() in words_of(" ".join(said)), (said, heard)


def answered(caller: Caller, question: str, said: str) -> bool:
    """The agent has answered `question`: with the answer, if it heard the topic;
    anything else."""
    if not question or not said:
        return False
    return caller.topic not in words_of(question) or caller.answer.lower() in words_of(said)


async def test_push_to_talk_and_a_typed_message_get_spoken_answers(web, speak, transcribe):
    """turn_detection null: the client commits its spoken question and asks for the
    answer (response.create); then it types the next one, and asks again."""
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{web.port}/v1", api_key="no-auth-here")
    question = float_to_pcm16(speak(QUESTION))
    push_to_talk = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    typed = {"type": "input_text", "text": TYPED_QUESTION}
    async with client.realtime.connect(model="kame-tandem") as connection:
        await connection.session.update(session=push_to_talk)
        await connection.input_audio_buffer.append(audio=base64.b64encode(question).decode())
        await connection.input_audio_buffer.commit()
        await connection.response.create()
        spoken = await answer_of(connection, "Paris")
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [typed]}
        )
        await connection.response.create()
        written = await answer_of(connection, "Berlin")

    for (said, audio), answer in ((spoken, "Paris"), (written, "Berlin")):
        heard = await asyncio.to_thread(transcribe, pcm16_to_float(audio))
        print(f"said {said!r}; heard {heard!r}")
        assert answer.lower() in words_of(said), said
        assert word_recall(said, heard) >= 0.5, (said, heard)  # the audio says the words


async def answer_of(connection, answer: str) -> tuple[str, bytes]:
    """The agent's words and audio until a response has `answer` in it."""
    said, audio = "", []
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        async for event in connection:
            if event.type == "response.created":
                audio.append(BETWEEN_RESPONSES)
            elif event.type == "response.output_audio.delta":
                audio.append(base64.b64decode(event.delta))
            elif event.type == "response.done":
                said += " " + event.response.output[0].content[0].transcript
                if answer.lower() in words_of(said):
                    return said.strip(), b"".join(audio)
    raise AssertionError("no answer")  # asyncio.timeout raises first
