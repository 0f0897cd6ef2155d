"""The Realtime endpoint's function calling without a network (services/web/
realtime.py, realtime_config.py, realtime_items.py): session.update `tools`
and `tool_choice` as the Converse config's functions, the gateway's
function_call as a function_call item streamed in a response (checked against
the `openai` SDK's own types of the server events), the client's
function_call_output as the gateway's function result, and the response.create
after it asking the gateway for nothing (the agent goes on by itself); then
the `openai` SDK doing the same through the web service and a real gateway."""

from __future__ import annotations

import base64
import json

import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from kame_client.client import SendFunctionResult
from kame_client.events import FunctionCall, ToolFinished, ToolStarted
from kamepb import common_pb2
from services.web.protocols.realtime import RESPOND, RealtimeSession
from services.web.protocols.realtime_config import ClientError, SessionConfig
from tests.gateway.fakes import transcript
from tests.support import wait_until
from tests.web.test_realtime import (
    ONE_SECOND,
    connect,
    events_until,
    kinds,
    received,
    web_service,
)
from tests.web.test_realtime_protocol import MODES, agent, sent

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
# A function call's events, in OpenAI's order, within its response.
CALL_EVENTS = [
    "response.output_item.added",
    "conversation.item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "conversation.item.done",
]
SERVER_EVENT = TypeAdapter(RealtimeServerEvent)


def with_tools(**session) -> RealtimeSession:
    realtime = RealtimeSession("kame-tandem", MODES)
    [updated] = sent(realtime, type="session.update", session={"tools": [WEATHER], **session})
    assert updated["type"] == "session.updated", updated
    return realtime


def function_call(realtime: RealtimeSession, call_id: str = "call-1", arguments: str = "") -> list:
    event = FunctionCall(call_id, "get_weather", arguments or json.dumps({"city": "Paris"}))
    return realtime.on_converse(event)


def output_item(call_id: str, output: str = "sunny", **fields) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output, **fields}


def test_tools_become_the_calls_functions_and_are_shown_back():
    realtime = with_tools()
    [function] = realtime.config.converse_config("tandem").functions
    assert (function.name, function.description) == ("get_weather", "The weather in a city.")
    assert json.loads(function.parameters_json) == WEATHER["parameters"]
    [updated] = sent(realtime, type="session.update", session={"instructions": "Hi."})
    assert updated["session"]["tools"] == [WEATHER]  # kept by an update without tools
    assert updated["session"]["tool_choice"] == "auto"
    SERVER_EVENT.validate_python(updated)


@pytest.mark.parametrize(
    ("tool_choice", "declared"),
    [("auto", 1), ("required", 1), ({"type": "function", "name": "get_weather"}, 1), ("none", 0)],
)
def test_tool_choice_none_declares_no_function_and_the_others_are_taken_as_auto(
    tool_choice, declared
):
    config = SessionConfig().updated({"tools": [WEATHER], "tool_choice": tool_choice}, False)
    assert len(config.converse_config("tandem").functions) == declared
    assert config.described("kame-tandem")["tool_choice"] == tool_choice


@pytest.mark.parametrize(
    ("update", "code", "param"),
    [
        (
            {"tools": [{"type": "mcp", "server_label": "x"}]},
            "unsupported_value",
            "session.tools[0].type",
        ),
        ({"tools": [{"type": "function"}]}, "invalid_value", "session.tools[0].name"),
        (
            {"tools": [WEATHER, {**WEATHER, "parameters": "{}"}]},
            "invalid_type",
            "session.tools[1].parameters",
        ),
        ({"tools": WEATHER}, "invalid_type", "session.tools"),
        ({"tool_choice": "sometimes"}, "invalid_value", "session.tool_choice"),
    ],
)
def test_tools_the_stack_cannot_declare_are_refused_naming_the_field(update, code, param):
    with pytest.raises(ClientError) as refused:
        SessionConfig().updated(update, locked=False)
    assert (refused.value.code, refused.value.param) == (code, param)


def test_tools_are_the_calls_once_it_is_open():
    config = SessionConfig().updated({"tools": [WEATHER]}, locked=False)
    assert config.updated({"tools": [WEATHER]}, locked=True) == config  # repeated as they are
    for update in ({"tools": []}, {"tool_choice": "none"}):
        with pytest.raises(ClientError, match="tools") as refused:
            config.updated(update, locked=True)
        assert refused.value.code == "session_locked"


def test_a_call_while_the_agent_is_silent_is_a_response_of_its_own():
    realtime = with_tools()
    events = function_call(realtime)
    for event in events:
        SERVER_EVENT.validate_python(event)  # the shapes the openai SDK reads
    assert [e["type"] for e in events] == ["response.created", *CALL_EVENTS, "response.done"]
    created, added, item_added, delta, done, item_done, conv_done, response_done = events
    response_id = created["response"]["id"]
    assert added["item"]["status"] == "in_progress" and added["item"]["arguments"] == ""
    assert item_added["item"]["id"] == added["item"]["id"]
    assert {e["response_id"] for e in (added, delta, done, item_done)} == {response_id}
    assert {e["output_index"] for e in (added, delta, done, item_done)} == {0}
    assert json.loads(delta["delta"]) == {"city": "Paris"} == json.loads(done["arguments"])
    assert (done["call_id"], done["name"]) == ("call-1", "get_weather")
    call = item_done["item"]
    assert call["status"] == "completed" and call["arguments"] == done["arguments"]
    assert conv_done["item"] == call
    assert response_done["response"]["status"] == "completed"
    assert response_done["response"]["output"] == [call]
    [retrieved] = sent(realtime, type="conversation.item.retrieve", item_id=call["id"])
    assert retrieved["item"] == call


