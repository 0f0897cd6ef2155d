"""The caller's own functions through the gateway (services/gateway/client_functions.py),
against the scripted fakes (tests/gateway/fakes.py): what is refused at the start,
the functions on every oracle stream, a call out to the caller and its result back
to the oracle that asked (and to no other), and the tools' activity on the way to
the caller. The real oracle's side is tests/oracle/test_client_functions.py; the
whole stack, tests/e2e/test_client_function_stack.py."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import REGISTRY

from kame_client.events import FunctionCall, Notice, ToolCall, ToolFinished, ToolStarted
from kame_common.auth import bearer_metadata, principal_of
from kame_common.client_functions import MAX_DECLARATIONS_BYTES
from kamepb import common_pb2, gateway_pb2
from tests.gateway.fakes import sync_converse
from tests.gateway.test_push_to_talk import SILENT_FRAME, Call

Config = gateway_pb2.ConverseConfig
Function = common_pb2.ClientFunction

LOOKUP = Function(
    name="look_up_order",
    description="The state of an order.",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}
    ),
)
CALL = common_pb2.FunctionCall(name="look_up_order", arguments_json='{"order": "A-17"}')
# Side streams that fail are reopened at once here.
QUICK_REOPEN = {"side_backoff_s": 0.05, "side_backoff_max_s": 0.1}


def client_tool_calls(outcome: str) -> float:
    labels = {"source": "client", "outcome": outcome}
    return REGISTRY.get_sample_value("kame_gateway_tool_calls_total", labels) or 0.0


def call_config(*functions: common_pb2.ClientFunction) -> gateway_pb2.ConverseConfig:
    return Config(mode=Config.CASCADE, functions=functions)


@pytest.mark.parametrize(
    ("functions", "message"),
    [
        ([Function(name="look up")], "function #1: the name must be 1-64 characters"),
        ([Function(name="x" * 65)], "function #1: the name must be 1-64 characters"),
        ([LOOKUP, LOOKUP], "function #2: 'look_up_order' is declared twice"),
        ([Function(name=f"f{i}") for i in range(3)], "3 declared, at most 2 allowed"),
        (
            [Function(name="a", description="word " * 300)],
            "function #1: the description may have at most 1024",
        ),
        ([Function(name="a", parameters_json="{nope")], "parameters_json is not JSON"),
        ([Function(name="a", parameters_json="[]")], '"type": "object" at its root'),
        ([Function(name="a", parameters_json='{"type": "string"}')], '"type": "object"'),
        (
            [Function(name="a", parameters_json='{"type": "object", "properties": 5}')],
            "function #1: parameters_json is not a valid JSON Schema",
        ),
        ([Function(name="a", parameters_json=" " * 16385)], None),  # blank: no arguments
        (
            [Function(name="a", parameters_json="{}" + " " * 16383)],
            "parameters_json may have at most 16384 characters",
        ),
    ],
)
async def test_functions_the_oracle_could_not_offer_are_refused_before_any_upstream(
    fakes, functions, message
):
    gateway = await fakes.gateway(max_client_functions=2)
    requests = [
        gateway_pb2.ConverseRequest(config=call_config(*functions)),
        gateway_pb2.ConverseRequest(audio=SILENT_FRAME),
    ]
    code, details, _ = await asyncio.to_thread(sync_converse, gateway.address, requests)
    if message is None:
        assert code == grpc.StatusCode.OK, details
        return
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details
    assert fakes.frontend.log.opened == 0 and fakes.oracle.log.opened == 0


async def test_declarations_too_large_together_are_refused_naming_the_limit(fakes):
    """The abuse: 24 functions of 15 KB schemas each (360 KB of tools the operator's
    LLM would read with every request) were admitted; each passed the per-function
    limits."""
    schema = {"type": "object", "properties": {"x": {"type": "string", "description": "d" * 15000}}}
    functions = [Function(name=f"f{n}", parameters_json=json.dumps(schema)) for n in range(24)]
    gateway = await fakes.gateway()
    requests = [
        gateway_pb2.ConverseRequest(config=call_config(*functions)),
        gateway_pb2.ConverseRequest(audio=SILENT_FRAME),
    ]
    code, details, _ = await asyncio.to_thread(sync_converse, gateway.address, requests)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    taken = re.search(r"functions: the declarations take (\d+) bytes of JSON", details)
    assert taken and int(taken.group(1)) > 24 * 15000, details
    assert f"at most {MAX_DECLARATIONS_BYTES} allowed" in details
    assert fakes.frontend.log.opened == 0 and fakes.oracle.log.opened == 0


async def test_a_call_goes_to_the_caller_and_only_its_result_back_to_the_oracle(fakes):
    fakes.oracle.function_call = CALL
    gateway = await fakes.gateway()
    before = client_tool_calls("ok")
    call = Call(gateway.address)
    await call.start(call_config(LOOKUP, Function(name="hang_up")))
    await call.client.send_text("Where is my order A-17?")
    await call.send_until(lambda: bool(call.of(FunctionCall)))
    (asked,) = call.of(FunctionCall)
    assert (asked.call_id, asked.name) == ("call-1", "look_up_order")
    assert json.loads(asked.arguments_json) == {"order": "A-17"}
    # A result for a call nobody asked for is ignored; the real one goes to the
    # oracle once, a second answer to the same call is ignored.
    assert await call.client.send_function_result("call-99", "made up")
    assert await call.client.send_function_result("call-1", "shipped on Monday")
    assert await call.client.send_function_result("call-1", "shipped twice")
    await call.send_until(lambda: bool(call.of(ToolFinished)))
    await call.send([SILENT_FRAME] * 3, pace_s=0)
    assert await call.finish() == grpc.StatusCode.OK

    (config,) = fakes.oracle.log.of("config")
    assert [f.name for f in config.client_functions] == ["look_up_order", "hang_up"]
    assert config.client_functions[0] == LOOKUP
    results = fakes.oracle.log.of("function_result")
    assert [(r.call_id, r.output) for r in results] == [("call-1", "shipped on Monday")]
    # The tool's activity reached the caller around the call, in order.
    kinds = [type(e) for e in call.events if isinstance(e, ToolCall | FunctionCall)]
    assert kinds == [ToolStarted, FunctionCall, ToolFinished]
    (finished,) = call.of(ToolFinished)
    assert finished.source == "client" and finished.name == "look_up_order"
    assert not finished.is_error
    assert client_tool_calls("ok") == before + 1
    session_id = call.client.session.session_id
    record = await fakes.session_record(session_id)
    assert (record["tool_calls"], record["tool_errors"]) == ("1", "0")


async def test_a_result_for_a_lost_oracle_stream_is_dropped_and_the_new_one_gets_the_functions(
    fakes,
):
    fakes.oracle.function_call = CALL
    fakes.oracle.fail_after_call = True
    gateway = await fakes.gateway(**QUICK_REOPEN)
    call = Call(gateway.address)
    await call.start(call_config(LOOKUP))
    await call.client.send_text("Where is my order A-17?")

    def notices() -> list[str]:
        return [e.kind for e in call.of(Notice)]

    # The stream that asked for call-1 broke; the gateway opened another, which got
    # the question no answer had come for (replay.py) and asks anew.
    await call.send_until(
        lambda: "ORACLE_RESTORED" in notices() and len(call.of(FunctionCall)) == 2
    )
    assert [e.call_id for e in call.of(FunctionCall)] == ["call-1", "call-2"]
    assert await call.client.send_function_result("call-1", "too late")
    assert await call.client.send_function_result("call-2", "in the warehouse")
    await call.send_until(lambda: bool(call.of(ToolFinished)))
    await call.send([SILENT_FRAME] * 3, pace_s=0)
    assert await call.finish() == grpc.StatusCode.OK

    configs = fakes.oracle.log.of("config")
    assert len(configs) == 2
    assert all(list(c.client_functions) == [LOOKUP] for c in configs)
    results = fakes.oracle.log.of("function_result")
    assert [(r.call_id, r.output) for r in results] == [("call-2", "in the warehouse")]


async def test_an_oracle_that_refuses_the_functions_ends_the_call(fakes):
    fakes.oracle.reject = True
    gateway = await fakes.gateway()
    requests = [
        gateway_pb2.ConverseRequest(config=call_config(LOOKUP)),
        *[gateway_pb2.ConverseRequest(audio=SILENT_FRAME)] * 5,
    ]
    code, details, _ = await asyncio.to_thread(sync_converse, gateway.address, requests)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("the oracle rejected the functions: ")


async def test_an_s2s_call_may_declare_functions_it_never_calls(fakes):
    """Telephony declares its call control whatever the mode: in s2s no oracle
    calls them, and the call goes on."""
    gateway = await fakes.gateway()
    requests = [
        gateway_pb2.ConverseRequest(config=Config(mode=Config.S2S, functions=[LOOKUP])),
        *[gateway_pb2.ConverseRequest(audio=SILENT_FRAME)] * 3,
    ]
    code, details, responses = await asyncio.to_thread(sync_converse, gateway.address, requests)
    assert code == grpc.StatusCode.OK, details
    assert fakes.oracle.log.opened == 0
    assert sum(r.HasField("audio") for r in responses) == 3


async def test_a_spent_token_budget_ends_the_call_with_its_message(fakes):
    """The oracle ends its stream when the call's (or its caller's) LLM token budget
    is spent: the gateway ends the call with that message, and does not reopen the
    stream (the old gateway reopened it again and again, the call going on
    without oracle). The oracle learns whose budget a call spends: the principal
    of its bearer token."""
    message = "this call's LLM token budget is spent (about 120 tokens of 100)"
    fakes.oracle.spent = message
    token = "budget-test-token-0123456789abcdef"
    gateway = await fakes.gateway(auth_tokens=token, **QUICK_REOPEN)

    def requests() -> Iterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest(config=Config())
        for _ in range(50):  # 4 s of a caller at real time, or until the call ends
            yield gateway_pb2.ConverseRequest(audio=SILENT_FRAME)
            time.sleep(0.08)

    code, details, _ = await asyncio.to_thread(
        sync_converse, gateway.address, requests(), bearer_metadata(token)
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert message in details
    assert fakes.oracle.log.opened == 1
    (config,) = fakes.oracle.log.of("config")
    assert config.caller == principal_of(token)
