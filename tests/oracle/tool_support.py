"""A fake LLM that calls tools, on both wire formats, and the test MCP server
on streamable HTTP in the test's process.

OpenAI and Anthropic cannot be reached from here: the local HTTP server
(conftest's stub_http) stands in for them and speaks their documented
streaming formats with tool calls. Its "model" is a rule: a question about a
booking, a door code or an order calls the matching tool (if it is offered);
with a tool's result in hand it says the result; with an error result it
apologises. Before a tool call it says "One moment.", as a model keeping the
caller company would. On a phone call it says goodbye and calls hang_up when
asked to hang up, and calls transfer_call to "sales" when asked for a transfer
(the telephony service's call control, when offered).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn

from tests.oracle import mcp_tool_server

# keyword in the caller's question -> (tool, its arguments)
RULES = (
    ("book", "book_table", {"city": "Paris"}),
    ("code", "door_code", {"office": "Paris"}),
    ("order", "order_status", {"order": "A7"}),
    ("crash", "crash_server", {}),
    ("train", "next_train", {"city": "Paris"}),
)
HOLD = "One moment."
APOLOGY = "Sorry, I couldn't reach that system just now."
UNSURE = "I am not sure."
# A phone call's call control (the telephony service's client functions): keyword ->
# (function, its arguments, what the model says before the call). Once it has the
# result it says nothing more (the line is closing or moving), or apologises.
CALL_CONTROL = (
    ("hang", "hang_up", {}, "Goodbye!"),
    ("transfer", "transfer_call", {"target": "sales"}, "Transferring you to sales."),
)


def last_user_line(transcript: str) -> str:
    return [line for line in transcript.splitlines() if line.startswith("User:")][-1]


def reply(question: str, results: list[tuple[str, bool]], offered: set[str]):
    """(what the model says, (tool, arguments) it calls or None)."""
    control = [
        c for c in CALL_CONTROL if re.search(rf"\b{c[0]}", question, re.I) and c[1] in offered
    ]
    if results:
        text, is_error = results[-1]
        if is_error:
            return APOLOGY, None
        return ("" if control else f"Here you go: {text}"), None
    if control:
        _, function, arguments, words = control[0]
        return words, (function, arguments)
    for keyword, tool, arguments in RULES:
        if keyword in question.lower() and tool in offered:
            return HOLD, (tool, arguments)
    return UNSURE, None


def pieces(text: str, size: int = 5) -> list[str]:
    """Cut mid-word on purpose: the oracle must re-cut at word boundaries."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def _openai_chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-tools",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "stub-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


async def openai_chat(request, respond, pause_before_call_s: float = 0.0) -> None:
    """POST /v1/chat/completions with streamed `tool_calls` (after a pause, if given:
    the model thinking between its words and its call)."""
    body = request.json()
    # A tool message carries no error flag: the oracle's error results say "error:".
    results = [
        (m["content"], m["content"].startswith("error:"))
        for m in body["messages"]
        if m["role"] == "tool"
    ]
    offered = {tool["function"]["name"] for tool in body.get("tools", [])}
    text, call = reply(last_user_line(body["messages"][1]["content"]), results, offered)
    await respond.start_sse()
    for piece in pieces(text):
        await respond.sse(_openai_chunk({"content": piece}))
    if call is not None:
        await asyncio.sleep(pause_before_call_s)
        name, arguments = call
        encoded = json.dumps(arguments)
        first = {"index": 0, "id": f"call_{len(request.body)}", "type": "function"}
        first["function"] = {"name": name, "arguments": ""}
        await respond.sse(_openai_chunk({"tool_calls": [first]}))
        for piece in pieces(encoded, 7):
            await respond.sse(
                _openai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            )
    await respond.sse(_openai_chunk({}, "tool_calls" if call else "stop"))
    await respond.sse("[DONE]")


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


def _anthropic_results(messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    return [
        (block["content"], bool(block.get("is_error")))
        for message in messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]


async def anthropic_messages(request, respond) -> None:
    """POST /v1/messages with a streamed `tool_use` block."""
    body = request.json()
    offered = {tool["name"] for tool in body.get("tools", [])}
    text, call = reply(
        last_user_line(body["messages"][0]["content"]),
        _anthropic_results(body["messages"]),
        offered,
    )
    message = {
        "id": "msg_tools",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": body["model"],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 42, "output_tokens": 1},
    }
    await respond.start_sse()
    await respond.sse({"type": "message_start", "message": message}, event="message_start")
    block = {"type": "text", "text": ""}
    await respond.sse(
        {"type": "content_block_start", "index": 0, "content_block": block},
        event="content_block_start",
    )
    for piece in pieces(text):
        delta = {"type": "text_delta", "text": piece}
        await respond.sse(
            {"type": "content_block_delta", "index": 0, "delta": delta},
            event="content_block_delta",
        )
    await respond.sse({"type": "content_block_stop", "index": 0}, event="content_block_stop")
    if call is not None:
        name, arguments = call
        use = {"type": "tool_use", "id": f"toolu_{len(request.body)}", "name": name, "input": {}}
        await respond.sse(
            {"type": "content_block_start", "index": 1, "content_block": use},
            event="content_block_start",
        )
        for piece in pieces(json.dumps(arguments), 7):
            delta = {"type": "input_json_delta", "partial_json": piece}
            await respond.sse(
                {"type": "content_block_delta", "index": 1, "delta": delta},
                event="content_block_delta",
            )
        await respond.sse({"type": "content_block_stop", "index": 1}, event="content_block_stop")
    await respond.sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use" if call else "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 12},
        },
        event="message_delta",
    )
    await respond.sse({"type": "message_stop"}, event="message_stop")


FAKE_LLM_ROUTES = {
    ("POST", "/v1/chat/completions"): openai_chat,
    ("POST", "/v1/messages"): anthropic_messages,
}


def slow_openai_routes(pause_before_call_s: float):
    """The fake LLM's OpenAI route, pausing between its words and its tool call."""

    async def chat(request, respond) -> None:
        await openai_chat(request, respond, pause_before_call_s)

    return {("POST", "/v1/chat/completions"): chat}


@contextlib.asynccontextmanager
async def mcp_over_http(secret: str, calls_file: Path) -> AsyncIterator[str]:
    """The test MCP server on streamable HTTP on a loopback port: its URL."""
    app = mcp_tool_server.build(secret, calls_file).streamable_http_app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                serving.result()  # raises what stopped it
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        await serving
        sock.close()
