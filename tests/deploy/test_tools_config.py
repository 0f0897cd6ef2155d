"""The oracle's tools (#33) in compose and in the Helm chart: none by default; the MCP servers
and the allow-list the operator sets reach the oracle as KAME_ORACLE_MCP_SERVERS and
KAME_ORACLE_TOOLS_ALLOWED and load through the oracle's own settings (which parse and check
both, services/oracle/tools/settings.py). In the chart the oracle's NetworkPolicy lets it reach
an HTTP MCP server only through networkPolicy.oracleEgress, and the schema takes the settings
as the strings the oracle reads. (`kame up --mcp-server`: tests/cli/test_tools_flags.py.)"""

from __future__ import annotations

import helm_python as helm
import pytest

from services.oracle.tools.settings import AllowEntry, parse_allowed, parse_servers
from tests.deploy.conftest import CHART, compose_config, helm_render, plain_settings

SERVERS = "shop=http://shop-mcp.tools.svc:8000/mcp; files=python -m files_mcp --root /srv/docs"
ALLOWED = "shop.price:readonly:2, shop.book, files.*:readonly"
TOOL_VARS = ("KAME_ORACLE_MCP_SERVERS", "KAME_ORACLE_TOOLS_ALLOWED")
# An HTTP MCP server in the cluster's "tools" namespace, as an operator would allow it.
TO_SHOP = {
    "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tools"}}}],
    "ports": [{"port": 8000, "protocol": "TCP"}],
}


def assert_the_oracle_reads_the_tools(settings) -> None:
    assert (settings.mcp_servers, settings.tools_allowed) == (SERVERS, ALLOWED)
    servers = parse_servers(settings.mcp_servers)
    assert [(s.name, s.is_url) for s in servers] == [("shop", True), ("files", False)]
    assert parse_allowed(settings.tools_allowed) == [
        AllowEntry("shop", "price", read_only=True, timeout_s=2.0),
        AllowEntry("shop", "book"),
        AllowEntry("files", "*", read_only=True),
    ]


def test_compose_offers_no_tools_unless_the_shell_names_them(configs):
    oracle = configs["oracle"]
    default = compose_config()["services"]["oracle"]["environment"]
    assert {name: default[name] for name in TOOL_VARS} == dict.fromkeys(TOOL_VARS, "")
    assert oracle.load(default).mcp_servers == ""

    shell = dict(zip(TOOL_VARS, (SERVERS, ALLOWED), strict=True))
    environment = compose_config(env=shell)["services"]["oracle"]["environment"]
    assert_the_oracle_reads_the_tools(oracle.load({k: str(v) for k, v in environment.items()}))


def test_the_chart_sets_the_tools_and_the_egress_to_an_http_mcp_server(configs):
    default = plain_settings(helm_render().one("Deployment", "oracle"), "KAME_ORACLE_")
    assert not set(TOOL_VARS) & set(default)

    tools = {
        "mcp_servers": SERVERS,
        "tools_allowed": ALLOWED,
        "tool_timeout_s": 3,
        "tool_budget": 2,
    }
    rendered = helm_render(
        {"oracle": {"config": tools}, "networkPolicy": {"oracleEgress": [TO_SHOP]}}
    )
    settings = configs["oracle"].load(
        plain_settings(rendered.one("Deployment", "oracle"), "KAME_ORACLE_")
    )
    assert_the_oracle_reads_the_tools(settings)
    assert (settings.tool_timeout_s, settings.tool_budget) == (3.0, 2)
    egress = rendered.one("NetworkPolicy", "oracle")["spec"]["egress"]
    assert TO_SHOP in egress
    # Without that rule the oracle reaches no such server: DNS, Redis and the llm only.
    default_egress = helm_render().one("NetworkPolicy", "oracle")["spec"]["egress"]
    assert TO_SHOP not in default_egress and len(default_egress) == len(egress) - 1


@pytest.mark.parametrize(
    "config",
    [
        {"tools_allowed": ["shop.price"]},  # a list: the oracle reads one string
        {"mcp_servers": {"shop": "http://shop/mcp"}},
        {"tool_budget": 1.5},
        {"mcp_server": "shop=http://shop/mcp"},  # a misspelt key
    ],
)
def test_the_schema_refuses_tool_settings_the_oracle_would_not_read(config):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"oracle": {"config": config}})
