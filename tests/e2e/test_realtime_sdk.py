"""The official `openai` SDK holds a spoken conversation with the whole stack (the
e2e stack of this folder's conftest) through the web service's OpenAI Realtime
endpoint, as README's "Use it from the OpenAI SDK" shows: a question (in
piper's voice, and in an espeak-ng voice that does not sound like the agent)
appended at once, the agent's answer back as responses, and that audio,
transcribed by our STT, has the answer in it. Then push-to-talk and a typed
message; then a caller who talks over the agent (barge-in), truncates what it
did not hear, and cancels a response."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

import numpy as np
import pytest
from openai import AsyncOpenAI

from kame_client.microphone import until_spoken
from kame_common.audio import SAMPLE_RATE, float_to_pcm16, pcm16_to_float
from tests.e2e.conftest import QUESTION
from tests.support import voice_says, word_recall, words_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

ANSWER_TIMEOUT_S = 90.0
# Whisper tiny hears "Washington" in piper's voice; it took "Berlin" for "Roland".
ESPEAK_QUESTION = "Who was the first president of the United States?"
TYPED_QUESTION = "What is the capital of Germany?"
# The silence between two responses is not sent: put some back, so that the STT
# does not hear a hold phrase run into the answer ("Hmm,Paris" heard as "eris").
BETWEEN_RESPONSES = bytes(2 * 24000 * 3 // 10)
# An answer long enough to be talked over (test_web_page.py: a dozen words).
LONG_QUESTION = "Can you describe the Eiffel Tower?"
# Asked over the agent in an espeak-ng voice; unlike the first president (Gemma 270M
# once said Jefferson after the tower), one the model answers after the tower.
TALKED_OVER_WITH = "What is the capital of Germany?"
LONG_REQUEST = "Tell me a long story about a brave knight and a dragon."
# Of the agent's answer heard before the caller talks over it: past its first phrase,
# after which a loaded machine may leave a gap (the next one is not synthesized yet).
TALK_OVER_AFTER_S = 2.0
CHUNK_S = 0.1  # of caller audio a microphone's append carries


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
    assert voice_says(" ".join(said), heard), (said, heard)
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
        # Paris is owed only if our stt heard France (Whisper tiny heard 'friends' on
        # an AVX2-only CPU); otherwise the first answer will do.
        spoken = await answer_of(connection, "Paris", owed_if_heard="France")
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [typed]}
        )
        await connection.response.create()
        written = await answer_of(connection, "Berlin")

    for (said, audio, owed), answer in ((spoken, "Paris"), (written, "Berlin")):
        heard = await asyncio.to_thread(transcribe, pcm16_to_float(audio))
        print(f"said {said!r}; heard {heard!r}")
        assert not owed or answer.lower() in words_of(said), said
        assert voice_says(said, heard), (said, heard)  # the audio says the words


async def answer_of(connection, answer: str, owed_if_heard: str = "") -> tuple[str, bytes, bool]:
    """The agent's words and audio until a response has `answer` in it, and whether it
    was owed: with `owed_if_heard`, a question transcribed without that word is
    owed no particular answer, and the first response ends the wait."""
    said, audio, owed = "", [], True
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        async for event in connection:
            if event.type == "conversation.item.input_audio_transcription.completed":
                owed = not owed_if_heard or owed_if_heard.lower() in words_of(event.transcript)
            elif event.type == "response.created":
                audio.append(BETWEEN_RESPONSES)
            elif event.type == "response.output_audio.delta":
                audio.append(base64.b64decode(event.delta))
            elif event.type == "response.done":
                said += " " + event.response.output[0].content[0].transcript
                if answer.lower() in words_of(said) or not owed:
                    return said.strip(), b"".join(audio), owed
    raise AssertionError("no answer")  # asyncio.timeout raises first


async def test_talking_over_the_agent_cancels_its_response_and_the_next_question_is_answered(
    web, speak, espeak_questions
):
    """Barge-in: a second spoken question, appended at real time while the agent is
    answering the first, is speech_started and the response under way ends
    cancelled (turn_detected); the client truncates the agent's item to the audio
    it played; the second question gets its answer. Then response.cancel stops
    the answer to a typed request (client_cancelled)."""
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{web.port}/v1", api_key="no-auth-here")
    spoken = next(q for q in espeak_questions if q.text == TALKED_OVER_WITH)
    second = Caller(spoken.text, spoken.audio, "germany", "Berlin")
    first = base64.b64encode(float_to_pcm16(speak(LONG_QUESTION))).decode()
    async with client.realtime.connect(model="kame-tandem") as connection:
        events = Recorded(connection)
        await connection.input_audio_buffer.append(audio=first)
        at, talked_over = await events.wait(
            lambda e: (
                e.type == "response.output_audio.delta"
                and events.audio_s(e.response_id) >= TALK_OVER_AFTER_S
            )
        )
        talking = asyncio.create_task(append_in_real_time(connection, second.audio))
        started, _ = await events.wait(lambda e: e.type == "input_audio_buffer.speech_started", at)
        done_at, done = await events.wait(
            lambda e: e.type == "response.done" and e.response.id == talked_over.response_id, at
        )
        played_ms = int(events.audio_s(talked_over.response_id) * 1000)  # as it came
        await connection.conversation.item.truncate(
            item_id=talked_over.item_id, content_index=0, audio_end_ms=played_ms
        )
        _, truncated = await events.wait(lambda e: e.type == "conversation.item.truncated", done_at)
        heard_question, said = await events.answer(second, at, talked_over.response_id)
        await talking
        typed = {"type": "input_text", "text": LONG_REQUEST}
        request = {"id": "item_long_request", "type": "message", "role": "user", "content": [typed]}
        await connection.conversation.item.create(item=request)
        asked_at, _ = await events.wait(
            lambda e: e.type == "conversation.item.done" and e.item.id == request["id"], done_at
        )
        _, answering = await events.wait(lambda e: e.type == "response.created", asked_at)
        speaking_at, _ = await events.wait(
            lambda e: (
                e.type == "response.output_audio.delta" and e.response_id == answering.response.id
            ),
            asked_at,
        )
        await connection.response.cancel()
        _, cancelled = await events.wait(
            lambda e: e.type == "response.done" and e.response.id == answering.response.id,
            speaking_at,
        )
        await events.close()

    assert (truncated.item_id, truncated.audio_end_ms) == (talked_over.item_id, played_ms)
    assert word_recall(second.text, heard_question) >= 0.6, heard_question
    print(f"talked over at {played_ms} ms: {described(done)}; asked {heard_question!r}; ", end="")
    print(f"said {said!r}")
    if second.topic in words_of(heard_question):  # else the model cannot know
        assert second.answer.lower() in words_of(said), said
    assert (cancelled.response.status, cancelled.response.status_details.reason) == (
        "cancelled",
        "client_cancelled",
    ), described(cancelled)
    assert started < done_at, f"speech_started came after {described(done)}"
    assert (done.response.status, done.response.status_details.reason) == (
        "cancelled",
        "turn_detected",
    ), described(done)


async def append_in_real_time(connection: Any, audio: np.ndarray) -> None:
    """`audio` appended as a microphone gives it: CHUNK_S at a time, once spoken."""
    pcm = float_to_pcm16(audio)
    size = 2 * int(CHUNK_S * SAMPLE_RATE)
    start = time.monotonic()
    for index, offset in enumerate(range(0, len(pcm), size)):
        await until_spoken(start, index, CHUNK_S)
        chunk = base64.b64encode(pcm[offset : offset + size]).decode()
        await connection.input_audio_buffer.append(audio=chunk)


@dataclass
class Recorded:
    """Every server event of a connection, read in the background, and the audio
    of each response; an `error` event fails the test."""

    connection: Any
    seen: list[Any] = field(default_factory=list)
    audio: dict[str, bytearray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.connection:
            if event.type == "response.output_audio.delta":
                self.audio.setdefault(event.response_id, bytearray())
                self.audio[event.response_id] += base64.b64decode(event.delta)
            self.seen.append(event)
            self._arrived.set()

    def audio_s(self, response_id: str) -> float:
        return len(self.audio.get(response_id, b"")) / (2 * SAMPLE_RATE)

    async def wait(self, matches: Callable[[Any], bool], since: int = 0) -> tuple[int, Any]:
        """The index and the first event from `since` on that `matches`."""
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                while True:
                    self._arrived.clear()
                    for index in range(since, len(self.seen)):
                        event = self.seen[index]
                        assert event.type != "error", event.error
                        if matches(event):
                            return index, event
                    since = len(self.seen)
                    assert not self._reader.done(), "the connection closed"
                    await self._arrived.wait()
        except TimeoutError:
            raise AssertionError(f"not come; what came: {self.kinds()}") from None

    def kinds(self) -> str:
        """The events seen: their types, a run of one counted, with what was heard
        and said and how each response ended."""
        runs = [(kind, len(list(group))) for kind, group in groupby(self.seen, described)]
        return ", ".join(kind if count == 1 else f"{kind} x{count}" for kind, count in runs)

    async def answer(self, caller: Caller, since: int, talked_over: str) -> tuple[str, str]:
        """What was heard of the caller and what the agent said, from
        `since` until the agent has answered the caller (`answered`); the response
        the caller talked over is no answer."""

        def matches(event: Any) -> bool:
            if event.type == "response.done":
                return bool(event.response.id != talked_over)
            return bool(event.type == "conversation.item.input_audio_transcription.completed")

        heard: list[str] = []
        said: list[str] = []
        while True:
            since, event = await self.wait(matches, since)
            since += 1
            if event.type == "response.done":
                said.append(event.response.output[0].content[0].transcript)
            elif event.transcript:
                heard.append(event.transcript)
                said.clear()  # what the agent said before it heard the caller
            if answered(caller, " ".join(heard), " ".join(said)):
                return " ".join(heard), " ".join(said)

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def described(event: Any) -> str:
    if event.type == "response.done":
        response = event.response
        said = response.output[0].content[0].transcript if response.output else ""
        return f"response.done ({response.status}: {said!r})"
    if event.type == "conversation.item.input_audio_transcription.completed":
        return f"{event.type} ({event.transcript!r})"
    return str(event.type)
