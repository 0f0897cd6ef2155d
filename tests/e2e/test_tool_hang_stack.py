"""A tool that hangs, end to end through `kame up` (issue #33): the caller hears
the hold, then an apology within the tool's timeout, and the next question of
the same call is answered.

`kame up --mcp-server vault=COMMAND --tools-allowed vault.order_status:readonly:2`
gives the oracle the test MCP server (tests/oracle/mcp_tool_server.py, stdio,
written with the `mcp` SDK), whose order_status never answers, with a 2 s
timeout. OpenAI cannot be reached from here, so the LLM is tests/oracle/
tool_support.py's fake on the OpenAI wire: asked about an order it says "One
moment." and calls order_status; given the oracle's error result it
apologises; asked something it has no rule for, it says "I am not sure."
without a tool. The questions are typed (`ConverseClient.send_text`), so the
test hangs on the tool's path, not on what Whisper hears; the agent speaks in
the silence the caller streams. One `kame up` (~30-60 s on a busy CPU).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from kame_client.client import ConverseClient
from kame_client.codecs import Encoder
from kame_client.events import AgentText, ConverseEvent, OracleAppend, OracleReset, ToolFinished
from kame_client.microphone import Microphone
from kame_common.audio import FRAME_SAMPLES
from kamepb import gateway_pb2
from tests.e2e.conftest import PCM_24K
from tests.e2e.kame_up import running
from tests.e2e.test_tools_stack import FAKE_LLM, TOOLS_DB
from tests.oracle import mcp_tool_server
from tests.oracle.mcp_tool_server import recorded_calls
from tests.oracle.tool_support import APOLOGY, HOLD, UNSURE
from tests.support import words_of
from tests.support.llm import StubHttpServer

HANGING = "Where is my order A7?"  # the fake calls order_status, which never answers
PLAIN = "What is the weather like?"  # the fake has no tool for it: "I am not sure."
TOOL_TIMEOUT_S = 2.0
# What the agent may say while it holds the floor: the gateway's default hold
# phrases (the front-end's, before any oracle word) and the model's own.
HOLD_WORDS = set(words_of(f"Hmm, Let me see, {HOLD}"))
# The apology may come late on a busy 2-core machine (an LLM round, synthesis, the
# agent's pacing), but well before a tool left hanging would have let the call go on.
APOLOGY_WITHIN_S = TOOL_TIMEOUT_S + 12.0
CALL_WAIT_S = 120.0
SILENCE = np.zeros(FRAME_SAMPLES, dtype=np.float32)


def said_words(events: list[tuple[float, ConverseEvent]], after: float) -> list[str]:
    """The agent's words heard from `after` on (seconds on the call's clock)."""
    return words_of(" ".join(e.text for t, e in events if isinstance(e, AgentText) and t >= after))


def ends_with(words: list[str], phrase: str) -> bool:
    expected = words_of(phrase)
    return words[-len(expected) :] == expected


async def ask_twice(gateway: str) -> tuple[list[tuple[float, ConverseEvent]], float, float]:
    """One call: HANGING typed, silence until the apology was said, PLAIN typed,
    silence until its answer was said. Its events on the call's clock (seconds),
    and when each question was sent."""
    events: list[tuple[float, ConverseEvent]] = []
    started = time.monotonic()
    asked = {"hanging": -1.0, "plain": -1.0}
    async with ConverseClient.connect(gateway) as client:

        async def read() -> None:
            async for event in client.events():
                events.append((time.monotonic() - started, event))

        reader = asyncio.create_task(read())
        await client.start(gateway_pb2.ConverseConfig(include_oracle_updates=True))
        await client.wait_started(reader)
        assert await client.send_text(HANGING)
        asked["hanging"] = time.monotonic() - started
        microphone = Microphone(client, Encoder(PCM_24K))
        while not reader.done() and time.monotonic() - started < CALL_WAIT_S:
            if asked["plain"] < 0 and ends_with(said_words(events, asked["hanging"]), APOLOGY):
                assert await client.send_text(PLAIN)
                asked["plain"] = time.monotonic() - started
            if asked["plain"] >= 0 and ends_with(said_words(events, asked["plain"]), UNSURE):
                break
            await microphone.stream(SILENCE)  # the agent speaks in the caller's frames
        await client.done_writing()
        await asyncio.wait_for(reader, 60)
    return events, asked["hanging"], asked["plain"]


async def test_a_hanging_tool_is_held_for_then_apologised_for_and_the_call_goes_on(
    tmp_path: Path, redis_url: str
) -> None:
    calls_file = tmp_path / "calls.jsonl"
    server = shlex.join([sys.executable, mcp_tool_server.__file__, "unused", str(calls_file)])
    llm = StubHttpServer(FAKE_LLM)
    llm_url = await llm.start()
    flags = [
        *("--llm-base-url", llm_url + "/v1", "--llm-model", "stub-model"),
        *("--mcp-server", f"vault={server}"),
        *("--tools-allowed", f"vault.order_status:readonly:{TOOL_TIMEOUT_S:g}"),
    ]
    try:
        async with running(flags, tmp_path / "logs", redis_url, TOOLS_DB) as stack:
            events, hanging_at, plain_at = await ask_twice(stack.address("gateway"))
    finally:
        await llm.close()

    words = [(t, e) for t, e in events if isinstance(e, AgentText) and e.text.strip()]
    print("agent said:", [(round(t, 2), e.generation, e.text) for t, e in words])
    # The oracle gave up on the tool at its timeout, and told the caller's client so.
    (finished,) = [e for _, e in events if isinstance(e, ToolFinished)]
    assert finished.name == "order_status" and finished.is_error, finished
    assert TOOL_TIMEOUT_S <= finished.elapsed_s < TOOL_TIMEOUT_S + 2.5, finished
    assert [c["tool"] for c in recorded_calls(calls_file)] == ["order_status"]
    # The model's words before its call ("One moment.") reached the caller whole while the
    # tool hung, not once the oracle had given up on it.
    gave_up = next(i for i, (_, e) in enumerate(events) if isinstance(e, ToolFinished))
    updates = [e.text for _, e in events[:gave_up] if isinstance(e, OracleReset | OracleAppend)]
    assert words_of(" ".join(updates)) == words_of(HOLD), updates
    # The caller heard the hold while the tool hung, then the model's apology (words of
    # the answer's generation, not the front-end's own "Sorry," repair) ...
    apology_at = next(
        t for t, e in words if t > hanging_at and e.generation and "sorry" in words_of(e.text)
    )
    hold = words_of(" ".join(e.text for t, e in words if hanging_at < t < apology_at))
    assert hold and set(hold) <= HOLD_WORDS, hold
    assert apology_at - hanging_at < APOLOGY_WITHIN_S, apology_at - hanging_at
    assert plain_at > apology_at, "the apology was never said whole"
    # ... and the next question was answered, by the model, in the same call.
    answer = [e for t, e in words if t > plain_at and e.generation]
    assert words_of(" ".join(e.text for e in answer)) == words_of(UNSURE), answer
