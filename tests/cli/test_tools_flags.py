"""`kame up --mcp-server NAME=COMMAND_OR_URL --tools-allowed SERVER.TOOL...`: the
flags become the oracle's KAME_ORACLE_MCP_SERVERS / KAME_ORACLE_TOOLS_ALLOWED,
which the oracle's own settings accept; a server named without --tools-allowed
is allowed whole, one that --tools-allowed names only as listed; a bad entry
is refused in one line before anything starts; once up, kame up prints the
tools the oracle says it offers; it warns before starting when a server is
allowed whole, and refuses to go on when the oracle could not start one.
(The whole path, a spoken question answered from a tool:
tests/e2e/test_tools_stack.py.)"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

import pytest

from kame_cli.child import Child, StackError
from kame_cli.errors import USAGE, CliError
from kame_cli.stack import Stack
from kame_cli.stack_options import (
    Ports,
    StackOptions,
    add_arguments,
    options_from_args,
    ports_from_args,
)
from kame_common.config import load_settings
from services.oracle.config import OracleSettings
from services.oracle.tools.mcp_toolbox import McpToolbox
from services.oracle.tools.settings import AllowEntry, parse_allowed, parse_servers
from tests.cli.conftest import assert_fails_in_one_line, kame

STDIO = "vault=python -m vault_mcp --root /srv/vault"
HTTP = "shop=http://127.0.0.1:9/mcp"


def up_options(*argv: str, log_dir) -> StackOptions:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    return options_from_args(args, ports_from_args(args), args.frontend_engine, log_dir)


def oracle_env(options: StackOptions) -> dict[str, str]:
    return Stack(options).service_env("oracle")


def test_named_servers_are_allowed_whole_unless_tools_allowed_names_them(tmp_path):
    options = up_options(
        "--mcp-server",
        STDIO,
        "--mcp-server",
        HTTP,
        "--tools-allowed",
        "shop.price:readonly:2",
        "--tools-allowed",
        "shop.book",
        log_dir=tmp_path,
    )
    env = oracle_env(options)
    assert env["KAME_ORACLE_MCP_SERVERS"] == f"{STDIO}; {HTTP}"
    assert env["KAME_ORACLE_TOOLS_ALLOWED"] == "shop.price:readonly:2,shop.book,vault.*"

    # The oracle reads them as the servers and the allow-list meant.
    settings = load_settings(OracleSettings, env=env)
    servers = parse_servers(settings.mcp_servers)
    assert [(s.name, s.is_url) for s in servers] == [("vault", False), ("shop", True)]
    assert servers[0].command() == ["python", "-m", "vault_mcp", "--root", "/srv/vault"]
    assert parse_allowed(settings.tools_allowed) == [
        AllowEntry("shop", "price", read_only=True, timeout_s=2.0),
        AllowEntry("shop", "book"),
        AllowEntry("vault", "*"),
    ]


def test_without_mcp_servers_the_oracle_env_has_no_tool_settings(tmp_path):
    env = oracle_env(up_options(log_dir=tmp_path))
    assert not {"KAME_ORACLE_MCP_SERVERS", "KAME_ORACLE_TOOLS_ALLOWED"} & set(env)


def test_a_comma_separated_tools_allowed_narrows_as_repeated_flags_do(tmp_path):
    env = oracle_env(
        up_options(
            "--mcp-server",
            STDIO,
            "--tools-allowed",
            "vault.read:readonly, vault.list",
            log_dir=tmp_path,
        )
    )
    assert env["KAME_ORACLE_TOOLS_ALLOWED"] == "vault.read:readonly, vault.list"


@pytest.mark.parametrize(
    ("servers", "allowed", "says"),
    [
        ((STDIO,), ("shop.price",), "--tools-allowed names 'shop'"),
        ((), ("vault.read",), "--tools-allowed names 'vault'"),
        ((STDIO, "vault=http://x/mcp"), (), "'vault' is used twice"),
        (("no equals sign",), (), "must be NAME=COMMAND or NAME=URL"),
        ((STDIO,), ("vault",), "must be SERVER.TOOL or SERVER.*"),
        ((STDIO,), ("vault.read:soon",), "neither readonly nor a timeout"),
    ],
)
def test_bad_tool_flags_are_refused_when_the_options_are_made(servers, allowed, says, tmp_path):
    with pytest.raises(CliError, match=says) as refused:
        StackOptions(mcp_servers=servers, tools_allowed=allowed, log_dir=tmp_path)
    assert refused.value.exit_code == USAGE


def test_kame_up_refuses_a_tool_of_an_unnamed_server_in_one_line_before_starting():
    result = kame(
        "up", "--free-ports", "--mcp-server", STDIO, "--tools-allowed", "shop.price", timeout=60
    )
    line = assert_fails_in_one_line(result, USAGE, r"--tools-allowed names 'shop'")
    assert "starting the stack" not in result.stdout, line


def test_kame_up_help_names_the_tool_flags():
    result = kame("up", "--help", env={"COLUMNS": "1000"}, timeout=60)  # one line a flag
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "--mcp-server NAME=COMMAND_OR_URL" in text
    assert "--tools-allowed SERVER.TOOL[:readonly][:SECONDS]" in text
    assert "all its tools are allowed unless --tools-allowed names it" in text


def oracle_with_log(tmp_path, text: str | None, mcp_servers: tuple[str, ...] = ()) -> Stack:
    stack = Stack(StackOptions(ports=Ports.free(), log_dir=tmp_path, mcp_servers=mcp_servers))
    oracle = Child("oracle", ["true"], {}, lambda: True, "127.0.0.1:1")
    if text is not None:
        oracle.log_path = tmp_path / "oracle.log"
        oracle.log_path.write_text(text)
    stack.children.append(oracle)
    return stack


def test_the_tools_the_oracle_offers_are_a_row_of_what_kame_up_prints(tmp_path):
    logged = (
        "2026-12-03 04:00:00,000 INFO services.oracle.tools.mcp_toolbox "
        "oracle: tools vault.door_code (read-only), vault.book_table\n"
        "2026-12-03 04:00:01,000 INFO services.oracle.session oracle: warmed up ...\n"
    )
    rows = dict(oracle_with_log(tmp_path, logged).endpoints())
    assert rows["tools"] == "vault.door_code (read-only), vault.book_table"


def test_no_tools_row_without_mcp_servers(tmp_path):
    assert "tools" not in dict(oracle_with_log(tmp_path, "INFO oracle: serving\n").endpoints())
    assert "tools" not in dict(oracle_with_log(tmp_path, None).endpoints())


def test_kame_up_warns_before_starting_when_a_server_is_allowed_whole():
    """A server named without --tools-allowed offers every tool (write_query-style ones
    too): kame up says so first, on the console (the old one said nothing). The
    gateway's port is taken here, so the run stops right after, before starting."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        flags = ["--gateway-port", port]  # checked first: nothing else is looked at
        whole = kame("up", *flags, "--mcp-server", STDIO, "--mcp-server", HTTP, timeout=60)
        narrowed = kame(
            "up", *flags, "--mcp-server", STDIO, "--tools-allowed", "vault.read", timeout=60
        )
    assert f"port {port} (gateway) is in use" in whole.stderr, whole.stderr
    warnings = [line for line in whole.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 2, whole.stderr
    assert "every tool of MCP server vault is offered to the LLM" in warnings[0]
    assert "--tools-allowed shop.TOOL" in warnings[1]
    assert "WARNING" not in narrowed.stderr, narrowed.stderr


async def test_kame_up_refuses_to_start_when_the_oracle_could_not_start_a_server(tmp_path, caplog):
    """The old kame up printed 'tools none' and 'stack is up', the reason only in
    oracle.log. The oracle's own toolbox writes the line here, from a server whose
    command exits at once."""
    server = f"vault={sys.executable} -c 'raise SystemExit(3)'"
    toolbox = McpToolbox(parse_servers(server), parse_allowed("vault.*"), 5.0, 10.0)
    with caplog.at_level(logging.INFO, logger="services.oracle.tools.mcp_toolbox"):
        await toolbox.start()
        await toolbox.aclose()
    stack = oracle_with_log(tmp_path, caplog.text, mcp_servers=(server,))
    assert stack.offered_tools() == "none"
    with pytest.raises(StackError, match="oracle: MCP server vault did not start: ") as refused:
        stack.check_tools()
    assert "fix its --mcp-server vault=... or leave it out" in str(refused.value)
    started = oracle_with_log(tmp_path, "INFO oracle: tools vault.read\n", mcp_servers=(server,))
    started.check_tools()  # a server that started: nothing to say
