"""An MCP server written for the oracle's tool tests with the `mcp` SDK.

Run as a script it serves stdio, the way the oracle starts an operator's
stdio server: `python mcp_tool_server.py SECRET CALLS_FILE [STARTS_FILE]`
(STARTS_FILE: each start's process id, and a way to make starts hang:
`note_start`). `build()` makes
the same server for streamable HTTP inside the test's process (without the
tool that ends the server's process). SECRET is a
value no model could guess (the test makes it up); every call is appended to
CALLS_FILE as a JSON line {"tool", "arguments", "at": wall-clock seconds}, so
a test can count calls and tell when they ran.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
from mcp.server import MCPServer
from mcp_types import ToolAnnotations


def recorded_calls(calls_file: Path) -> list[dict]:
    if not calls_file.exists():
        return []
    return [json.loads(line) for line in calls_file.read_text().splitlines() if line]


def build(secret: str, calls_file: Path, crashable: bool = False) -> MCPServer:
    server = MCPServer("kame-test-tools")

    def record(tool: str, **arguments: str) -> None:
        with calls_file.open("a") as calls:
            calls.write(json.dumps({"tool": tool, "arguments": arguments, "at": time.time()}))
            calls.write("\n")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def door_code(office: str) -> str:
        """The door code of one of our offices."""
        record("door_code", office=office)
        return f"The door code of the {office} office is {secret}."

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def book_table(city: str) -> str:
        """Book a table for the caller in a restaurant of a city."""
        record("book_table", city=city)
        return f"Booked a table in {city}, reference {secret}."

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def next_train(city: str) -> str:
        """When the next train to a city leaves. (It takes 300 ms to find out.)"""
        record("next_train", city=city)
        await anyio.sleep(0.3)
        return f"The next train to {city} leaves from platform {secret}."

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def order_status(order: str) -> str:
        """Where the caller's order is. (This one hangs, as a broken system would.)"""
        record("order_status", order=order)
        await anyio.sleep(3600)
        return "shipped"

    if crashable:

        @server.tool()
        def crash_server() -> str:
            """End this server's process at once, as a crashing server would."""
            record("crash_server")
            os._exit(1)

    return server


def note_start(starts_file: Path) -> None:
    """Append this process's id to STARTS_FILE; then, if STARTS_FILE.hang exists,
    hang as a server that never answers (until its stdin closes, as the SDK's
    client closes it before it kills)."""
    with starts_file.open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    if starts_file.with_suffix(".hang").exists():
        sys.stdin.read()
        sys.exit(0)


if __name__ == "__main__":
    if len(sys.argv) > 3:
        note_start(Path(sys.argv[3]))
    build(sys.argv[1], Path(sys.argv[2]), crashable=True).run()
