"""Third-party Realtime and GPT-Live clients that nobody here wrote hold a spoken
conversation with the whole stack (the e2e stack of this folder's conftest)
through the web service's OpenAI Realtime and GPT-Live endpoints: each example
of examples/ runs in a venv of
its own (tests/clients/venvs.py: Pipecat pins protobuf 6, the stack 7), asks
a piper question from a WAV, and the answer it saved, transcribed by our STT,
has the answer in it.

One stack and web service for the module: starting the stack is the expensive
part. The venvs are built on first use and cached in ~/.cache/kame/client-venvs
(about a minute each, the first time)."""

from __future__ import annotations

import asyncio

import pytest

from tests.clients.runs import ClientRun, ask_from_wav
from tests.e2e.conftest import QUESTION
from tests.support import voice_says, word_recall, words_of

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def assert_answered(run: ClientRun, transcribe) -> None:
    """The question heard, no protocol error, and the agent's saved voice says
    what its transcript says: Paris, if the stack heard "France"."""
    assert run.returncode == 0, run
    assert run.errors == [], run
    assert word_recall(QUESTION, run.heard_question) >= 0.6, run
    assert run.said and len(run.answer) > 0, run
    heard = await asyncio.to_thread(transcribe, run.answer)
    assert voice_says(run.said, heard), (heard, str(run))
    if "france" in words_of(run.heard_question):  # else the model cannot know
        # The agent's words name Paris, and its voice says its words (above): Whisper
        # tiny alone may hear 'Paris' as 'Harris' (seen in a full run).
        assert "paris" in words_of(run.said), (heard, str(run))


async def test_pipecat_asks_a_spoken_question_and_hears_the_answer(
    web, question_wav, transcribe, tmp_path
):
    url = f"ws://127.0.0.1:{web.port}/v1/realtime"  # Pipecat adds ?model=
    run = await ask_from_wav("pipecat", "pipecat_realtime.py", url, question_wav, tmp_path)
    await assert_answered(run, transcribe)


async def test_the_openai_agents_sdk_asks_a_spoken_question_and_hears_the_answer(
    web, question_wav, transcribe, tmp_path
):
    url = f"ws://127.0.0.1:{web.port}/v1/realtime?model=kame-tandem"
    run = await ask_from_wav(
        "openai_agents", "openai_agents_realtime.py", url, question_wav, tmp_path
    )
    await assert_answered(run, transcribe)


async def test_pipecat_over_gpt_live_with_a_back_end_of_its_own(
    web, llm_url, question_wav, transcribe, tmp_path
):
    """OpenAILiveLLMService with ClientDelegation: its BackendLLMWorker (an
    OpenAI-compatible LLM service on the embedded LLM) answers the stack's
    delegation, and the agent says that answer."""
    url = f"ws://127.0.0.1:{web.port}/v1/live/sessions"
    run = await ask_from_wav(
        "pipecat", "pipecat_live.py", url, question_wav, tmp_path, "--llm-url", llm_url, quiet_s=15
    )
    assert run.returncode == 0 and run.errors == [], run
    assert word_recall(QUESTION, run.heard_question) >= 0.6, run
    assert run.backend, run  # the worker was asked, and answered
    # The agent said the worker's answer (the stack's own transcript of its speech)...
    best = max(word_recall(answer, run.said) for answer in run.backend)
    assert best >= 0.8, run
    # ...and its voice says that transcript (our STT, with a margin).
    heard = await asyncio.to_thread(transcribe, run.answer)
    assert voice_says(run.said, heard), (heard, str(run))
