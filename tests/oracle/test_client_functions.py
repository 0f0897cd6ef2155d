"""The client's own functions as tools of the oracle, and the ToolActivity the
oracle shows for every tool run.

OpenAI and Anthropic cannot be reached from here: the LLM is the fake of
tool_support.py (on conftest's stub_http), which calls a tool when the
caller's question names it and it is offered, and says the tool's result (or
apologises for an error). The test plays the gateway's part on the real
oracle's Guide stream: it declares the functions in OracleConfig, reads each
GuideResponse.function_call and answers with a GuideRequest.function_result,
made up by the test so no model could guess it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable

import grpc
import pytest
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY

from kamepb import common_pb2, oracle_pb2
from kamepb.common_pb2 import LLM_BACKEND_ANTHROPIC
from services.oracle.tools.client_functions import client_function_specs
from tests.oracle.tool_support import (
    APOLOGY,
    FAKE_LLM_ROUTES,
    HOLD,
    anthropic_models,
    mcp_over_http,
)

Event = oracle_pb2.OracleEvent
Activity = common_pb2.ToolActivity
# Each partial restarts the LLM: the start window must not hold any back.
POLICY = oracle_pb2.OraclePolicy(poll_interval_s=0.05, max_starts=50)

DOOR_CODE = common_pb2.ClientFunction(
    name="door_code",
    description="The door code of one of our offices.",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"office": {"type": "string"}}, "required": ["office"]}
    ),
    read_only=True,
)
BOOK_TABLE = common_pb2.ClientFunction(
    name="book_table",
    description="Book a table for the caller in a restaurant of a city.",
    parameters_json=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}),
)
ORDER_STATUS = common_pb2.ClientFunction(
    name="order_status", description="Where the caller's order is.", read_only=True
)


@pytest.fixture
def secret() -> str:
    return f"zq-{uuid.uuid4().hex[:10]}"


class PlayedGateway:
    """Answers the oracle's function calls as a gateway relaying the client's
    results would: `answer(call)` is the output, or None to never answer."""

    def __init__(self, client, answer: Callable[[common_pb2.FunctionCall], str | None]) -> None:
        self.client = client
        self.answer = answer
        self.calls: list[common_pb2.FunctionCall] = []
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        with contextlib.suppress(AssertionError):  # the stream ended
            while True:
                response = await self.client.wait_for(self._unanswered, timeout_s=3600)
                self.calls.append(response.function_call)
                output = self.answer(response.function_call)
                if output is not None:
                    await self.client.send(result(response.function_call.call_id, output))

    def _unanswered(self, response: oracle_pb2.GuideResponse) -> bool:
        seen = {call.call_id for call in self.calls}
        return response.HasField("function_call") and response.function_call.call_id not in seen

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def timed_calls(tool: str) -> float:
    """Calls observed in kame_oracle_tool_seconds under this `tool` label."""
    labels = {"tool": tool, "outcome": "ok"}
    return REGISTRY.get_sample_value("kame_oracle_tool_seconds_count", labels) or 0.0


def result(call_id: str, output: str, is_error: bool = False) -> oracle_pb2.GuideRequest:
    return oracle_pb2.GuideRequest(
        function_result=common_pb2.FunctionResult(call_id=call_id, output=output, is_error=is_error)
    )


def activity(client) -> list[common_pb2.ToolActivity]:
    return [r.tool for r in client.responses if r.HasField("tool")]


def position(client, predicate) -> int:
    """Index of the first response that satisfies `predicate`."""
    return next(i for i, r in enumerate(client.responses) if predicate(r))


def is_start(generation: int):
    return lambda r: (
        r.HasField("event")
        and r.event.kind == Event.REQUEST_START
        and r.event.generation == generation
    )


async def open_session(stub_http, oracle_service, guide_client, session_id, functions, **settings):
    """A Guide stream with the client's `functions` on an oracle whose LLM is the fake."""
    _llm, url = await stub_http(FAKE_LLM_ROUTES)
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model", **settings)
    client = guide_client(runtime.port)
    await client.config(session_id=session_id, policy=POLICY, client_functions=functions)
    return _llm, client


async def partials_then_final(client, words: list[str]) -> None:
    """Five growing partials of one utterance, each answered (its candidate DONE)
    before the next, then the final and its answer."""
    for n in range(1, 6):
        await client.user(" ".join(words[: 1 + 2 * n]))
        await client.wait_event(Event.DONE, n, timeout_s=30)
    await client.user(" ".join(words), final=True)
    await client.wait_event(Event.DONE, 6, timeout_s=30)


