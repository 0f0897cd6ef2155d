"""The Anthropic back-end, through the real `anthropic` SDK.

The local HTTP server below STANDS IN FOR THE REAL ANTHROPIC API (no network
here): it speaks the documented Messages streaming protocol, Server-Sent
Events in this order: message_start, content_block_start, ping,
content_block_delta (text_delta) ..., content_block_stop, message_delta (with
the cumulative output token count), message_stop; and the documented `error`
event for a failure in the middle of a stream.
"""

from __future__ import annotations

import subprocess
import sys

import grpc
from prometheus_client import REGISTRY

from kamepb import common_pb2, oracle_pb2
from kamepb.common_pb2 import LLM_BACKEND_ANTHROPIC
from services.oracle.prompts import KAME_SYSTEM_PROMPT

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate

# Deltas split mid-word on purpose: the oracle must re-cut them at word boundaries.
DELTAS = ["Par", "is is the", " capital of Fr", "ance, on the Se", "ine."]


async def anthropic_models(_request, respond) -> None:
    await respond.json(
        200,
        {
            "data": [
                {
                    "type": "model",
                    "id": "claude-stub",
                    "display_name": "Claude stub",
                    "created_at": "2025-01-01T00:00:00Z",
                }
            ],
            "has_more": False,
            "first_id": "claude-stub",
            "last_id": "claude-stub",
        },
    )


async def anthropic_messages(request, respond) -> None:
    """A streamed answer, except when the caller's last words ask only about Spain: then the
    stream fails midway with an `error` event."""
    body = request.json()
    last_user_line = [
        line for line in body["messages"][-1]["content"].splitlines() if line.startswith("User:")
    ][-1]
    await respond.start_sse()
    await respond.sse(
        {
            "type": "message_start",
            "message": {
                "id": "msg_stub",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": body["model"],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 42, "output_tokens": 1},
            },
        },
        event="message_start",
    )
    await respond.sse(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        event="content_block_start",
    )
    await respond.sse({"type": "ping"}, event="ping")
    if "Spain" in last_user_line and "Italy" not in last_user_line:
        await respond.sse(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            event="error",
        )
        return
    for text in DELTAS:
        await respond.sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
            event="content_block_delta",
        )
    await respond.sse({"type": "content_block_stop", "index": 0}, event="content_block_stop")
    await respond.sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 11},
        },
        event="message_delta",
    )
    await respond.sse({"type": "message_stop"}, event="message_stop")


async def test_anthropic_messages_stream_becomes_oracle_updates(
    oracle_service, guide_client, stub_http, session_id
):
    server, url = await stub_http(
        {("GET", "/v1/models"): anthropic_models, ("POST", "/v1/messages"): anthropic_messages}
    )
    rate_before = (
        REGISTRY.get_sample_value("kame_oracle_tokens_per_second_count", {"backend": "anthropic"})
        or 0.0
    )
    # The service default stays openai: the back-end is chosen per session, at a
    # URL and with a model the operator allows.
    runtime = await oracle_service(
        allowed_base_urls=url, allowed_models="claude-stub", allowed_backends="openai,anthropic"
    )
    client = guide_client(runtime.port)
    await client.config(
        session_id=session_id,
        backend=LLM_BACKEND_ANTHROPIC,
        base_url=url,
        api_key="sk-ant-test",
        model="claude-stub",
        policy=oracle_pb2.OraclePolicy(poll_interval_s=0.05),
    )
    await client.user("What is the capital of France?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)

    client.assert_update_protocol()
    # The first whole words go out with the RESET; the rest follow as APPENDs.
    assert [(u.op, u.text) for u in client.updates()] == [
        (Update.RESET, "Paris is"),
        (Update.APPEND, "the capital of"),
        (Update.APPEND, "France, on the"),
        (Update.APPEND, "Seine."),
    ]
    assert (
        REGISTRY.get_sample_value("kame_oracle_tokens_per_second_count", {"backend": "anthropic"})
        or 0.0
    ) == rate_before + 1

    request = server.posts()[0]
    assert request.path == "/v1/messages"
    # The SDK picks the header (x-api-key in older versions, a bearer token in 2.x).
    assert "sk-ant-test" in (
        request.headers.get("x-api-key", ""),
        request.headers.get("authorization", "").removeprefix("Bearer "),
    )
    assert request.headers["anthropic-version"]
    body = request.json()
    assert body["model"] == "claude-stub" and body["stream"] is True
    assert body["system"] == KAME_SYSTEM_PROMPT
    assert body["max_tokens"] > 0
    assert body["messages"][0]["role"] == "user"
    assert "User: What is the capital of France?" in body["messages"][0]["content"]

    # A documented `error` event mid-stream is an ERROR event; the session goes on.
    await client.agent("Paris is the capital of France.")
    await client.user("And of Spain?", final=True, utterance_id="u2")
    error = await client.wait_event(Event.ERROR, 2, timeout_s=30)
    assert error.detail == "anthropic: the LLM server reported an error (overloaded_error)"
    assert (
        "Assistant: Paris is the capital of France."
        in server.posts()[1].json()["messages"][0]["content"]
    )
    await client.user("Thanks, and of Italy?", final=True, utterance_id="u3")
    await client.wait_event(Event.DONE, 3, timeout_s=30)
    assert client.answer(3) == "Paris is the capital of France, on the Seine."
    assert await client.finish() == grpc.StatusCode.OK


def test_the_service_starts_without_the_anthropic_sdk():
    """The anthropic SDK takes seconds to import on a busy host (2.9 of 4.1 s on
    2 shared cores): a restarted oracle serving the default back-end must not
    spend them before it serves, so it is imported with the first Anthropic
    session."""
    probe = "import sys, services.oracle.server; print('anthropic' in sys.modules)"
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert shown.stdout.strip() == "False", shown.stderr


def test_an_allowed_anthropic_backend_is_imported_in_a_thread_once_serving():
    """A back-end callers may choose is imported off the event loop after the
    oracle serves, not at the first session choosing it (which would stall
    every call on the loop for as long as the import takes)."""
    probe = """
import asyncio, sys, time
from services.oracle.config import OracleSettings
from services.oracle.server import serve

async def main():
    settings = OracleSettings(
        host="127.0.0.1", port=0, metrics_port=0, redis_url="", warmup_timeout_s=0,
        base_url="http://127.0.0.1:1/v1", allowed_backends="openai,anthropic",
    )
    runtime = await serve(settings)
    deadline = time.monotonic() + 60
    while "services.oracle.anthropic_backend" not in sys.modules and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    print("services.oracle.anthropic_backend" in sys.modules)
    await runtime.stop()

asyncio.run(main())
"""
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert shown.stdout.split()[-1:] == ["True"], shown.stdout + shown.stderr
