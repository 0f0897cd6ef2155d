"""The operator's tool settings: MCP servers and the allow-list, as flags or
environment, and what is refused at start."""

from __future__ import annotations

import pytest

from kame_common.config import ConfigError, load_settings
from services.oracle.config import OracleSettings
from services.oracle.tools.settings import (
    AllowEntry,
    McpServerEntry,
    allowance,
    parse_allowed,
    parse_servers,
    trusted_hint_servers,
)


def test_servers_are_commands_or_urls():
    entries = parse_servers(
        "files=python -m files_mcp --root '/srv/a b'; shop=https://mcp.example/mcp;"
    )
    assert entries == [
        McpServerEntry("files", "python -m files_mcp --root '/srv/a b'"),
        McpServerEntry("shop", "https://mcp.example/mcp"),
    ]
    assert entries[0].command() == ["python", "-m", "files_mcp", "--root", "/srv/a b"]
    assert [e.is_url for e in entries] == [False, True]


@pytest.mark.parametrize(
    "value",
    ["files", "=cmd", "a b=cmd", "x=", "x=a;x=b", "x=python 'unclosed", "client=python -m x"],
)
def test_bad_server_entries_are_refused(value):
    with pytest.raises(ValueError):
        parse_servers(value)


def test_the_allow_list_names_tools_marks_read_only_ones_and_sets_timeouts():
    entries = parse_allowed("shop.price:readonly:2.5, shop.buy, files.*:readonly")
    assert entries == [
        AllowEntry("shop", "price", read_only=True, timeout_s=2.5),
        AllowEntry("shop", "buy"),
        AllowEntry("files", "*", read_only=True),
    ]
    assert allowance(entries, "shop", "buy") == AllowEntry("shop", "buy")
    assert allowance(entries, "shop", "refund") is None  # not listed: never offered
    assert allowance(entries, "files", "read") == AllowEntry("files", "*", read_only=True)
    assert allowance(entries, "other", "buy") is None


@pytest.mark.parametrize("value", ["price", "shop.", "shop.price:fast", "shop.price:0"])
def test_bad_allow_list_entries_are_refused(value):
    with pytest.raises(ValueError):
        parse_allowed(value)


def test_settings_come_from_the_environment_and_bad_ones_stop_the_start():
    env = {
        "KAME_ORACLE_MCP_SERVERS": "shop=https://mcp.example/mcp",
        "KAME_ORACLE_TOOLS_ALLOWED": "shop.price:readonly",
        "KAME_ORACLE_TOOL_BUDGET": "2",
    }
    settings = load_settings(OracleSettings, [], env=env)
    assert (settings.mcp_servers, settings.tools_allowed, settings.tool_budget) == (
        "shop=https://mcp.example/mcp",
        "shop.price:readonly",
        2,
    )
    with pytest.raises(ConfigError, match="tools_allowed"):
        load_settings(OracleSettings, ["--tools-allowed", "price"], env={})
    with pytest.raises(ConfigError, match="mcp_servers"):
        load_settings(OracleSettings, ["--mcp-servers", "no-equals-sign"], env={})
    with pytest.raises(ConfigError, match="trust_read_only_hints: 'files' is none of"):
        load_settings(OracleSettings, ["--trust-read-only-hints", "files"], env=env)
    trusting = load_settings(OracleSettings, ["--trust-read-only-hints", "*"], env=env)
    servers = parse_servers(trusting.mcp_servers)
    assert trusted_hint_servers(trusting.trust_read_only_hints, servers) == {"shop"}