async def test_a_client_function_round_trip(
    secret, stub_http, oracle_service, guide_client, session_id
):
    llm, client = await open_session(
        stub_http, oracle_service, guide_client, session_id, [DOOR_CODE, BOOK_TABLE]
    )
    gateway = PlayedGateway(client, lambda call: f"The door code is {secret}.")
    timed_before, named_before = timed_calls("client"), timed_calls("door_code")
    await client.send(result("call_nobody_made", "ignored"))  # an unknown call_id: ignored
    await client.user("What is the door code of the Paris office?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)

    assert client.answer(1) == f"{HOLD} Here you go: The door code is {secret}."
    (call,) = gateway.calls
    assert (call.name, json.loads(call.arguments_json)) == ("door_code", {"office": "Paris"})
    asked = llm.posts()[0].json()
    assert {tool["function"]["name"] for tool in asked["tools"]} == {"door_code", "book_table"}
    (door_code,) = [t["function"] for t in asked["tools"] if t["function"]["name"] == "door_code"]
    assert door_code["parameters"] == json.loads(DOOR_CODE.parameters_json)
    assert door_code["description"] == DOOR_CODE.description

    # One STARTED before the call went out, one FINISHED after, under the call's id.
    started, finished = activity(client)
    assert (started.phase, finished.phase) == (Activity.STARTED, Activity.FINISHED)
    assert started.call_id == finished.call_id == call.call_id
    assert (finished.name, finished.source, finished.read_only) == ("door_code", "client", True)
    assert not finished.is_error and not finished.reused and finished.elapsed_s > 0
    # Timed under one "client" label: callers choose the names, so no series per name.
    assert timed_calls("client") == timed_before + 1
    assert timed_calls("door_code") == named_before
    assert position(client, lambda r: r.HasField("tool")) < position(
        client, lambda r: r.HasField("function_call")
    )
    # A second answer for the same call is ignored too: the stream goes on unharmed.
    await client.send(result(call.call_id, "too late"))
    await gateway.stop()
    client.assert_update_protocol()
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_client_that_never_answers_gets_an_apology_and_the_call_goes_on(
    secret, stub_http, oracle_service, guide_client, session_id
):
    llm, client = await open_session(
        stub_http,
        oracle_service,
        guide_client,
        session_id,
        [ORDER_STATUS, DOOR_CODE],
        tool_timeout_s=1.0,
    )
    gateway = PlayedGateway(
        client, lambda call: secret if call.name == "door_code" else None
    )  # order_status is never answered
    started = time.monotonic()
    await client.user("Where is my order?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)
    took = time.monotonic() - started

    assert client.answer(1) == f"{HOLD} {APOLOGY}"
    assert 1.0 <= took < 6.0  # the 1 s timeout, and not much more on a loaded machine
    told = llm.posts()[1].json()["messages"][-1]["content"]
    assert told == "error: order_status did not answer within 1 s"
    finished = activity(client)[-1]
    assert (finished.phase, finished.name, finished.is_error) == (
        Activity.FINISHED,
        "order_status",
        True,
    )
    assert finished.elapsed_s >= 1.0
    await client.send(result(gateway.calls[0].call_id, "shipped"))  # too late: ignored

    await client.agent(f"{HOLD} {APOLOGY}", start_s=1.0)
    await client.user("And the door code of the Paris office?", final=True, utterance_id="u2")
    await client.wait_event(Event.DONE, 2, timeout_s=30)
    assert client.answer(2) == f"{HOLD} Here you go: {secret}"
    assert [call.name for call in gateway.calls] == ["order_status", "door_code"]
    await gateway.stop()
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_read_only_client_function_runs_on_a_partial_and_is_reused(
    secret, stub_http, oracle_service, guide_client, session_id
):
    _llm, client = await open_session(
        stub_http, oracle_service, guide_client, session_id, [DOOR_CODE]
    )
    gateway = PlayedGateway(client, lambda call: secret)
    words = "The door code of the Paris office for the visit today please".split()
    await partials_then_final(client, words)

    (call,) = gateway.calls  # asked once, on the first partial
    assert position(client, lambda r: r.HasField("function_call")) < position(client, is_start(2))
    for n in range(1, 7):
        assert secret in client.answer(n)
    # The run's pair, then the final's use of it: a pair of its own, reused.
    run_started, run_finished, reuse_started, reuse_finished = activity(client)
    assert run_started.call_id == run_finished.call_id == call.call_id
    assert not run_finished.reused
    assert reuse_started.call_id == reuse_finished.call_id != call.call_id
    assert reuse_finished.reused and reuse_finished.elapsed_s == run_finished.elapsed_s
    assert position(
        client, lambda r: r.HasField("tool") and r.tool.call_id == reuse_started.call_id
    ) > position(client, is_start(6))
    await gateway.stop()
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_side_effect_client_function_runs_once_after_the_final(
    secret, stub_http, oracle_service, guide_client, session_id
):
    _llm, client = await open_session(
        stub_http, oracle_service, guide_client, session_id, [BOOK_TABLE]
    )
    booked = f"Booked, reference {secret}."
    gateway = PlayedGateway(client, lambda call: booked)
    words = "Please book a table for two in Paris tonight at eight thanks".split()
    await partials_then_final(client, words)

    for n in range(1, 6):
        assert client.answer(n) == HOLD  # each partial's candidate stopped at the booking
    assert client.answer(6) == f"{HOLD} Here you go: {booked}"
    (call,) = gateway.calls
    assert json.loads(call.arguments_json) == {"city": "Paris"}
    assert position(client, lambda r: r.HasField("function_call")) > position(client, is_start(6))
    assert [(a.phase, a.read_only, a.reused) for a in activity(client)] == [
        (Activity.STARTED, False, False),
        (Activity.FINISHED, False, False),
    ]
    await gateway.stop()
    assert await client.finish() == grpc.StatusCode.OK


async def test_an_error_from_the_client_is_an_error_result_on_anthropic_too(
    stub_http, oracle_service, guide_client, session_id, spans
):
    """The client's error text reaches the model, not the trace: with transcripts
    out of spans (KAME_TRACE_TRANSCRIPTS off), the tool span's status says only that
    the tool failed (the old span status carried the client's words)."""
    llm, url = await stub_http({**FAKE_LLM_ROUTES, ("GET", "/v1/models"): anthropic_models})
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
        policy=POLICY,
        client_functions=[DOOR_CODE],
    )
    await client.user("What is the door code of the Paris office?", final=True)
    asking = await client.wait_for(lambda r: r.HasField("function_call"), timeout_s=30)
    private = "the card of Alice Example ending 4242 was declined"
    await client.send(result(asking.function_call.call_id, private, is_error=True))
    await client.wait_event(Event.DONE, 1, timeout_s=30)

    assert client.answer(1) == f"{HOLD} {APOLOGY}"
    asked, answered = (post.json() for post in llm.posts())
    assert asked["tools"][0]["input_schema"] == json.loads(DOOR_CODE.parameters_json)
    (told,) = answered["messages"][-1]["content"]
    assert (told["content"], told["is_error"]) == (f"error: {private}", True)
    assert activity(client)[-1].is_error
    assert await client.finish() == grpc.StatusCode.OK
    (span,) = [
        s
        for s in spans.get_finished_spans()
        if s.name == "oracle.tool_call" and s.attributes.get("kame.session_id") == session_id
    ]
    assert span.status.status_code == StatusCode.ERROR
    assert "Alice" not in (span.status.description or "") and "4242" not in str(span.status)
    assert "door_code" in (span.status.description or "")


async def test_the_session_ending_ends_the_wait_for_a_client(
    stub_http, oracle_service, guide_client, session_id
):
    _llm, client = await open_session(
        stub_http, oracle_service, guide_client, session_id, [DOOR_CODE], tool_timeout_s=60.0
    )
    await client.user("What is the door code of the Paris office?", final=True)
    await client.wait_for(lambda r: r.HasField("function_call"), timeout_s=30)
    started = time.monotonic()
    assert await client.finish() == grpc.StatusCode.OK
    assert time.monotonic() - started < 10  # not the 60 s the call could wait
    _started, finished = activity(client)
    assert finished.phase == Activity.FINISHED and finished.is_error


async def test_mcp_and_client_tools_show_activity_and_their_names_cannot_clash(
    secret, tmp_path, stub_http, oracle_service, guide_client, session_id
):
    async with mcp_over_http(secret, tmp_path / "calls.jsonl") as mcp_url:
        _llm, url = await stub_http(FAKE_LLM_ROUTES)
        runtime = await oracle_service(
            base_url=f"{url}/v1",
            model="stub-model",
            mcp_servers=f"vault={mcp_url}",
            tools_allowed="vault.door_code:readonly",
        )
        clash = guide_client(runtime.port)
        await clash.config(session_id=session_id, client_functions=[DOOR_CODE])
        assert await clash.finish() == grpc.StatusCode.INVALID_ARGUMENT
        assert "client function 'door_code' has the name of one of the oracle's own tools" in (
            clash.error.details()
        )

        client = guide_client(runtime.port)
        await client.config(session_id=session_id, policy=POLICY, client_functions=[BOOK_TABLE])
        gateway = PlayedGateway(client, lambda call: "booked")
        await client.user("What is the door code of the Paris office?", final=True)
        await client.wait_event(Event.DONE, 1, timeout_s=30)
        assert secret in client.answer(1)
        await client.agent(client.answer(1), start_s=1.0)
        await client.user("Please book a table in Paris", final=True, utterance_id="u2")
        await client.wait_event(Event.DONE, 2, timeout_s=30)
        assert client.answer(2) == f"{HOLD} Here you go: booked"

        shown = [(a.phase, a.name, a.source, a.read_only, a.is_error) for a in activity(client)]
        assert shown == [
            (Activity.STARTED, "door_code", "vault", True, False),
            (Activity.FINISHED, "door_code", "vault", True, False),
            (Activity.STARTED, "book_table", "client", False, False),
            (Activity.FINISHED, "book_table", "client", False, False),
        ]
        assert len({a.call_id for a in activity(client)}) == 2
        await gateway.stop()
        assert await client.finish() == grpc.StatusCode.OK


# -- what a client may declare ------------------------------------------------------------------


def test_client_functions_become_tools_of_source_client():
    door_code, book_table, order_status = client_function_specs(
        [DOOR_CODE, BOOK_TABLE, ORDER_STATUS], max_count=3, timeout_s=2.5
    )
    assert (door_code.server, door_code.read_only, door_code.timeout_s) == ("client", True, 2.5)
    assert not book_table.read_only
    assert order_status.parameters == {"type": "object", "properties": {}}  # none given
    assert door_code.parameters["required"] == ["office"]


def function(name: str = "f", parameters: object = None, description: str = "Does f."):
    text = (
        parameters if isinstance(parameters, str) else json.dumps(parameters or {"type": "object"})
    )
    return common_pb2.ClientFunction(name=name, description=description, parameters_json=text)


def wide_schema(size: int) -> dict[str, object]:
    """An object schema of about `size` bytes of JSON: one property, a long description."""
    return {"type": "object", "properties": {"x": {"type": "string", "description": "d" * size}}}


BAD_FUNCTIONS = [
    (
        [function("hang up")],
        "function #1: the name must be 1-64 characters of A-Z a-z 0-9 _ -, got 'hang up'",
    ),
    ([function("x" * 65)], "must be 1-64 characters"),
    (
        [function(""), function()],
        "function #1: the name must be 1-64 characters of A-Z a-z 0-9 _ -, got ''",
    ),
    ([function(), function()], "function #2: 'f' is declared twice"),
    ([function(parameters="{not json")], "function #1: parameters_json is not JSON"),
    ([function(parameters=["a"])], "must be the JSON Schema of an object"),
    ([function(parameters={"type": "string"})], "must be the JSON Schema of an object"),
    (
        [function(parameters={"type": "object", "properties": 5})],
        "function #1: parameters_json is not a valid JSON Schema",
    ),
    ([function(parameters="[" * 20000)], "parameters_json may have at most 16384 characters"),
    ([function(description="x" * 1025)], "the description may have at most 1024 characters"),
    ([function(f"f{n}") for n in range(3)], "client_functions: 3 declared, at most 2 allowed"),
    (
        # Each within its own limits, too much together: the LLM reads them all each time.
        [function(f"f{n}", wide_schema(8300)) for n in range(2)],
        "client_functions: the declarations take 16",
    ),
]


@pytest.mark.parametrize("functions, message", BAD_FUNCTIONS)
def test_what_cannot_be_offered_is_refused_by_name(functions, message):
    with pytest.raises(ValueError) as refused:
        client_function_specs(functions, max_count=2, timeout_s=5.0)
    assert message in str(refused.value)


async def test_a_bad_client_function_refuses_the_session(
    stub_http, oracle_service, guide_client, session_id
):
    _llm, url = await stub_http(FAKE_LLM_ROUTES)
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model", max_client_functions=1)
    for functions, message in (
        ([function(parameters={"type": "array"})], "function #1: parameters_json must"),
        ([DOOR_CODE, BOOK_TABLE], "client_functions: 2 declared, at most 1 allowed"),
    ):
        client = guide_client(runtime.port)
        await client.config(session_id=session_id, client_functions=functions)
        assert await client.finish() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in client.error.details()
    assert runtime.active_sessions == 0
