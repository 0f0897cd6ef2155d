"""A spoken question answered from a tool's output, end to end through `kame up`
(issue #33), on each LLM wire format that carries tools.

`kame up --mcp-server vault=COMMAND` gives the oracle a stdio MCP server
written with the `mcp` SDK (tests/oracle/mcp_tool_server.py), whose door code
is a city picked at random here: a value no model could guess, and one piper
can say and Whisper hear. OpenAI and Anthropic cannot be reached from here, so
the LLM is a local HTTP server in this test (tests/oracle/tool_support.py's
fake on tests/oracle/conftest.py's StubHttpServer) that speaks the OpenAI
chat-completions stream with `tool_calls`, and the Anthropic messages stream
with `tool_use` blocks (`--llm-backend anthropic --llm-base-url` of the fake);
its "model" calls door_code when asked about a door code and says the result.

A piper question goes through the gateway (`kame talk`'s caller); the agent's
words as the caller gets them contain the secret, and our STT hears it in the
agent's audio. One `kame up` per wire format (~30-60 s each on a busy CPU)."""

from __future__ import annotations

import asyncio
import random
import re
import shlex
import sys

import pytest

from kame_client.caller import TalkOptions, talk
from tests.e2e.kame_up import running
from tests.oracle import mcp_tool_server
from tests.oracle.mcp_tool_server import recorded_calls
from tests.oracle.tool_support import FAKE_LLM_ROUTES, anthropic_models
from tests.support import voice_says, words_of
from tests.support.llm import StubHttpServer

QUESTION = "What is the door code for the Paris office?"
# Door codes no model would guess in this context, which Whisper tiny.en hears in piper's
# answer sentence ("Honolulu" and "Amsterdam", tried, it does not).
SECRETS = ("Chicago", "Melbourne", "Toronto", "Barcelona", "Houston", "Dublin", "Madrid", "Sydney")
TOOLS_DB = 15  # the stack's own Redis database
# The fake checks no key; the Anthropic back-end wants one to send.
ANTHROPIC_KEY_ENV = {"ANTHROPIC_API_KEY": "sk-ant-test"}


async def warm_up_or_answer(request, respond) -> None:
    """The oracle warms its prompt at start with max_tokens 1 (no stream): a short
    answer in the wire format asked; every other request goes to the fake model."""
    body = request.json()
    if body.get("max_tokens") != 1:
        await FAKE_LLM_ROUTES[("POST", request.path)](request, respond)
    elif request.path == "/v1/messages":
        await respond.json(
            200,
            {
                "id": "msg_warm",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [{"type": "text", "text": "Hi"}],
                "stop_reason": "max_tokens",
                "stop_sequence": None,
                "usage": {"input_tokens": 42, "output_tokens": 1},
            },
        )
    else:
        await respond.json(200, {"id": "warm", "object": "chat.completion", "choices": []})


FAKE_LLM = {
    ("POST", "/v1/chat/completions"): warm_up_or_answer,
    ("POST", "/v1/messages"): warm_up_or_answer,
}

# wire format -> (kame up's LLM flags but --llm-base-url, path after the fake's URL,
# --tools-allowed flags, the tools kame up then says the oracle offers)
WIRE_FORMATS = {
    "openai": (
        ["--llm-model", "stub-model"],
        "/v1",
        [],  # the server named on the command line is allowed whole; its hints not trusted
        "vault.door_code, vault.book_table, vault.next_train, vault.order_status, "
        "vault.crash_server",
    ),
    "anthropic": (
        ["--llm-backend", "anthropic", "--llm-model", "claude-stub"],
        "",  # the Anthropic SDK adds /v1 itself
        ["--tools-allowed", "vault.door_code:readonly"],
        "vault.door_code (read-only)",
    ),
}


def tool_results(posts: list, wire: str) -> list[str]:
    """The tool results the oracle sent the LLM, in the wire format's own shape."""
    if wire == "openai":
        return [
            m["content"] for post in posts for m in post.json()["messages"] if m["role"] == "tool"
        ]
    return [
        block["content"]
        for post in posts
        for m in post.json()["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_result"
    ]


@pytest.mark.parametrize("wire", list(WIRE_FORMATS))
async def test_kame_up_answers_a_spoken_question_from_an_mcp_tool(
    wire, tmp_path, redis_url, speak, transcribe
):
    llm_flags, url_path, allowed_flags, offered = WIRE_FORMATS[wire]
    secret = random.choice(SECRETS)
    calls_file = tmp_path / "calls.jsonl"
    server = shlex.join([sys.executable, mcp_tool_server.__file__, secret, str(calls_file)])
    llm = StubHttpServer(
        {**FAKE_LLM, **({("GET", "/v1/models"): anthropic_models} if wire == "anthropic" else {})}
    )
    llm_url = await llm.start()
    flags = [
        *("--llm-base-url", llm_url + url_path, *llm_flags),
        *("--mcp-server", f"vault={server}", *allowed_flags),
    ]
    try:
        async with running(
            flags, tmp_path / "logs", redis_url, TOOLS_DB, ANTHROPIC_KEY_ENV
        ) as stack:
            assert re.search(rf"^\s+tools\s+{re.escape(offered)}$", stack.printed, re.M), (
                stack.printed
            )
            result = await talk(
                speak(QUESTION),
                TalkOptions(
                    gateway=stack.address("gateway"),
                    wait_for_answer=True,
                    tail_s=2.0,
                    max_wait_s=60.0,
                ),
            )
    finally:
        await llm.close()

    assert result.status == "OK", result.status_details
    print(f"heard {result.user_transcript!r}; the agent said {result.agent_text!r}")
    # The model asked for the tool with the tools of the allow-list, and the oracle ran
    # it on the MCP server and gave the model its result.
    assert [c["tool"] for c in recorded_calls(calls_file)][:1] == ["door_code"]
    asked = [post for post in llm.posts() if post.json().get("max_tokens") != 1]
    tools = asked[0].json()["tools"]
    names = {t["function"]["name"] if wire == "openai" else t["name"] for t in tools}
    assert names == set(re.findall(r"vault\.(\w+)", offered)), tools
    assert any(secret in text for text in tool_results(asked, wire)), asked[-1].json()
    # The caller got the secret in the agent's words, and hears it in its voice.
    assert secret.lower() in words_of(result.agent_text), result.agent_text
    heard = await asyncio.to_thread(transcribe, result.agent)
    print(f"our STT hears the agent say {heard!r}")
    # Its voice says its words (Whisper tiny alone may mishear the one name).
    assert voice_says(result.agent_text, heard), (result.agent_text, heard)
