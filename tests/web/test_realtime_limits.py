"""The Realtime endpoint's limits and failures: text too long to reach the
gateway is refused with an error and the session goes on (the gateway's port
would end the whole call), and a fault of the endpoint's own is logged and
sent as the protocol's server_error before the socket closes; each driven by
the `openai` SDK through the web service and a real gateway where it needs one."""

from __future__ import annotations

import base64
import json
import logging

import pytest
from websockets.exceptions import ConnectionClosed

from kame_client.client import SendFunctionResult
from services.web.protocols.realtime import RealtimeSession
from services.web.protocols.realtime_config import MAX_TEXT_BYTES, ClientError, SessionConfig
from tests.support import wait_until
from tests.web.test_realtime import (
    ONE_SECOND,
    connect,
    events_until,
    kinds,
    received,
    typed,
    web_service,
)
from tests.web.test_realtime_protocol import sent
from tests.web.test_realtime_tools import WEATHER, function_call, output_item, with_tools

# More than the gateway's port takes at its default max_chunk_s (~385 KB).
OVER_THE_GATEWAYS = "x" * 400_000


async def test_a_typed_message_too_long_for_the_gateway_is_refused_and_the_call_goes_on(fakes):
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.conversation.item.create(item=typed("Hi."))  # the call opens
        await received(connection, 2)  # its item: added, done
        await connection.conversation.item.create(item=typed(OVER_THE_GATEWAYS))
        (refused,) = await received(connection, 1)
        # The call is still there: the next message reaches the gateway.
        await connection.conversation.item.create(item=typed("And Rome?"))
        after = await received(connection, 2)
        await wait_until(
            lambda: len(fakes.frontend.log.of("user_text")) == 2, "both messages at the front-end"
        )

    assert (refused.error.code, refused.error.param) == ("string_above_max_length", "item.content")
    assert str(MAX_TEXT_BYTES) in refused.error.message
    assert kinds(after) == ["conversation.item.added", "conversation.item.done"]
    assert [text.text for text in fakes.frontend.log.of("user_text")] == ["Hi.", "And Rome?"]


def test_a_functions_output_too_long_for_the_gateway_is_refused_and_the_call_still_waits():
    realtime = with_tools()
    function_call(realtime)
    too_long = output_item("call-1", "é" * (MAX_TEXT_BYTES // 2 + 1))  # 2 bytes a character
    (refused,) = sent(realtime, type="conversation.item.create", item=too_long)
    assert (refused["error"]["code"], refused["error"]["param"]) == (
        "string_above_max_length",
        "item.output",
    )
    reply = realtime.on_client(
        json.dumps({"type": "conversation.item.create", "item": output_item("call-1")})
    )
    assert reply.requests == [SendFunctionResult("call-1", "sunny")]  # the call still waited


def test_relayed_instructions_and_tools_too_long_for_the_gateway_are_refused():
    relayed = SessionConfig(relay_instructions=True)
    with pytest.raises(ClientError) as refused:
        relayed.updated({"instructions": OVER_THE_GATEWAYS}, locked=False)
    assert (refused.value.code, refused.value.param) == (
        "string_above_max_length",
        "session.instructions",
    )
    wordy = [WEATHER | {"name": f"f{n}", "description": "y" * 20_000} for n in range(4)]
    with pytest.raises(ClientError) as too_many:
        relayed.updated({"tools": wordy}, locked=False)
    assert too_many.value.param == "session.tools"
    # Instructions that are kept, not relayed, are capped too: kept is memory.
    with pytest.raises(ClientError) as kept:
        SessionConfig().updated({"instructions": OVER_THE_GATEWAYS}, locked=False)
    assert kept.value.code == "string_above_max_length"


@pytest.mark.parametrize("fault_in", ["on_converse", "on_client"])
async def test_a_fault_of_the_endpoint_is_logged_and_sent_as_a_server_error(
    fakes, monkeypatch, caplog, fault_in
):
    # A bug of the endpoint's own, in what it makes of the gateway's events or of
    # the client's (the fault injected: no input makes the real code fail).
    def broken(self, event):
        raise RuntimeError("a bug")

    monkeypatch.setattr(RealtimeSession, fault_in, broken)
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = await events_until(connection, "error")
        with pytest.raises(ConnectionClosed):
            await received(connection, 1)

    error = seen[-1].error
    assert (error.type, error.code) == ("server_error", "server_error")
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failures and "RuntimeError: a bug" in caplog.text
