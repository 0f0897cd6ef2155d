"""The tools one session offers: the operator's (MCP servers, shared by the
oracle's sessions) and the client's own functions (client_functions.py).

A tool's name is unique across both: the session's config is refused when a
client function takes the name of an operator's tool (`check_names`), so a
name alone says where a call goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.oracle.tools.spec import CLIENT_SOURCE, ToolResult, ToolSpec
from services.oracle.tools.turn import Toolbox


def check_names(client: Sequence[ToolSpec], operator: Toolbox | None) -> None:
    """ValueError naming the first client function named as an operator's tool."""
    if operator is None:
        return
    for spec in client:
        if operator.spec(spec.name) is not None:
            raise ValueError(
                f"client function {spec.name!r} has the name of one of the oracle's own tools: "
                "rename it"
            )


class ToolSources:
    """The operator's toolbox and the client's functions, as one Toolbox."""

    def __init__(self, operator: Toolbox | None, client: Toolbox | None) -> None:
        self._operator = operator
        self._client = client

    @property
    def specs(self) -> list[ToolSpec]:
        return [
            *(self._operator.specs if self._operator else []),
            *(self._client.specs if self._client else []),
        ]

    def spec(self, name: str) -> ToolSpec | None:
        for source in (self._operator, self._client):
            found = source.spec(name) if source is not None else None
            if found is not None:
                return found
        return None

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], call_id: str) -> ToolResult:
        # An MCP server cannot be named CLIENT_SOURCE (settings.parse_servers).
        source = self._client if spec.server == CLIENT_SOURCE else self._operator
        assert source is not None, f"no source offers {spec.name}"
        return await source.call(spec, arguments, call_id)
