"""The operator's tool settings, parsed: which MCP servers, which of their tools.

- `mcp_servers`: entries `NAME=COMMAND` (a stdio server, the command split as
  a shell would) or `NAME=URL` (streamable HTTP), separated by ';' (a command
  line may hold commas).
- `tools_allowed`: the allow-list, comma-separated `SERVER.TOOL` entries
  (`SERVER.*`: every tool of that server), each optionally followed by
  `:readonly` (the operator vouches that it changes nothing, whatever the
  server's annotations say) and `:SECONDS` (its timeout). A tool not on the
  list is never offered to the model; an empty list offers none.
- `trust_read_only_hints`: comma-separated servers (`*`: all) whose
  `readOnlyHint` annotations count as the operator's `:readonly`. A server
  says what it likes of its tools: its hint alone does not let a tool run
  on partial transcripts, where a side effect would happen for words the
  caller has not finished (or may take back).

A server cannot be named `client`: that is the source of the caller's own
functions (client_functions.py) in the client's ToolActivity events.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from services.oracle.tools.spec import CLIENT_SOURCE

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
READ_ONLY_OPTION = "readonly"


@dataclass(frozen=True)
class McpServerEntry:
    name: str
    target: str  # a URL, or a command line

    @property
    def is_url(self) -> bool:
        return self.target.startswith(("http://", "https://"))

    def command(self) -> list[str]:
        """The command line of a stdio server, split as a shell would."""
        return shlex.split(self.target)


@dataclass(frozen=True)
class AllowEntry:
    server: str
    tool: str  # "*": every tool of the server
    read_only: bool = False
    timeout_s: float | None = None  # None: the service's tool_timeout_s


def parse_servers(value: str) -> list[McpServerEntry]:
    """ValueError names the first bad entry."""
    entries: list[McpServerEntry] = []
    for raw in value.split(";"):
        if not raw.strip():
            continue
        name, sep, target = raw.strip().partition("=")
        name, target = name.strip(), target.strip()
        if not sep or not _NAME.fullmatch(name) or not target:
            raise ValueError(f"{raw.strip()!r} must be NAME=COMMAND or NAME=URL")
        if name == CLIENT_SOURCE:
            raise ValueError(f"server name {name!r} is reserved for the caller's functions")
        if any(entry.name == name for entry in entries):
            raise ValueError(f"server name {name!r} is used twice")
        entry = McpServerEntry(name, target)
        if not entry.is_url:
            try:
                if not entry.command():
                    raise ValueError("no command")
            except ValueError as exc:
                raise ValueError(f"{name}: the command cannot be split ({exc})") from None
        entries.append(entry)
    return entries


def parse_allowed(value: str) -> list[AllowEntry]:
    """ValueError names the first bad entry."""
    entries: list[AllowEntry] = []
    for raw in value.split(","):
        if not raw.strip():
            continue
        name, *options = (part.strip() for part in raw.strip().split(":"))
        server, dot, tool = name.partition(".")
        if not dot or not _NAME.fullmatch(server) or not (tool == "*" or _NAME.fullmatch(tool)):
            raise ValueError(f"{raw.strip()!r} must be SERVER.TOOL or SERVER.*")
        read_only, timeout_s = False, None
        for option in options:
            if option == READ_ONLY_OPTION:
                read_only = True
                continue
            try:
                timeout_s = float(option)
            except ValueError:
                raise ValueError(
                    f"{raw.strip()!r}: option {option!r} is neither {READ_ONLY_OPTION} "
                    "nor a timeout in seconds"
                ) from None
            if not timeout_s > 0:
                raise ValueError(f"{raw.strip()!r}: the timeout must be above 0")
        entries.append(AllowEntry(server, tool, read_only, timeout_s))
    return entries


def trusted_hint_servers(value: str, servers: list[McpServerEntry]) -> frozenset[str]:
    """The servers named in `trust_read_only_hints` (`*`: all of `servers`); ValueError
    for a name none of them has."""
    names = {entry.name for entry in servers}
    trusted: set[str] = set()
    for raw in value.split(","):
        name = raw.strip()
        if name == "*":
            trusted |= names
        elif name and name not in names:
            raise ValueError(f"{name!r} is none of mcp_servers' names")
        elif name:
            trusted.add(name)
    return frozenset(trusted)


def allowance(entries: list[AllowEntry], server: str, tool: str) -> AllowEntry | None:
    """The allow-list entry for one tool: its own entry, else its server's `*`, else None."""
    for wanted in (tool, "*"):
        for entry in entries:
            if entry.server == server and entry.tool == wanted:
                return entry
    return None
