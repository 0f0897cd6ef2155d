"""Tools on the two LLM wire formats.

- OpenAI chat completions: `tools` of type function; the answer streams
  `delta.tool_calls` pieces (the first piece of a call carries its index, id
  and name, later pieces more of its JSON arguments); the next request
  replays the round as an assistant message with `tool_calls` and one `tool`
  message per result.
- Anthropic Messages: `tools` with an `input_schema`; the answer streams a
  `tool_use` content block (id and name at its start, its input as
  `input_json_delta` pieces, complete at its stop); the next request replays
  the round as an assistant turn with the `tool_use` blocks and a user turn
  with one `tool_result` block per result.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.oracle.tools.spec import ToolCall, ToolExchange, ToolSpec


def openai_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }
        for spec in specs
    ]


def openai_rounds(exchanges: Sequence[ToolExchange]) -> list[dict[str, Any]]:
    """The messages that replay earlier rounds of the tool loop, after the prompt's."""
    messages: list[dict[str, Any]] = []
    for exchange in exchanges:
        messages.append(
            {
                "role": "assistant",
                "content": exchange.text or None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments_json or "{}"},
                    }
                    for call in exchange.calls
                ],
            }
        )
        messages.extend(
            {"role": "tool", "tool_call_id": call.call_id, "content": result.text}
            for call, result in zip(exchange.calls, exchange.results, strict=True)
        )
    return messages


@dataclass
class _Piece:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIToolCallPieces:
    """Collects the streamed `delta.tool_calls` of one answer into whole calls."""

    def __init__(self) -> None:
        self._pieces: dict[int, _Piece] = {}

    def add(self, deltas: Iterable[Any]) -> None:
        for delta in deltas:
            piece = self._pieces.setdefault(delta.index, _Piece())
            piece.call_id = piece.call_id or (delta.id or "")
            function = delta.function
            if function is not None:
                # The name comes whole in the call's first piece (some servers repeat it).
                piece.name = piece.name or (function.name or "")
                piece.arguments.append(function.arguments or "")

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(piece.call_id or f"call_{index}", piece.name, "".join(piece.arguments))
            for index, piece in sorted(self._pieces.items())
            if piece.name
        ]


def anthropic_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}
        for spec in specs
    ]


def anthropic_rounds(exchanges: Sequence[ToolExchange]) -> list[dict[str, Any]]:
    """The turns that replay earlier rounds of the tool loop, after the prompt's user turn."""
    messages: list[dict[str, Any]] = []
    for exchange in exchanges:
        said: list[dict[str, Any]] = (
            [{"type": "text", "text": exchange.text}] if exchange.text.strip() else []
        )
        # A call whose input was not a JSON object is replayed with an empty one.
        uses: list[dict[str, Any]] = [
            {
                "type": "tool_use",
                "id": call.call_id,
                "name": call.name,
                "input": call.arguments() or {},
            }
            for call in exchange.calls
        ]
        messages.append({"role": "assistant", "content": said + uses})
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call.call_id,
                        "content": result.text,
                        "is_error": result.is_error,
                    }
                    for call, result in zip(exchange.calls, exchange.results, strict=True)
                ],
            }
        )
    return messages


class AnthropicToolUseBlocks:
    """Collects streamed `tool_use` content blocks into whole calls."""

    def __init__(self) -> None:
        self._open: dict[int, _Piece] = {}

    def start(self, index: int, block: Any) -> None:
        if block.type == "tool_use":
            self._open[index] = _Piece(block.id, block.name)

    def delta(self, index: int, delta: Any) -> None:
        if delta.type == "input_json_delta" and index in self._open:
            self._open[index].arguments.append(delta.partial_json)

    def stop(self, index: int) -> ToolCall | None:
        """The call whose block just ended, or None for another kind of block."""
        piece = self._open.pop(index, None)
        if piece is None:
            return None
        return ToolCall(piece.call_id, piece.name, "".join(piece.arguments) or "{}")
