"""LLM failures mid-session are ERROR events; the session goes on.

A local OpenAI-compatible HTTP server (chat completions) scripts the failures
that the real llama.cpp server cannot be made to show on demand: a stall, a
dropped connection, an HTTP 500.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from kamepb import oracle_pb2
from tests.support import wait_until

Event = oracle_pb2.OracleEvent
ANSWER = ["Paris", " is the", " capital."]


def scripted_chat(script: list[str]):
    """A /v1/chat/completions handler that plays `script[n]` on the n-th request
    (the last entry repeats): answer, stall_before_headers, stall_mid_stream,
    drop (close without answering), or error500."""

    async def handle(_request, respond):
        step = script.pop(0) if len(script) > 1 else script[0]
        if step == "answer":
            await respond.openai_chat(ANSWER)
        elif step == "stall_before_headers":
            await asyncio.sleep(3600)
        elif step == "stall_mid_stream":
            await respond.start_sse()
            await respond.sse(
                {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "stub-model",
                    "choices": [
                        {"index": 0, "delta": {"content": "Let me"}, "finish_reason": None}
                    ],
                }
            )
            await asyncio.sleep(3600)
        elif step == "error500":
            await respond.json(500, {"error": {"message": "model crashed", "type": "server"}})
        else:
            assert step == "drop"  # the handler returns: the connection closes unanswered

    return handle


async def open_session(
    script, oracle_service, guide_client, stub_http, session_id, timeout_s: float = 0.5
):
    server, url = await stub_http({("POST", "/v1/chat/completions"): scripted_chat(script)})
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    client = guide_client(runtime.port)
    await client.config(
        session_id=session_id,
        request_timeout_s=timeout_s,
        policy=oracle_pb2.OraclePolicy(poll_interval_s=0.05),
    )
    return server, client, runtime


@pytest.mark.parametrize("stall", ["stall_before_headers", "stall_mid_stream"])
async def test_an_llm_timeout_does_not_end_the_session(
    stall, oracle_service, guide_client, stub_http, session_id
):
    server, client, _runtime = await open_session(
        [stall, "answer"], oracle_service, guide_client, stub_http, session_id
    )
    await client.user("What is the capital of France?", final=True)
    started = time.monotonic()
    error = await client.wait_event(Event.ERROR, 1, timeout_s=10)
    assert time.monotonic() - started < 5
    assert error.detail == "openai: no answer within 0.5 s"  # no URL: callers may see it
    assert len(server.posts()) == 1  # a timeout is not retried

    await client.user("Hello?", final=True, utterance_id="u2")
    await client.wait_event(Event.DONE, 2, timeout_s=10)
    assert client.answer(2) == "Paris is the capital."
    client.assert_update_protocol()
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_dropped_connection_is_retried_once(
    oracle_service, guide_client, stub_http, session_id
):
    server, client, _runtime = await open_session(
        ["drop", "answer"], oracle_service, guide_client, stub_http, session_id
    )
    await client.user("What is the capital of France?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=10)
    assert client.events(Event.ERROR) == []
    assert client.answer(1) == "Paris is the capital."
    assert len(server.posts()) == 2
    assert await client.finish() == grpc.StatusCode.OK


async def test_connection_errors_after_the_retry_and_server_errors_are_reported(
    oracle_service, guide_client, stub_http, session_id
):
    server, client, _runtime = await open_session(
        ["drop", "drop", "error500", "answer"], oracle_service, guide_client, stub_http, session_id
    )
    await client.user("What is the capital of France?", final=True)
    error = await client.wait_event(Event.ERROR, 1, timeout_s=10)
    assert error.detail == "openai: connection to the LLM server failed"
    await client.user("Are you there?", final=True, utterance_id="u2")
    error = await client.wait_event(Event.ERROR, 2, timeout_s=10)
    # The status and the error type, not the server's own words (nor its URL).
    assert error.detail == "openai: the LLM server answered HTTP 500 (server)"
    assert len(server.posts()) == 3  # two tries, then one for the HTTP 500 (not retried)
    await client.user("Hello?", final=True, utterance_id="u3")
    await client.wait_event(Event.DONE, 3, timeout_s=10)
    assert client.answer(3) == "Paris is the capital."
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_final_that_could_not_reach_the_llm_is_asked_again_until_answered(
    oracle_service, guide_client, stub_http, session_id
):
    """The LLM server is restarting (its connection fails, retry included): the
    final's candidate is started again a second later, and answers the question
    without the caller saying anything more."""
    server, client, _runtime = await open_session(
        ["drop", "drop", "drop", "drop", "answer"],
        oracle_service,
        guide_client,
        stub_http,
        session_id,
    )
    await client.user("What is the capital of France?", final=True)
    await client.wait_event(Event.DONE, 3, timeout_s=15)
    assert [e.generation for e in client.events(Event.ERROR)] == [1, 2]
    assert client.answer(3) == "Paris is the capital."
    assert len(server.posts()) == 5
    assert await client.finish() == grpc.StatusCode.OK


def session_tasks() -> list[asyncio.Task]:
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_coro().__qualname__.startswith(("OracleSession.", "OracleServicer."))
    ]


async def test_a_client_gone_mid_stream_frees_the_session(
    oracle_service, guide_client, stub_http, session_id
):
    _server, client, runtime = await open_session(
        ["stall_mid_stream"], oracle_service, guide_client, stub_http, session_id, timeout_s=30
    )
    await client.user("What is the capital of France?", final=True)
    await client.wait_event(Event.FIRST_TOKEN, 1, timeout_s=10)
    assert session_tasks() and runtime.active_sessions == 1
    client.call.cancel()  # the gateway hangs up while the LLM is streaming
    await wait_until(
        lambda: not session_tasks() and not runtime.active_sessions, "the session to end", 10
    )
    again = guide_client(runtime.port)  # the service goes on
    await again.config(session_id=session_id)
    assert await again.finish() == grpc.StatusCode.OK
