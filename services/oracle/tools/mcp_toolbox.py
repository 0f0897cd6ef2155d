"""Tools from the operator's MCP servers, through the `mcp` SDK's Client.

One toolbox per oracle process, shared by its sessions: each server is
connected once at start (a stdio server is one subprocess for the service),
its tools are listed and those on the operator's allow-list are kept (read-only
when the allow-list says `:readonly`, or the server hints so and the operator
trusts its hints: settings.py). A
server that cannot be reached at start is logged and its tools are not
offered; the oracle serves without them. A connection lost later (a stdio
server that exited, an HTTP server gone) is opened again when one of its
tools is next called (at most once every RECONNECT_S). The reconnection
runs in a task of its own, one per server at a time, bounded by
mcp_connect_timeout_s: a call waits for it within its own timeout, and a
call that times out leaves it running for the next one. A reconnection that
fails or runs out of time cancels the connection's task, and with it the
server's process: a server whose restart hangs holds one process, not one
per call.

Each connection lives in a task of its own: the SDK's client enters anyio
task groups that must be left by the task that entered them, and sessions
call tools from their own tasks.

A call never raises: a timeout, a lost server or an MCP error becomes an
error result in words the model can turn into an apology ("I couldn't reach
the booking system"). Its details go to the log, not to the model: a server's
free text may name internal hosts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mcp
from mcp_types import CONNECTION_CLOSED, CallToolResult, TextContent, Tool

from kame_common.aio import cancel_and_wait
from services.oracle.tools.settings import AllowEntry, McpServerEntry, allowance
from services.oracle.tools.spec import MAX_RESULT_CHARS, ToolResult, ToolSpec

log = logging.getLogger(__name__)

# Pages of tools/list read from one server at most (a paginator that never ends).
_MAX_PAGES = 20
# How long the connections get to close at shutdown.
_CLOSE_S = 5.0
# Least time between two attempts to connect one server.
RECONNECT_S = 1.0


def result_text(result: CallToolResult) -> str:
    """The words of a tool result: its text blocks, else its structured content as JSON."""
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if texts:
        text = "\n".join(texts)
    elif result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    else:
        text = "(no output)"
    return text[:MAX_RESULT_CHARS]


def _is_read_only(tool: Tool, allowed: AllowEntry, hints_trusted: bool) -> bool:
    """The operator vouches for it (`:readonly`), or trusts its server's hint."""
    hinted = tool.annotations is not None and tool.annotations.read_only_hint is True
    return allowed.read_only or (hints_trusted and hinted)


@dataclass
class _Connection:
    """One server's connection, held open by `holder` while `client` is set."""

    entry: McpServerEntry
    client: mcp.Client | None = None
    holder: asyncio.Task[None] | None = None
    last_try: float = -math.inf
    reconnecting: asyncio.Task[None] | None = None  # one at a time, outside any call


