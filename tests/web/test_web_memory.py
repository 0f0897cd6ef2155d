"""What a client without a token can make the web service keep: each route's
largest WebSocket message (services/web/socket_limits.py, enforced by the
parser before a larger one is buffered, over real sockets), a Realtime
session's instructions (capped whether relayed or not), the ids clients give
items, and the bytes a session's items keep (realtime_items.History)."""

from __future__ import annotations

import json

import pytest
import websockets

from kame_common.private_names import IncompatibleLibraries
from services.web import socket_limits
from services.web.protocols.live import LiveSession
from services.web.protocols.realtime import RealtimeSession
from services.web.protocols.realtime_config import MAX_TEXT_BYTES
from services.web.protocols.realtime_items import MAX_ID_CHARS, MAX_KEPT_BYTES
from services.web.server import ROUTE_MESSAGE_BYTES
from tests.support.private_names import (
    constraints_pins,
    missing_once_hidden,
    spelled_private_names,
)
from tests.web.test_realtime import web_service

MODES = ["tandem", "cascade", "s2s"]


def sent(realtime: RealtimeSession, **event) -> list[dict]:
    return realtime.on_client(json.dumps(event)).events


def typed(text: str, item_id: str | None = None) -> dict:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return item | ({"id": item_id} if item_id else {})


def test_instructions_not_relayed_are_capped_too():
    realtime = RealtimeSession("kame-tandem", MODES, relay_instructions=False)
    long = "x" * (MAX_TEXT_BYTES + 1)
    (error,) = sent(realtime, type="session.update", session={"instructions": long})
    assert error["error"]["code"] == "string_above_max_length", error
    assert realtime.config.instructions == "", "nothing of the refused update is kept"


def test_a_clients_item_id_is_length_capped():
    realtime = RealtimeSession("kame-tandem", MODES)
    item = typed("hello", "i" * (MAX_ID_CHARS + 1))
    (error,) = sent(realtime, type="conversation.item.create", item=item)
    assert (error["error"]["code"], error["error"]["param"]) == (
        "string_above_max_length",
        "item.id",
    )
    assert sent(realtime, type="conversation.item.create", item=typed("hello", "i" * MAX_ID_CHARS))


def test_a_sessions_items_keep_a_bounded_number_of_bytes():
    realtime = RealtimeSession("kame-tandem", MODES)
    text = "y" * (MAX_TEXT_BYTES - 100)
    count = 2 * MAX_KEPT_BYTES // len(text)
    for n in range(count):
        sent(realtime, type="conversation.item.create", item=typed(text, f"item_{n}"))
    kept = [n for n in range(count) if f"item_{n}" in realtime.history]
    assert realtime.history.kept_bytes <= MAX_KEPT_BYTES
    assert kept == list(range(count - len(kept), count)) and len(kept) < count / 2 + 1


async def test_the_libraries_have_what_the_adapter_relies_on():
    # async: uvicorn's protocol, made to look for `conn` on, wants a running loop
    assert socket_limits.missing_private_names() == []
    assert constraints_pins(socket_limits.PINNED) == socket_limits.PINNED
    assert spelled_private_names(socket_limits) == set()  # internals, but no _names


@pytest.mark.parametrize("entry", socket_limits.GUARDED, ids=lambda entry: entry.label)
async def test_an_upgrade_that_drops_a_relied_on_name_is_noticed(entry):
    import uvicorn
    import websockets as ws

    packages = {"uvicorn": uvicorn, "websockets": ws}
    missing = missing_once_hidden(entry, packages, socket_limits.missing_private_names)
    assert missing and missing[0].startswith(entry.label), missing
    with pytest.raises(IncompatibleLibraries, match=r"socket_limits\.py is written for uvicorn"):
        socket_limits.private_names.check(
            "services/web/socket_limits.py", socket_limits.PINNED, missing
        )


async def closed_by(url: str, message: bytes | str, **headers: str) -> int | None:
    async with websockets.connect(url, additional_headers=headers, max_size=None) as socket:
        try:
            await socket.send(message)
            while True:
                await socket.recv()
        except websockets.ConnectionClosed:
            pass
    return socket.close_code


async def test_each_route_closes_a_message_over_its_limit_and_serves_on(fakes):
    async with web_service(fakes) as web:
        base = f"ws://127.0.0.1:{web.port}"
        page = {"Origin": base.replace("ws:", "http:")}
        page_limit, moshi_limit = ROUTE_MESSAGE_BYTES["/converse"], ROUTE_MESSAGE_BYTES["/api/chat"]
        assert await closed_by(f"{base}/converse", bytes(page_limit + 1), **page) == 1009
        assert await closed_by(f"{base}/api/chat", b"\x01" + bytes(moshi_limit)) == 1009
        huge = json.dumps({"type": "session.update", "session": {"instructions": "x" * (15 << 20)}})
        assert await closed_by(f"{base}/v1/realtime?model=kame-tandem", huge) == 1009
        async with websockets.connect(f"{base}/v1/realtime?model=kame-tandem") as after:
            assert json.loads(await after.recv())["type"] == "session.created"


def test_a_gpt_live_delegations_tools_are_capped_as_realtimes():
    tool = {
        "type": "function",
        "name": "huge",
        "parameters": {"type": "object", "description": "x" * MAX_TEXT_BYTES},
    }
    delegation = {"type": "responses", "responses": {"model": "default", "tools": [tool]}}
    live = LiveSession(MODES, [])
    reply = live.on_client(
        json.dumps(
            {"type": "session.start", "session": {"model": "gpt-live-1", "delegation": delegation}}
        )
    )
    (error,) = reply.events
    assert reply.open_call is None
    assert (error["error"]["code"], error["error"]["param"]) == (
        "invalid_value",
        "session.delegation.responses.tools",
    )