def test_a_call_while_the_agent_speaks_joins_its_response_after_the_audio():
    realtime = with_tools()
    opened = agent(realtime, speaking=True)
    response_id = opened[0]["response"]["id"]
    events = function_call(realtime, arguments="")  # no arguments: an empty object
    assert [e["type"] for e in events] == CALL_EVENTS
    assert {e["output_index"] for e in events if "output_index" in e} == {1}
    assert {e["response_id"] for e in events if "response_id" in e} == {response_id}
    assert events[3]["arguments"] == json.dumps({"city": "Paris"})
    closed = agent(realtime, speaking=False, frames=10)
    done = closed[-1]
    assert done["type"] == "response.done"
    output = done["response"]["output"]
    assert [item["type"] for item in output] == ["message", "function_call"]
    SERVER_EVENT.validate_python(done)


def test_a_functions_output_goes_to_the_gateway_and_the_agent_goes_on_by_itself():
    realtime = with_tools(audio={"input": {"turn_detection": None}})  # push-to-talk
    call = function_call(realtime)[-2]["item"]
    reply = realtime.on_client(
        json.dumps({"type": "conversation.item.create", "item": output_item("call-1")})
    )
    added, done = reply.events
    assert added["type"] == "conversation.item.added"
    assert added["previous_item_id"] == call["id"]
    assert done["type"] == "conversation.item.done"
    assert done["item"]["type"] == "function_call_output" and done["item"]["output"] == "sunny"
    for event in reply.events:
        SERVER_EVENT.validate_python(event)
    assert reply.requests == [SendFunctionResult("call-1", "sunny")]
    # The SDKs ask for a response after an output: the agent's next stretch is it.
    asked = realtime.on_client(json.dumps({"type": "response.create"}))
    assert (asked.events, asked.requests) == ([], [])
    asked_again = realtime.on_client(json.dumps({"type": "response.create"}))
    assert asked_again.requests == [RESPOND]  # a response.create of the caller's own


def test_a_new_caller_turn_after_an_output_gets_its_answer_asked():
    """A client that sends no response.create after an output: the caller's
    next turn's response.create is that turn's (push-to-talk's RESPOND)."""
    realtime = with_tools(audio={"input": {"turn_detection": None}})
    function_call(realtime)
    create = {"type": "conversation.item.create", "item": output_item("call-1")}
    realtime.on_client(json.dumps(create))
    typed = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    realtime.on_client(json.dumps({"type": "conversation.item.create", "item": typed}))
    asked = realtime.on_client(json.dumps({"type": "response.create"}))
    assert asked.requests == [RESPOND]


@pytest.mark.parametrize(
    "item",
    [
        output_item("call-9"),  # no such call
        output_item("call-1", output=3),
        {"type": "function_call", "call_id": "call-1", "name": "get_weather", "arguments": "{}"},
    ],
)
def test_an_output_for_no_waiting_call_is_refused_and_sends_nothing(item):
    realtime = with_tools()
    function_call(realtime)
    reply = realtime.on_client(json.dumps({"type": "conversation.item.create", "item": item}))
    [error] = reply.events
    assert error["type"] == "error" and error["error"]["param"].startswith("item.")
    assert reply.requests == []


def test_a_call_is_answered_once():
    realtime = with_tools()
    function_call(realtime)
    create = json.dumps({"type": "conversation.item.create", "item": output_item("call-1")})
    assert realtime.on_client(create).requests
    [error] = realtime.on_client(create).events
    assert error["error"]["param"] == "item.call_id"


def test_what_the_oracles_own_tools_do_is_not_sent():
    realtime = with_tools()
    for phase in (ToolStarted, ToolFinished):
        tool = phase("t-1", "vault.door_code", "vault", True, False, 0.1, False)
        assert realtime.on_converse(tool) == []


async def test_the_openai_sdk_runs_the_agents_function_call_through_a_real_gateway(fakes):
    """The web service before a real gateway and the scripted fake upstreams
    (tests/gateway/fakes.py): the fake oracle calls the client's function on the
    caller's final transcript, and gets the output the SDK's user sent."""
    fakes.stt.script = {6: [transcript("u-1", "what is the weather in paris", True, 0.4)]}
    fakes.oracle.function_call = common_pb2.FunctionCall(
        name="get_weather", arguments_json=json.dumps({"city": "Paris"})
    )
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.session.update(session={"type": "realtime", "tools": [WEATHER]})
        (updated,) = await received(connection, 1)
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = await events_until(connection, "response.done")
        call = next(e for e in seen if e.type == "response.function_call_arguments.done")
        await connection.conversation.item.create(item=output_item(call.call_id, "sunny, 21 C"))
        added, done = await received(connection, 2)
        await wait_until(lambda: fakes.oracle.log.of("function_result"), "the oracle's result")

    assert updated.session.tools[0].name == "get_weather"
    [declared] = fakes.oracle.log.of("config")[0].client_functions
    assert json.loads(declared.parameters_json) == WEATHER["parameters"]
    # No event for the gateway's tool activity: only the call's response.
    assert kinds(seen)[-8:] == ["response.created", *CALL_EVENTS, "response.done"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert (added.type, done.item.type) == ("conversation.item.added", "function_call_output")
    [result] = fakes.oracle.log.of("function_result")
    assert (result.call_id, result.output, result.is_error) == (call.call_id, "sunny, 21 C", False)