class McpToolbox:
    """The allowed tools of the operator's MCP servers; `call` runs one."""

    def __init__(
        self,
        servers: Sequence[McpServerEntry],
        allowed: list[AllowEntry],
        timeout_s: float,
        connect_timeout_s: float,
        trusted_hints: frozenset[str] = frozenset(),
    ) -> None:
        self._connections = {entry.name: _Connection(entry) for entry in servers}
        self._trusted_hints = trusted_hints  # servers whose readOnlyHint counts
        self._allowed = allowed
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._specs: dict[str, ToolSpec] = {}
        self._stop = asyncio.Event()

    @property
    def specs(self) -> list[ToolSpec]:
        return list(self._specs.values())

    def spec(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    async def start(self) -> None:
        """Connect every server at once and keep its allowed tools."""
        for entry in self._allowed:
            if entry.tool == "*":
                log.warning(
                    "oracle: every tool of MCP server %s is allowed (tools_allowed %s.*), those "
                    "that change or delete things included",
                    entry.server,
                    entry.server,
                )
        listed = await asyncio.gather(*(self._open(c) for c in self._connections.values()))
        for connection, tools in zip(self._connections.values(), listed, strict=True):
            for tool in tools or []:
                self._add(connection.entry.name, tool)
        log.info(
            "oracle: tools %s",
            ", ".join(
                f"{s.server}.{s.name}{' (read-only)' if s.read_only else ''}"
                for s in self._specs.values()
            )
            or "none",
        )

    async def aclose(self) -> None:
        self._stop.set()
        await cancel_and_wait(
            [c.reconnecting for c in self._connections.values() if c.reconnecting is not None]
        )
        holders = [c.holder for c in self._connections.values() if c.holder is not None]
        if not holders:
            return
        _done, pending = await asyncio.wait(holders, timeout=_CLOSE_S)
        await cancel_and_wait(pending)

    async def _open(self, connection: _Connection) -> list[Tool] | None:
        """Connect one server: its tools, or None (logged) when it cannot be reached."""
        name = connection.entry.name
        connection.last_try = time.monotonic()
        ready: asyncio.Future[list[Tool]] = asyncio.get_running_loop().create_future()
        holder = asyncio.create_task(self._hold(connection, ready), name=f"mcp-{name}")
        connection.holder = holder
        try:
            return await asyncio.wait_for(asyncio.shield(ready), self._connect_timeout_s)
        except Exception as exc:  # unreachable, not MCP, timed out: go on without it
            log.error("oracle: MCP server %s unavailable: %s", name, _describe(exc))
            await cancel_and_wait(holder)
            return None
        except asyncio.CancelledError:  # the toolbox closes: the server's process goes too
            await cancel_and_wait(holder)
            raise

    async def _hold(self, connection: _Connection, ready: asyncio.Future[list[Tool]]) -> None:
        """Keep one server's connection open until the toolbox closes (or it is lost)."""
        entry = connection.entry
        target: str | mcp.StdioServerParameters
        if entry.is_url:
            target = entry.target
        else:
            command, *args = entry.command()
            target = mcp.StdioServerParameters(command=command, args=args)
        try:
            async with mcp.Client(target) as client:
                tools = await _list_tools(client)
                connection.client = client
                ready.set_result(tools)
                await self._stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.error("oracle: MCP server %s: connection lost: %s", entry.name, _describe(exc))
        finally:
            if connection.holder is asyncio.current_task():
                connection.client = None

    async def _client(self, connection: _Connection) -> mcp.Client | None:
        """The server's client, connecting again if the connection was lost (in a
        task of its own: the caller's timeout cancels only its wait for it)."""
        if connection.client is not None or self._stop.is_set():
            return connection.client
        due = time.monotonic() - connection.last_try >= RECONNECT_S
        if connection.reconnecting is None and due:
            log.info("oracle: connecting MCP server %s again", connection.entry.name)
            connection.reconnecting = asyncio.create_task(self._reconnect(connection))
        if connection.reconnecting is not None:
            # wait() neither cancels the task with its waiter nor raises what it raised.
            await asyncio.wait([connection.reconnecting])
        return connection.client

    async def _reconnect(self, connection: _Connection) -> None:
        try:
            await self._open(connection)
        finally:
            connection.reconnecting = None

    async def _drop(self, connection: _Connection) -> None:
        """Forget a connection found broken; the next call connects again."""
        holder, connection.holder, connection.client = connection.holder, None, None
        if holder is not None:
            await cancel_and_wait(holder)

    def _add(self, server: str, tool: Tool) -> None:
        allowed = allowance(self._allowed, server, tool.name)
        if allowed is None:
            return
        taken = self._specs.get(tool.name)
        if taken is not None:
            log.error(
                "oracle: tool %s of MCP server %s left out: %s offers one of that name",
                tool.name,
                server,
                taken.server,
            )
            return
        self._specs[tool.name] = ToolSpec(
            name=tool.name,
            description=tool.description or tool.title or tool.name,
            parameters=tool.input_schema,
            read_only=_is_read_only(tool, allowed, server in self._trusted_hints),
            timeout_s=allowed.timeout_s or self._timeout_s,
            server=server,
        )

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], call_id: str) -> ToolResult:
        """Run one tool; every failure is an error result (see the module doc). The
        call's id is the oracle's (ToolActivity's); the MCP request has its own."""
        connection = self._connections[spec.server]
        unavailable = ToolResult(f"error: {spec.name} is unavailable (its server is down)", True)
        try:
            async with asyncio.timeout(spec.timeout_s):
                client = await self._client(connection)
                if client is None:
                    return unavailable
                # The SDK's own limit is a backstop, later: ours names the timeout.
                result = await client.call_tool(
                    spec.name, arguments, read_timeout_seconds=spec.timeout_s + 1
                )
        except TimeoutError:
            log.warning("oracle: tool %s timed out after %g s", spec.name, spec.timeout_s)
            return ToolResult(
                f"error: {spec.name} did not answer within {spec.timeout_s:g} s", True
            )
        except Exception as exc:
            log.warning("oracle: tool %s of %s failed: %s", spec.name, spec.server, _describe(exc))
            # An error the server answered leaves the connection as it is; anything else
            # (the connection closed, the transport failed) means it is lost.
            if not isinstance(exc, mcp.MCPError) or exc.code == CONNECTION_CLOSED:
                await self._drop(connection)
                return unavailable
            return ToolResult(f"error: {spec.name} failed ({type(exc).__name__})", True)
        return ToolResult(result_text(result), result.is_error)


async def _list_tools(client: mcp.Client) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _describe(exc: BaseException) -> str:
    """An exception for the log; the leaves of an exception group (anyio raises them)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"
