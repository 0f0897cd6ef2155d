"""The OpenAI Agents SDK's function tool, called by the stack's model through the
web service's OpenAI Realtime endpoint (issues #31, #33): a `RealtimeAgent`
with a `door_code(office)` @function_tool (examples/openai_agents_realtime.py
--door-code, in the SDK's own venv: tests/clients/venvs.py) asks a piper
question about a door code; the oracle's model calls the client's function,
the gateway routes the call to the web service, the SDK runs the function and
sends its output back, and the agent says the code.

OpenAI cannot be reached from here, so the oracle's LLM is the local fake
speaking the OpenAI chat-completions stream with `tool_calls`
(tests/oracle/tool_support.py, as tests/e2e/test_tools_stack.py uses it): its
"model" calls door_code({"office": "Paris"}) when asked about a door code and
says the tool's result. The code is a city picked at random here: a value no
model could guess. The stack is this folder's (stt, frontend, gateway in this
process) but for that oracle; no llama.cpp server is started."""

from __future__ import annotations

import random

import pytest
import pytest_asyncio

from tests.clients.runs import ask_from_wav, write_wav
from tests.e2e.conftest import HOLD_MAX_S, Services, wait_registered
from tests.e2e.test_tools_stack import FAKE_LLM, QUESTION, SECRETS, tool_results
from tests.support import words_of
from tests.support.llm import StubHttpServer
from tests.support.web import web_before

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The client's round trip (gateway, web service, the SDK's process) on a busy CPU.
TOOL_TIMEOUT_S = 20.0
QUIET_S = 8.0  # the example stops once the agent has been quiet this long
MAX_S = 90.0  # ... or after this long anyway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def llm():
    server = StubHttpServer(dict(FAKE_LLM))
    await server.start()
    yield server
    await server.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def web(llm, e2e_redis_url):
    """The web service before a stack whose oracle's LLM is the fake."""
    services = Services(e2e_redis_url, llm.url + "/v1")
    try:
        stt, frontend = await services.stt(), await services.frontend()
        await wait_registered(e2e_redis_url, f"127.0.0.1:{frontend.port}")
        oracle = await services.oracle(model="stub-model", tool_timeout_s=TOOL_TIMEOUT_S)
        gateway = await services.gateway(stt, oracle, "127.0.0.1:1", hold_max_s=HOLD_MAX_S)
        async with web_before(gateway.address) as server:
            yield server
    finally:
        await services.stop()


async def test_the_agents_sdk_runs_its_function_tool_for_the_stacks_model(
    web, llm, speak, tmp_path
):
    secret = random.choice(SECRETS)
    question = write_wav(tmp_path / "question.wav", speak(QUESTION))
    url = f"ws://127.0.0.1:{web.port}/v1/realtime?model=kame-tandem"
    run = await ask_from_wav(
        *("openai_agents", "openai_agents_realtime.py", url, question, tmp_path),
        *("--door-code", secret),
        quiet_s=QUIET_S,
        max_s=MAX_S,
    )

    assert run.returncode == 0 and run.errors == [], run
    # The SDK ran its function with the arguments the model wrote, once.
    assert run.tool_calls == [{"tool": "door_code", "office": "Paris"}], run
    asked = [post for post in llm.posts() if post.json().get("max_tokens") != 1]
    offered = {tool["function"]["name"] for tool in asked[0].json()["tools"]}
    assert offered == {"door_code"}, offered
    # Its output reached the model, and the agent said it.
    assert any(secret in text for text in tool_results(asked, "openai")), asked[-1].json()
    assert secret.lower() in words_of(run.said), run
    assert len(run.answer) > 0, run
