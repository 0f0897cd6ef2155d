"""The oracle's LLM token budgets (services/oracle/budget.py), on the real oracle
with a scripted OpenAI-compatible server (conftest's stub_http) and real Redis:
a session whose budget is spent starts no more requests and ends its stream
with RESOURCE_EXHAUSTED, its message and the metadata the gateway ends the call
on; a reopened stream of the same session, and another session of a caller
whose budget is spent, are refused at once. Without budgets the old oracle
served every request (a caller's tools, up to 380 KB of them, read by the
operator's LLM with each one)."""

from __future__ import annotations

import time
import uuid

import grpc

from kame_common import store
from kame_common.llm import BUDGET_SPENT_METADATA
from kamepb import oracle_pb2
from tests.support import wait_until

Event = oracle_pb2.OracleEvent
# A start at every final, none on partials.
POLICY = oracle_pb2.OraclePolicy(poll_interval_s=0.05, max_starts=50)


async def answer(_request, respond) -> None:
    await respond.openai_chat(["Paris ", "is ", "the ", "capital."])


ROUTES = {("POST", "/v1/chat/completions"): answer}


def refused_for_budget(client) -> bool:
    error = client.error
    return (
        error is not None
        and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        and BUDGET_SPENT_METADATA in tuple(error.trailing_metadata() or ())
    )


async def spent(redis_url: str, key: str) -> int:
    client = store.connect(redis_url)
    try:
        return int(await client.get(key) or 0)
    finally:
        await client.aclose()


async def test_a_session_stops_at_its_budget_and_stays_stopped(
    stub_http, oracle_service, guide_client, session_id, redis_url
):
    llm, url = await stub_http(ROUTES)
    # The first request (the KAME prompt, hundreds of tokens) spends it all.
    runtime = await oracle_service(
        base_url=f"{url}/v1", model="stub-model", session_token_budget=100
    )
    client = guide_client(runtime.port)
    await client.config(session_id=session_id, policy=POLICY)
    await client.user("What is the capital of France?", final=True, utterance_id="u1")
    await client.wait_event(Event.DONE, generation=1)
    await client.user("And of Italy?", final=True, utterance_id="u2")
    assert await client.finish() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused_for_budget(client)
    assert "this call's LLM token budget is spent" in client.error.details()
    assert "session_token_budget" in client.error.details()
    assert len(llm.posts()) == 1  # the second question's request was never made
    key = f"kame:llm_tokens:session:{session_id}"
    await wait_until(lambda: spent(redis_url, key), "the spending in Redis", 5)
    assert await spent(redis_url, key) > 100

    # The session opened again (a reopened stream, a resumed call): refused at once.
    again = guide_client(runtime.port)
    await again.config(session_id=session_id, policy=POLICY)
    assert await again.finish() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused_for_budget(again)
    assert len(llm.posts()) == 1


async def test_a_caller_stops_at_its_budget_across_sessions(
    stub_http, oracle_service, guide_client, redis_url
):
    llm, url = await stub_http(ROUTES)
    runtime = await oracle_service(
        base_url=f"{url}/v1", model="stub-model", caller_token_budget=100
    )
    caller, other = f"token:{uuid.uuid4().hex}", f"token:{uuid.uuid4().hex}"
    first = guide_client(runtime.port)
    await first.config(session_id=f"test-{uuid.uuid4().hex}", policy=POLICY, caller=caller)
    await first.user("What is the capital of France?", final=True)
    await first.wait_event(Event.DONE, generation=1)
    assert await first.finish() == grpc.StatusCode.OK
    await wait_until(
        lambda: spent(redis_url, caller_key(caller)), "the caller's spending in Redis", 5
    )

    second = guide_client(runtime.port)
    await second.config(session_id=f"test-{uuid.uuid4().hex}", policy=POLICY, caller=caller)
    assert await second.finish() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "this caller's LLM token budget is spent" in second.error.details()
    assert "caller_token_budget" in second.error.details()

    # Another caller (another bearer token) has a budget of its own.
    third = guide_client(runtime.port)
    await third.config(session_id=f"test-{uuid.uuid4().hex}", policy=POLICY, caller=other)
    await third.user("What is the capital of France?", final=True)
    await third.wait_event(Event.DONE, generation=1)
    assert await third.finish() == grpc.StatusCode.OK
    assert len(llm.posts()) == 2


def caller_key(caller: str) -> str:
    """The caller's counter in the window of now (the default window, a day)."""
    return f"kame:llm_tokens:caller:{caller}:{int(time.time() // 86400)}"
