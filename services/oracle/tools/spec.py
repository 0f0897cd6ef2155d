"""What the oracle knows of a tool, a call the model asked for, and its result.

Back-end neutral: wire.py turns these into OpenAI's and Anthropic's shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Longest tool output the model reads (the rest would only slow the answer).
MAX_RESULT_CHARS = 4000
# ToolSpec.server of the client's functions (an MCP server cannot take this name).
CLIENT_SOURCE = "client"


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: its name, what it does, the JSON Schema of its
    arguments, and how the oracle runs it."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema, `type: object` at the root
    read_only: bool  # may run on a partial transcript (speculatively)
    timeout_s: float
    server: str  # the MCP server it comes from, or CLIENT_SOURCE (for the log and spans)


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for, with its arguments as the model wrote them."""

    call_id: str
    name: str
    arguments_json: str

    def arguments(self) -> dict[str, Any] | None:
        """The arguments as a JSON object, or None if the model wrote something else."""
        try:
            value = json.loads(self.arguments_json or "{}")
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None


def canonical_arguments(arguments: dict[str, Any]) -> str:
    """One spelling of the same arguments (key order and spacing do not matter), so
    a call on the final transcript finds the same call made on a partial one."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class ToolResult:
    """What the model reads back: the tool's text, or an error in words it can
    turn into an apology. `elapsed_s` is the time the tool took."""

    text: str
    is_error: bool = False
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class ToolExchange:
    """One round of the tool loop: the text the model said before asking, the calls
    it asked for and their results, in the same order."""

    text: str
    calls: tuple[ToolCall, ...]
    results: tuple[ToolResult, ...]
