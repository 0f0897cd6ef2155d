"""The web page in a real browser: Debian's Chromium, headless, driven by
Playwright, talking to the whole stack (the e2e stack of this folder's
conftest) through the web service.

The microphone is Chromium's fake capture device playing a WAV: the first
question, then silence. Chromium reads the WAV each time the page opens the
microphone, so the barge-in is timed exactly: once the agent is speaking its
answer, the test mutes the page (the microphone is released), puts the second
question in the WAV and unmutes, and the caller asks it over the agent. The
page must show what the caller said and what the agent answered, play the
agent's audio (the level its player outputs is above zero), stop the agent
when the caller talks over it, and show the answer to the second question.

Set KAME_WEB_SCREENSHOT=docs/web.png to refresh the README's screenshot."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from playwright.async_api import async_playwright

from kame_cli.say import write_wav
from kame_cli.talk import speech_region
from kame_common.audio import SAMPLE_RATE, resample
from tests.support import word_recall
from tests.support.web import web_before

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The first answer must last long enough to be talked over: the embedded LLM
# describes the tower in a sentence of a dozen words however Whisper punctuates
# the question, while "the capital of France" may get just "Paris." (0.3 s).
QUESTION = "Can you describe the Eiffel Tower?"
SECOND_QUESTION = "How many legs does a spider have?"
CHROMIUM = shutil.which("chromium")
WAV_RATE = 48000
ANSWER_TIMEOUT_S = 90.0
HOLD_MAX_S = 10.0  # the most the frontend accepts


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def web(stack):
    # A gateway of the stack's whose agent holds the floor longer than the default 5 s: on a
    # loaded test machine Whisper's final and the LLM's answer may take that long, and an
    # answer that comes after the hold ran out is not spoken. The test is about the page.
    gateway = await stack.services.gateway(
        stack.stt, stack.oracle, "127.0.0.1:1", hold_max_s=HOLD_MAX_S
    )
    async with web_before(gateway.address) as server:
        yield server


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), np.float32)


def speech_only(audio: np.ndarray) -> np.ndarray:
    """`audio` without the silence the voice puts around it."""
    start, end = speech_region(audio)
    return audio[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)]


def caller_wav(path: Path, speech: np.ndarray, lead_s: float) -> Path:
    """`speech` after `lead_s` of silence, then a minute of silence, at a rate Chromium
    plays as is."""
    audio = np.concatenate([silence(lead_s), speech_only(speech), silence(60.0)])
    write_wav(path, resample(audio, SAMPLE_RATE, WAV_RATE), WAV_RATE)
    return path


async def state(page) -> dict:
    return await page.evaluate("() => JSON.parse(JSON.stringify(window.kameState))")


def answer_to(seen: dict, question: str) -> list[str]:
    """The words the agent said of candidates that answer `question` (as STT heard it)."""
    return [
        word
        for answer in seen["answered"]
        if word_recall(question, answer["source_text"]) >= 0.5
        for word in answer["words"]
    ]


async def wait_for_answer(page, question: str, words: int) -> dict:
    """The page's state once the agent said `words` words of an answer to `question`."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        seen = await state(page)
        if len(answer_to(seen, question)) >= words:
            return seen
        if seen["status"] in ("error", "ended") or time.monotonic() > deadline:
            raise AssertionError(f"no answer to {question!r} on the page; its state: {seen}")
        await asyncio.sleep(0.05)


def barge_in_delays(events: list[dict]) -> list[float]:
    """For each barge-in the page saw: seconds from the caller's first words to it."""
    delays, talking_since = [], None
    for event in events:
        if event["type"] == "caller_talking_start":
            talking_since = event["t"]
        elif event["type"] == "caller_talking_stop":
            talking_since = None
        elif event["type"] == "barge_in" and talking_since is not None:
            delays.append(event["t"] - talking_since)
    return delays


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
async def test_a_spoken_conversation_with_barge_in_in_the_browser(web, speak, tmp_path):
    microphone = caller_wav(tmp_path / "microphone.wav", speak(QUESTION), lead_s=1.0)
    second = caller_wav(tmp_path / "second.wav", speak(SECOND_QUESTION), lead_s=0.0)
    started = time.monotonic()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--use-fake-ui-for-media-stream",  # grant the microphone without asking
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={microphone}%noloop",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 860})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda message: print(f"page console: {message.text}"))
            await page.goto(web.url)
            await page.wait_for_function("() => document.querySelector('#mode').options.length")
            await page.click("#start")
            # The agent is well into its answer: its first word may be a phrase of its own,
            # played out before the LLM's next words are synthesized (seen in a full run: the
            # caller then spoke into a gap, which is no barge-in).
            await wait_for_answer(page, QUESTION, words=3)
            await page.click("#mute")
            os.replace(second, microphone)  # read when the page opens the microphone again
            await page.click("#mute")  # unmute: the second question, over the agent
            await wait_for_answer(page, SECOND_QUESTION, words=2)
            screenshot = Path(os.environ.get("KAME_WEB_SCREENSHOT") or tmp_path / "web.png")
            await page.wait_for_timeout(1500)  # a little more of the answer on the timeline
            png = await page.screenshot(path=str(screenshot))
            seen = await state(page)
            shown_caller = await page.inner_text("#caller-text")
            shown_agent = await page.inner_text("#agent-text")
        finally:
            await browser.close()
    elapsed = time.monotonic() - started
    print(f"browser conversation: {elapsed:.1f} s")
    for event in seen["events"]:
        if event["type"] not in ("oracle_reset", "oracle_append", "user_partial", "user_final"):
            print(f"  {event['t']:7.2f} {event['type']:<22} {event.get('text', '')}")

    assert not errors, errors
    assert seen["status"] == "live" and not seen["error"], seen
    heard = " ".join(seen["finals"])
    assert word_recall(QUESTION, heard) >= 0.5, heard
    assert word_recall(SECOND_QUESTION, heard) >= 0.5, heard
    assert seen["finals"][0] in shown_caller
    assert answer_to(seen, QUESTION)
    answer = answer_to(seen, SECOND_QUESTION)
    assert all(word in shown_agent for word in answer), (answer, shown_agent)
    assert seen["agentOutputMax"] > 0.01, "the page played no agent audio"
    delays = barge_in_delays(seen["events"])
    # The agent stopped while the caller was still talking over it (barge_in_delays
    # counts only stops inside a stretch of caller speech): that is the stack's logic.
    # How soon, in wall-clock time through a browser, moves with the machine's load
    # (1.06 s once in a full CI run); it is printed above, not a verdict.
    assert delays, "the agent did not stop while the caller talked over it"
    assert all(t["response_latency_s"] < 10 for t in seen["turns"]), seen["turns"]
    assert len(png) > 10_000
