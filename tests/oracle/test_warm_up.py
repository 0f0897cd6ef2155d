"""The oracle's warm-up: it sends the fixed start of its prompt once at start, so
llama.cpp, which keeps the longest common prefix of its previous request
evaluated, serves the first caller warm.

The request that reaches the server is checked on a local OpenAI-compatible
server; the token-level prefix on the real Gemma 3 270M vocabulary.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kame_cli.stack_options import free_ports
from kamepb import oracle_pb2
from services.oracle.prompts import (
    AGENT,
    USER,
    Turn,
    chat_messages,
    gemma_prefix,
    gemma_prompt,
    warm_up_chat_messages,
)

Event = oracle_pb2.OracleEvent
CONVERSATIONS = [
    [Turn(USER, "What is the capital of")],
    [Turn(USER, "Hi"), Turn(AGENT, "Hello."), Turn(USER, "What's twelve times four?")],
]


@pytest.mark.parametrize("turns", CONVERSATIONS, ids=["first", "later"])
def test_every_prompt_starts_with_the_warm_up_prompt(turns):
    assert gemma_prompt(turns).startswith(gemma_prefix())
    assert gemma_prompt(turns, "Custom header.").startswith(gemma_prefix("Custom header."))
    system, opening = warm_up_chat_messages()
    real_system, real_user = chat_messages(turns)
    assert real_system == system
    assert real_user["content"].startswith(opening["content"])


def test_the_few_shot_prefix_is_a_token_prefix_of_every_prompt():
    """Byte-identical is not enough if the tokenizer merged text across the boundary."""
    from llama_cpp import Llama

    from kame_common.models import gemma_270m_gguf_path

    vocab = Llama(str(gemma_270m_gguf_path()), vocab_only=True, verbose=False)
    prefix = vocab.tokenize(gemma_prefix().encode(), add_bos=True)
    assert len(prefix) > 100  # the part worth caching
    for turns in CONVERSATIONS:
        assert vocab.tokenize(gemma_prompt(turns).encode(), add_bos=True)[: len(prefix)] == prefix


def health_status(port: int) -> int | None:
    """The oracle's gRPC health status, None while nothing answers on the port."""

    async def check() -> int | None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0
                )
            except grpc.aio.AioRpcError:
                return None
            return reply.status

    return check()


@pytest.mark.parametrize(
    "model, path",
    [("gemma-3-270m", "/v1/completions"), ("stub-model", "/v1/chat/completions")],
    ids=["few-shot", "chat"],
)
async def test_the_oracle_serves_only_after_warming_its_default_backend(
    model, path, oracle_service, guide_client, stub_http, session_id
):
    warmed, release = asyncio.Event(), asyncio.Event()

    async def warm_or_answer(request, respond):
        if request.json().get("max_tokens") == 1 and not release.is_set():
            warmed.set()
            await release.wait()  # the warm-up takes a while
            await respond.json(200, {"choices": []})
        elif path == "/v1/completions":
            await respond.start_sse()
            await respond.sse({"choices": [{"index": 0, "text": " Paris."}]})
            await respond.sse("[DONE]")
        else:
            await respond.openai_chat([" Paris."])

    server, url = await stub_http({("POST", path): warm_or_answer})
    port = free_ports(1)[0]
    starting = asyncio.create_task(
        oracle_service(base_url=f"{url}/v1", model=model, port=port, warmup_timeout_s=30)
    )
    await asyncio.wait_for(warmed.wait(), 10)
    assert await health_status(port) is None  # not serving while it warms up
    assert not starting.done()
    release.set()
    runtime = await asyncio.wait_for(starting, 10)
    assert await health_status(port) == health_pb2.HealthCheckResponse.SERVING

    client = guide_client(runtime.port)
    await client.config(session_id=session_id)
    await client.user("What is the capital of France?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=10)
    warm_up, first_call = (r.json() for r in server.posts())
    assert warm_up["max_tokens"] == 1 and first_call["max_tokens"] > 1
    if path == "/v1/completions":  # the first call's prompt begins with what was warmed
        assert warm_up["prompt"] == gemma_prefix()
        assert first_call["prompt"].startswith(warm_up["prompt"])
    else:
        assert warm_up["messages"] == warm_up_chat_messages()
        assert first_call["messages"][0] == warm_up["messages"][0]
    assert await client.finish() == grpc.StatusCode.OK


async def test_the_warm_up_waits_for_an_llm_that_is_still_starting(oracle_service, stub_http):
    warm_ups = []

    async def completions(request, respond):
        warm_ups.append(request.json())
        await respond.json(200, {"choices": []})

    llm_port = free_ports(1)[0]
    starting = asyncio.create_task(
        oracle_service(base_url=f"http://127.0.0.1:{llm_port}/v1", warmup_timeout_s=30)
    )
    await asyncio.sleep(1.0)  # the oracle is refused meanwhile, and tries again
    assert not starting.done()
    await stub_http({("POST", "/v1/completions"): completions}, port=llm_port)  # the LLM is up
    await asyncio.wait_for(starting, 10)
    assert [w["prompt"] for w in warm_ups] == [gemma_prefix()]


@pytest.mark.parametrize("llm", ["unreachable", "failing"])
async def test_a_failed_warm_up_is_logged_and_the_oracle_serves_anyway(
    llm, oracle_service, stub_http, caplog
):
    async def fail(_request, respond):
        await respond.json(500, {"error": {"message": "no model loaded", "type": "server"}})

    if llm == "failing":
        _server, url = await stub_http({("POST", "/v1/completions"): fail})
        base_url = f"{url}/v1"
    else:
        base_url = f"http://127.0.0.1:{free_ports(1)[0]}/v1"
    with caplog.at_level(logging.WARNING, logger="services.oracle.factory"):
        runtime = await oracle_service(base_url=base_url, warmup_timeout_s=1.0)
    assert await health_status(runtime.port) == health_pb2.HealthCheckResponse.SERVING
    (record,) = [r for r in caplog.records if "warm-up" in r.getMessage()]
    assert base_url in record.getMessage()  # the log says where; callers never see it
