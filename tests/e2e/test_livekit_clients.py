"""LiveKit Agents' realtime plugins, run as their users run them, hold a spoken
conversation with the whole stack (the e2e stack of this folder's conftest):
examples/livekit_realtime.py (the OpenAI Realtime plugin, through the web
service's /v1/realtime), examples/livekit_live.py (its GPT-Live model, through
/v1/live/sessions, the example being the back-end) and
examples/livekit_personaplex.py (NVIDIA's PersonaPlex plugin, the Moshi
protocol, through /api/chat), each in the
"livekit" venv (tests/clients/venvs.py), each session driven without a LiveKit
server. Each asks a piper question from a WAV, and the agent's voice it saved,
transcribed by our STT, has the answer in it.

A stack of its own for this module (test_ecosystem_clients.py has another):
one start serves both plugins. The venv is built on first use and cached in
~/.cache/kame/client-venvs (about 40 s the first time)."""

from __future__ import annotations

import asyncio

import pytest

from tests.clients.runs import ClientRun, ask_from_wav, write_wav
from tests.e2e.conftest import QUESTION, latest_caller_words
from tests.support import voice_says, word_recall, words_of

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def heard_answer(run: ClientRun, transcribe) -> str:
    """What our STT hears in the agent's saved voice, once the run is known to be
    clean and to have words that voice should carry."""
    assert run.returncode == 0, run
    assert run.errors == [], run
    assert run.said and len(run.answer) > 0, run
    heard = await asyncio.to_thread(transcribe, run.answer)
    assert voice_says(run.said, heard), (heard, str(run))
    return heard


async def test_livekit_openai_realtime_plugin_asks_a_spoken_question_and_hears_the_answer(
    web, question_wav, transcribe, tmp_path
):
    url = f"http://127.0.0.1:{web.port}/v1"  # the plugin adds /realtime?model=
    run = await ask_from_wav("livekit", "livekit_realtime.py", url, question_wav, tmp_path)
    heard = await heard_answer(run, transcribe)
    assert word_recall(QUESTION, run.heard_question) >= 0.6, run
    if "france" in words_of(run.heard_question):  # else the model cannot know
        # The agent's words name Paris, and its voice says its words (above): Whisper
        # tiny alone may hear 'Paris' as 'Harris' (seen in a full run).
        assert "paris" in words_of(run.said), (heard, str(run))


async def test_livekit_personaplex_plugin_asks_a_spoken_question_and_hears_the_answer(
    web, question_wav, transcribe, tmp_path, e2e_redis_url
):
    url = f"ws://127.0.0.1:{web.port}"  # the plugin adds /api/chat?voice_prompt=...
    run = await ask_from_wav("livekit", "livekit_personaplex.py", url, question_wav, tmp_path)
    heard = await heard_answer(run, transcribe)
    # The Moshi protocol carries no caller transcript: what our stt heard is read
    # from the call's Redis conversation (the latest session of this stack's db).
    question = await latest_caller_words(e2e_redis_url)
    assert word_recall(QUESTION, question) >= 0.6, (question, str(run))
    if "france" in words_of(question):  # else the model cannot know ('friends', seen once)
        assert "paris" in words_of(run.said), (heard, str(run))  # its voice says these words


async def test_livekit_gpt_live_model_with_the_example_as_its_back_end(
    web, espeak_questions, transcribe, tmp_path
):
    """GPTLiveModel with client delegation, an espeak-ng caller: the example answers
    the stack's delegation with a made-up place, which the agent then says."""
    caller = next(q for q in espeak_questions if q.text == "What is the capital of Germany?")
    question = write_wav(tmp_path / "question.wav", caller.audio)
    answer = "The capital is Quorvan, by the old river."
    url = f"http://127.0.0.1:{web.port}/v1"  # the plugin adds /live/sessions
    run = await ask_from_wav(
        "livekit", "livekit_live.py", url, question, tmp_path, "--answer", answer, quiet_s=4
    )
    heard = await heard_answer(run, transcribe)
    assert run.backend, run  # the stack delegated, and the example answered
    assert word_recall(answer, run.said) >= 0.8 and "quorvan" in words_of(run.said), run
    print(f"livekit_live: you={run.you} said={run.said!r} heard={heard!r}")
