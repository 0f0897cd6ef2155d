"""A question answered from a function the caller itself runs, end to end through
`kame up` (issue #33): the caller declares `order_status` in its Converse config
(kame_client's ConverseClient), the real oracle offers it to the LLM,
the LLM calls it, the gateway hands the call to the caller, the caller answers
with a city picked at random here (a value no model could guess), and the agent
says it.

The LLM is tests/oracle/tool_support.py's fake on the OpenAI wire (the vendors
cannot be reached from here): it calls the offered `order_status` when asked
about an order and says the result it gets. The question is typed (UserText),
so the test hangs on the function's path, not on what Whisper hears; the agent
speaks its answer in the silence the caller streams. One `kame up` (~30-60 s on
a busy CPU)."""

from __future__ import annotations

import asyncio
import json
import random
import time

import numpy as np

from kame_client.client import ConverseClient
from kame_client.codecs import Encoder
from kame_client.events import AgentText, ConverseEvent, FunctionCall, ToolCall, ToolFinished
from kame_client.microphone import Microphone
from kame_common.audio import FRAME_SAMPLES
from kamepb import common_pb2, gateway_pb2
from tests.e2e.conftest import PCM_24K
from tests.e2e.kame_up import running
from tests.e2e.test_tools_stack import FAKE_LLM, SECRETS, TOOLS_DB
from tests.support import words_of
from tests.support.llm import StubHttpServer

QUESTION = "Where is my order A7 now?"
ORDER_STATUS = common_pb2.ClientFunction(
    name="order_status",
    description="Where an order of the caller's is now.",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}
    ),
    read_only=True,
)
SILENCE = np.zeros(FRAME_SAMPLES, dtype=np.float32)
ANSWER_WAIT_S = 90.0


def agent_words(events: list[ConverseEvent]) -> list[str]:
    return words_of(" ".join(e.text for e in events if isinstance(e, AgentText)))


async def ask_with_a_function(gateway: str, secret: str) -> list[ConverseEvent]:
    """A call that declares order_status, types QUESTION, answers the function's
    call with `secret` and streams silence until the agent said it: its events."""
    events: list[ConverseEvent] = []
    said = asyncio.Event()
    async with ConverseClient.connect(gateway) as client:

        async def read() -> None:
            async for event in client.events():
                events.append(event)
                if isinstance(event, FunctionCall):
                    output = f"It is with the courier in {secret}."
                    await client.send_function_result(event.call_id, output)
                if secret.lower() in agent_words(events):
                    said.set()

        reader = asyncio.create_task(read())
        await client.start(gateway_pb2.ConverseConfig(functions=[ORDER_STATUS]))
        await client.wait_started(reader)
        assert await client.send_text(QUESTION)
        microphone = Microphone(client, Encoder(PCM_24K))
        deadline = time.monotonic() + ANSWER_WAIT_S
        while not said.is_set() and not reader.done() and time.monotonic() < deadline:
            await microphone.stream(SILENCE)  # the agent speaks in the caller's frames
        await client.done_writing()
        await asyncio.wait_for(reader, 60)
    return events


async def test_kame_up_answers_from_a_function_the_caller_runs(tmp_path, redis_url):
    secret = random.choice(SECRETS)
    llm = StubHttpServer(FAKE_LLM)
    llm_url = await llm.start()
    flags = ["--llm-base-url", llm_url + "/v1", "--llm-model", "stub-model"]
    try:
        async with running(flags, tmp_path / "logs", redis_url, TOOLS_DB) as stack:
            events = await ask_with_a_function(stack.address("gateway"), secret)
    finally:
        await llm.close()

    print("agent said:", " ".join(agent_words(events)))
    # The LLM was offered the caller's function, called it, and got the caller's answer.
    asked = [post.json() for post in llm.posts() if post.json().get("max_tokens") != 1]
    assert [t["function"]["name"] for t in asked[0]["tools"]] == ["order_status"]
    results = [m["content"] for body in asked for m in body["messages"] if m["role"] == "tool"]
    assert any(secret in text for text in results), results
    # The caller saw the call and the tool's activity around it, in order.
    (call,) = [e for e in events if isinstance(e, FunctionCall)]
    assert call.name == "order_status" and json.loads(call.arguments_json) == {"order": "A7"}
    kinds = [e.TYPE for e in events if isinstance(e, ToolCall)]
    assert kinds == ["tool_started", "tool_finished"], kinds
    finished = next(e for e in events if isinstance(e, ToolFinished))
    assert finished.source == "client" and not finished.is_error, finished
    # ... and the agent said the secret.
    assert secret.lower() in agent_words(events)
