"""The timing rules of tools within a caller turn (services/oracle/tools/turn.py) and
the collecting of streamed tool calls (wire.py), without a network: the toolbox
here is a small in-process one that counts its calls."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from kamepb.common_pb2 import ToolActivity as Activity
from services.oracle.tools.spec import ToolCall, ToolExchange, ToolResult, ToolSpec
from services.oracle.tools.turn import SessionTools, TurnTools
from services.oracle.tools.wire import (
    AnthropicToolUseBlocks,
    OpenAIToolCallPieces,
    anthropic_rounds,
    openai_rounds,
)

LOOKUP = ToolSpec("lookup", "Look up.", {"type": "object"}, True, 5.0, "test")
BOOK = ToolSpec("book", "Book.", {"type": "object"}, False, 5.0, "test")


class CountingToolbox:
    """Each call takes `delay_s` and answers with its tool's name and arguments;
    `names` are read-only tools it offers besides lookup and book."""

    def __init__(self, delay_s: float = 0.0, names: tuple[str, ...] = ()) -> None:
        self.delay_s = delay_s
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._more = [ToolSpec(name, name, {"type": "object"}, True, 5.0, "test") for name in names]

    @property
    def specs(self) -> list[ToolSpec]:
        return [LOOKUP, BOOK, *self._more]

    def spec(self, name: str) -> ToolSpec | None:
        return {s.name: s for s in self.specs}.get(name)

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], call_id: str) -> ToolResult:
        self.calls.append((spec.name, arguments))
        await asyncio.sleep(self.delay_s)
        return ToolResult(f"{spec.name} {arguments}")


def turn(toolbox, budget: int = 4, recorded: list | None = None) -> TurnTools:
    def record(call, result):
        if recorded is not None:
            recorded.append((call.name, result.text))

    return TurnTools(toolbox, budget, "s1", record)


async def test_calls_of_one_round_run_together_and_keep_their_order():
    toolbox = CountingToolbox(delay_s=0.3)
    started = asyncio.get_running_loop().time()
    results = await turn(toolbox).run_all(
        [ToolCall("1", "lookup", '{"a": 1}'), ToolCall("2", "book", '{"b": 2}')], final=True
    )
    assert asyncio.get_running_loop().time() - started < 0.55  # not one after the other
    assert [r.text for r in results] == ["lookup {'a': 1}", "book {'b': 2}"]
    assert all(r.elapsed_s >= 0.3 for r in results)


async def test_on_a_partial_a_side_effect_waits_and_its_read_only_neighbour_starts():
    toolbox = CountingToolbox()
    tools = turn(toolbox)
    calls = [ToolCall("1", "lookup", '{"a": 1}'), ToolCall("2", "book", "{}")]
    assert await tools.run_all(calls, final=False) is None
    await asyncio.sleep(0.05)
    assert toolbox.calls == [("lookup", {"a": 1})]
    # The final's candidate: the lookup is reused (same arguments, other spelling).
    results = await tools.run_all([ToolCall("3", "lookup", '{ "a":1 }'), calls[1]], final=True)
    assert [r.text for r in results] == ["lookup {'a': 1}", "book {}"]
    assert toolbox.calls == [("lookup", {"a": 1}), ("book", {})]


async def test_what_cannot_run_is_an_error_result_and_the_budget_counts_calls():
    toolbox = CountingToolbox()
    recorded: list = []
    tools = turn(toolbox, budget=1, recorded=recorded)
    unknown, bad, first, second = await tools.run_all(
        [
            ToolCall("1", "delete_everything", "{}"),
            ToolCall("2", "lookup", "[1, 2]"),
            ToolCall("3", "lookup", '{"a": 1}'),
            ToolCall("4", "lookup", '{"a": 2}'),
        ],
        final=True,
    )
    assert (unknown.is_error, unknown.text) == (
        True,
        "error: there is no tool named delete_everything",
    )
    assert (bad.is_error, bad.text) == (
        True,
        "error: the arguments of lookup must be a JSON object",
    )
    assert not first.is_error
    assert second.is_error and second.text.startswith("error: no more tool calls this turn")
    assert toolbox.calls == [("lookup", {"a": 1})]
    assert recorded == [("lookup", "lookup {'a': 1}")]  # what ran, once


async def test_a_new_turn_begins_when_the_caller_speaks_again_after_the_agent():
    session = SessionTools(CountingToolbox(), 4, "s1", lambda call, result: None)
    first = session.turn
    session.on_user_utterance("u1")
    session.on_user_utterance("u2")  # the caller goes on: the same turn
    assert session.turn is first
    session.on_agent_words()
    session.on_user_utterance("u2")  # still the utterance the agent answered
    assert session.turn is first
    session.on_user_utterance("u3")
    assert session.turn is not first
    await session.close()


def test_openai_tool_call_pieces_are_joined_per_index():
    pieces = OpenAIToolCallPieces()

    def delta(index, call_id=None, name=None, arguments=None):
        function = SimpleNamespace(name=name, arguments=arguments)
        return SimpleNamespace(index=index, id=call_id, function=function)

    pieces.add([delta(0, "c0", "lookup", ""), delta(1, "c1", "book", '{"b"')])
    pieces.add([delta(0, arguments='{"a": 1}'), delta(1, arguments=": 2}")])
    assert pieces.calls() == [
        ToolCall("c0", "lookup", '{"a": 1}'),
        ToolCall("c1", "book", '{"b": 2}'),
    ]


def test_anthropic_tool_use_blocks_become_calls_at_their_stop():
    blocks = AnthropicToolUseBlocks()
    blocks.start(0, SimpleNamespace(type="text"))
    blocks.start(1, SimpleNamespace(type="tool_use", id="t1", name="lookup"))
    blocks.delta(1, SimpleNamespace(type="input_json_delta", partial_json='{"a":'))
    blocks.delta(1, SimpleNamespace(type="input_json_delta", partial_json=" 1}"))
    assert blocks.stop(0) is None
    assert blocks.stop(1) == ToolCall("t1", "lookup", '{"a": 1}')


def test_earlier_rounds_are_replayed_in_each_wire_format():
    exchange = ToolExchange(
        "",  # the model said nothing before its calls
        (ToolCall("c1", "lookup", '{"a": 1}'), ToolCall("c2", "book", "not json")),
        (ToolResult("found"), ToolResult("error: book did not answer within 2 s", True)),
    )
    assert openai_rounds([exchange]) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"a": 1}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "book", "arguments": "not json"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "tool", "tool_call_id": "c2", "content": "error: book did not answer within 2 s"},
    ]
    assert anthropic_rounds([exchange]) == [
        {
            "role": "assistant",
            "content": [  # no empty text block: the API refuses one
                {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"a": 1}},
                {"type": "tool_use", "id": "c2", "name": "book", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "found", "is_error": False},
                {
                    "type": "tool_result",
                    "tool_use_id": "c2",
                    "content": "error: book did not answer within 2 s",
                    "is_error": True,
                },
            ],
        },
    ]


async def test_each_run_shows_its_activity_and_a_partials_result_reused_for_the_final():
    shown: list = []
    tools = TurnTools(
        CountingToolbox(delay_s=0.05), 4, "s1", lambda call, result: None, shown.append
    )
    await tools.run_all([ToolCall("1", "lookup", '{"a": 1}')], final=False)
    await tools.run_all([ToolCall("2", "lookup", '{"a":1}')], final=False)  # another partial
    await tools.run_all([ToolCall("3", "lookup", '{"a": 1}')], final=True)
    await tools.run_all([ToolCall("4", "lookup", '{"a": 1}')], final=True)  # shown once
    await asyncio.sleep(0)  # the reused FINISHED comes from the run's done callback
    started, finished, reuse_started, reuse_finished = shown
    assert [a.phase for a in shown] == [Activity.STARTED, Activity.FINISHED] * 2
    assert started.call_id == finished.call_id != reuse_started.call_id == reuse_finished.call_id
    assert (finished.name, finished.source, finished.read_only) == ("lookup", "test", True)
    assert not finished.reused and reuse_finished.reused
    assert reuse_finished.elapsed_s == finished.elapsed_s >= 0.05  # the run's time
    assert not finished.is_error and not reuse_finished.is_error


async def test_a_run_the_session_end_stops_shows_finished_with_an_error():
    shown: list = []
    tools = TurnTools(CountingToolbox(delay_s=30), 4, "s1", lambda call, result: None, shown.append)
    assert await tools.run_all([ToolCall("1", "book", "{}")], final=False) is None  # held back
    assert shown == []
    asking = asyncio.create_task(tools.run_all([ToolCall("2", "book", "{}")], final=True))
    await asyncio.sleep(0.05)
    await tools.close()
    with contextlib.suppress(asyncio.CancelledError):
        await asking  # its run was cancelled under it
    started, finished = shown
    assert (started.phase, finished.phase) == (Activity.STARTED, Activity.FINISHED)
    assert finished.is_error and finished.call_id == started.call_id and not finished.read_only
